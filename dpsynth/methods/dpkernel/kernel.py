"""DP-Kernel's kernel terms: the gradient of the private batch's kernel mean embedding at the
generated points (the only read of private data) and the generated points' own MMD² term."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch


def raw_embedding_gradient(
    batch_x: torch.Tensor,
    batch_y: torch.Tensor | None,
    gen_points: torch.Tensor,
    gen_labels: torch.Tensor | None,
    bandwidths: Sequence[float],
    normalizer: float,
    view: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """∇_w f_S(w_j) at the generated points: the ONLY code that reads the private batch.

    f_S(w, y) = (1/B) Σ_{i∈S} [y_i = y] Σ_ℓ exp(−‖x_i − w‖²/(2ℓ²)) with B = `normalizer`, the
    public expected batch size (never the realised size). `batch_x` [b, ...] is flattened to
    vectors; `batch_y` [b] and `gen_labels` [M] are None for unconditional use. b may be 0.
    `view`: a public per-record map of the flattened records (the kernel's view, basis.py),
    under which `gen_points` are already given; None: the kernel sees the records as they are.
    Returns float64 [M, d], not yet private: it must go through
    `dpsynth.privacy.mechanisms.functional.privatize_embedding_gradient` before anything else sees
    it.
    """
    w = gen_points.detach().to(torch.float64)
    x = batch_x.flatten(1).to(device=w.device, dtype=torch.float64)
    if view is not None:
        x = view(x)
    sq = (x.pow(2).sum(1)[:, None] + w.pow(2).sum(1)[None, :] - 2.0 * x @ w.T).clamp_min(0.0)
    widths = torch.tensor(list(bandwidths), dtype=torch.float64, device=w.device)
    # ∇_w exp(−‖x − w‖²/(2ℓ²)) = exp(·)·(x − w)/ℓ²
    weight = (
        torch.exp(-sq[None] / (2.0 * widths[:, None, None] ** 2))
        .mul(widths[:, None, None] ** -2)
        .sum(0)
    )  # [b, M]
    if batch_y is not None and gen_labels is not None:
        same = batch_y.to(w.device)[:, None] == gen_labels.to(w.device)[None, :]
        weight = weight * same.to(torch.float64)
    return (weight.T @ x - weight.sum(0)[:, None] * w) / float(normalizer)


def generated_kernel_mean(
    points: torch.Tensor, labels: torch.Tensor | None, bandwidths: Sequence[float]
) -> torch.Tensor:
    """(1/M²) Σ_{j,l} k*(w_j, w_l): the MMD² term of the generated points alone (public)."""
    sq = (points.pow(2).sum(1)[:, None] + points.pow(2).sum(1)[None, :]) - 2.0 * points @ points.T
    sq = sq.clamp_min(0.0)
    kernel = sum(torch.exp(-sq / (2.0 * float(bw) ** 2)) for bw in bandwidths)
    if labels is not None:
        kernel = kernel * (labels[:, None] == labels[None, :]).to(points.dtype)
    return kernel.mean()
