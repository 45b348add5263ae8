"""Sliced score matching (SSM) for one record, and PGE's randomized response on projections.

The per-record loss is the noise-conditional form of PGE's Eq. 8 (spec section 2.5):
    ℓ = σ² [ rᵀ ∇ₓ s(x̃) r + ½ (vᵀ s(x̃))² ],   x̃ = x + σ ε,   s = net(x̃, σ, y) / σ
averaged over K projections. Every random draw (σ, ε, v, r) is made by the caller from a
seeded generator and passed in, so the loss is a deterministic function of one record, which
is what per-record gradients under `vmap` need.

The randomized response (RR) swaps each projection vector for a cosine-nearest batch neighbour.
The vectors are data-independent noise, so the RR privatizes nothing (spec section 4): it is a
variance knob and earns no privacy credit; the privacy of training comes from DP-SGD alone.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn
from torch.func import functional_call, jvp

ScoreFn = Callable[[torch.Tensor], torch.Tensor]


def divergence_term(
    net_fn: ScoreFn, x: torch.Tensor, r: torch.Tensor, mode: str = "jvp", h: float = 1e-3
) -> tuple[torch.Tensor, torch.Tensor]:
    """(net_fn(x), rᵀ J r per row) with J the Jacobian of net_fn at x, rows along dim 0.

    `mode` "jvp" uses forward-mode AD (one pass gives both); "fd" the central finite
    difference [rᵀ f(x+hr) − rᵀ f(x−hr)] / 2h. net_fn must treat rows independently.
    """
    dims = tuple(range(1, x.dim()))
    if mode == "jvp":
        out, jr = jvp(net_fn, (x,), (r,))
        return out, (r * jr).sum(dim=dims)
    if mode == "fd":
        out = net_fn(x)
        plus = (r * net_fn(x + h * r)).sum(dim=dims)
        minus = (r * net_fn(x - h * r)).sum(dim=dims)
        return out, (plus - minus) / (2.0 * h)
    raise ValueError(f"unknown divergence mode {mode!r}")


def make_record_loss(
    model: nn.Module, variant: str = "plain", div_mode: str = "jvp"
) -> Callable[..., torch.Tensor]:
    """The SSM loss of ONE record as `loss(params, buffers, x, y, sigma, noise, v, r, z)`.

    Shapes (no batch dim): x [C,H,W]; y [] int64 (the label, or the "no label" token);
    sigma [K]; noise, v, r [K,C,H,W]; z [K, c_z, h, w] residual-module input (ignored when the
    model has no residual module). `variant` "plain" is Eq. 8 (½(vᵀs)²), "vr" the
    variance-reduced SSM (½‖s‖²), which has the same minimiser, and "stein" the same
    noise-conditional objective as "vr" estimated without a projection: Stein's identity
    E[εᵀ f(x + σε)] = σ E[tr J_f] turns σ²·tr J_s into σ·εᵀs, so
    σ²[tr J_s + ½‖s‖²] and ½‖σs + ε‖² − ½‖ε‖² have the same expectation and the same expected
    gradient (the denoising form of Vincent 2011). It needs one forward pass and no
    Jacobian-vector product; v and r are ignored.
    """
    if variant not in ("plain", "vr", "stein"):
        raise ValueError(f"unknown SSM variant {variant!r}")
    use_z = getattr(model, "residual_channels", 0) > 0

    def loss(
        params: dict[str, torch.Tensor],
        buffers: dict[str, torch.Tensor],
        x: torch.Tensor,
        y: torch.Tensor,
        sigma: torch.Tensor,
        noise: torch.Tensor,
        v: torch.Tensor,
        r: torch.Tensor,
        z: torch.Tensor,
    ) -> torch.Tensor:
        k = sigma.shape[0]
        x_tilde = x.unsqueeze(0) + sigma[:, None, None, None] * noise
        labels = y.reshape(1).expand(k)
        z_in = z if use_z else None

        def net_fn(inp: torch.Tensor) -> torch.Tensor:
            return functional_call(model, (params, buffers), (inp, sigma, labels, z_in))

        if variant == "stein":
            # With out = σs: ½‖out + ε‖² = σ²·½‖s‖² + σ·εᵀs + ½‖ε‖² (a constant in θ).
            return (0.5 * (net_fn(x_tilde) + noise).flatten(1).pow(2).sum(dim=1)).mean()
        out, div = divergence_term(net_fn, x_tilde, r, div_mode)
        # With s = out/σ: σ²·[rᵀ J_s r] = σ·rᵀ J_out r and σ²·½(vᵀs)² = ½(vᵀout)².
        if variant == "plain":
            square = 0.5 * (v * out).flatten(1).sum(dim=1) ** 2
        else:
            square = 0.5 * out.flatten(1).pow(2).sum(dim=1)
        return (sigma * div + square).mean()

    return loss


def rr_keep_probability(epsilon: float, k: int) -> float:
    """PGE's k-ary RR keep probability e^ε / (e^ε + k − 1) (computed stably)."""
    if k < 2:
        return 1.0
    return 1.0 / (1.0 + (k - 1) * math.exp(-epsilon))


def randomized_response(
    v: torch.Tensor, k: int, epsilon: float, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """PGE's RR on projection vectors (Alg. 1, R(v)): returns (r, kept).

    v [b, K, ...]: for each of the K projection slots independently, every vᵢ is kept with
    probability e^ε/(e^ε+k'−1), else replaced by one of the other k'−1 batch vectors most
    cosine-similar to it, uniformly; k' = min(k, b). With b < 2 nothing is swapped. This gives
    NO privacy (the vectors are data-independent noise); it only adds variance.
    """
    b = v.shape[0]
    kept = torch.ones(v.shape[:2], dtype=torch.bool, device=v.device)
    k_eff = min(k, b)
    if k_eff < 2:
        return v.clone(), kept
    flat = v.flatten(2).transpose(0, 1)  # [K, b, d]
    unit = flat / flat.norm(dim=2, keepdim=True).clamp_min(1e-12)
    cosine = unit @ unit.transpose(1, 2)  # [K, b, b]
    cosine.diagonal(dim1=1, dim2=2).fill_(-math.inf)  # self is always in v⁻; pick the others
    others = cosine.topk(k_eff - 1, dim=2).indices  # [K, b, k'−1]
    keep_p = rr_keep_probability(epsilon, k_eff)
    slots = v.shape[1]
    # Drawn on the generator's own device, then moved to v's: the two need not be the same.
    u = torch.rand(slots, b, generator=generator, device=generator.device).to(v.device)
    pick = torch.randint(0, k_eff - 1, (slots, b), generator=generator, device=generator.device).to(
        v.device
    )
    keep = u < keep_p
    chosen = others.gather(2, pick.unsqueeze(2)).squeeze(2)  # [K, b]
    source = torch.where(keep, torch.arange(b, device=v.device).expand(slots, b), chosen)
    r_flat = flat.gather(1, source.unsqueeze(2).expand(-1, -1, flat.shape[2]))
    r = r_flat.transpose(0, 1).reshape(v.shape)
    return r, keep.transpose(0, 1)
