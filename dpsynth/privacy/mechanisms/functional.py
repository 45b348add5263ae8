"""The functional Gaussian mechanism of DP-Kernel, released as a gradient field.

DP-Kernel (Jiang, Sun & Yu, NeurIPS 2023) privatises the kernel mean embedding of a Poisson
batch, f_S = (1/B) Σ_{i∈S} k*((x_i, y_i), ·), by adding a sample path of a Gaussian process
GP(0, k*) scaled by σΔ. The generator needs the *gradient* of that noisy function at its M
generated points, so each step releases

    v_j = ∇_w f_S(w_j) + σΔ·η_j,   (η_1, …, η_M) ~ the derivative field of one GP(0, k*) path,

which is post-processing of the noisy function (spec dpkernel §3.6). The public code of the
paper adds the noise to function values and detaches it, so the generator follows the
noise-free gradient; that release has no DP guarantee and is not implemented here.

Kernel: k*((w, y), (w', y')) = [y = y'] · Σ_ℓ exp(−‖w − w'‖² / (2ℓ²)) (one-hot label kernel
times a sum of unit Gaussian kernels; without labels the first factor is 1). Its derivative
covariance is

    Cov(η_j, η_l) = c_jl Σ_ℓ k_ℓ(w_j, w_l) [I_d/ℓ² − δ_jl δ_jlᵀ/ℓ⁴],   δ_jl = w_j − w_l.

Sensitivity: adding or removing one record moves the unnormalised sum Σ_i k*((x_i, y_i), ·) by
φ*(x, y), whose RKHS norm is √k*((x, y), (x, y)) = √n_L. The paper's constant √(2 n_L) (its
replace-one bound) is the default and is √2 more conservative under the add/remove adjacency
of the accountant. For any h in the RKHS, the released gradient vector v(h) satisfies
v(h)ᵀ C⁻¹ v(h) ≤ ‖h‖², so each step is a (non-isotropic) Gaussian mechanism with multiplier σ,
and a Poisson-subsampled step is exactly the `poisson_gaussian` event with that σ.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from dpsynth.errors import MechanismFailure, UsageError
from dpsynth.privacy.mechanisms.distributed import all_reduce_sum, noisy_partial

SENSITIVITY_CHOICES = ("paper", "add_remove")

# Jitter is added noise, so raising it is always privacy-safe; it only costs utility. The cap
# keeps a degenerate covariance from silently turning the mechanism into noise-only output.
_MAX_RELATIVE_JITTER = 1e-2


def functional_sensitivity(num_bandwidths: int, rule: str = "paper") -> float:
    """RKHS-norm sensitivity of the unnormalised embedding sum Σ_i k*((x_i, y_i), ·).

    `rule="paper"`: √(2 n_L), the paper's constant (conservative under add/remove);
    `rule="add_remove"`: √n_L, the exact add/remove bound for unit-diagonal kernels with
    one-hot labels. Divide by the public normaliser B for the sensitivity of f_S.
    """
    if num_bandwidths < 1:
        raise UsageError("at least one kernel bandwidth is needed")
    if rule not in SENSITIVITY_CHOICES:
        raise UsageError(f"sensitivity must be one of {', '.join(SENSITIVITY_CHOICES)}")
    factor = 2.0 if rule == "paper" else 1.0
    return math.sqrt(factor * num_bandwidths)


def _label_kernel(labels: torch.Tensor | None, count: int, device: torch.device) -> torch.Tensor:
    """c_jl = [y_j = y_l] for one-hot labels (all ones without labels), float64 [M, M]."""
    if labels is None:
        return torch.ones(count, count, dtype=torch.float64, device=device)
    return (labels[:, None] == labels[None, :]).to(torch.float64)


def _rbf_stack(points: torch.Tensor, bandwidths: Sequence[float]) -> torch.Tensor:
    """k_ℓ(w_j, w_l) for every bandwidth, float64 [n_L, M, M]."""
    diff = points[:, None, :] - points[None, :, :]
    sq = diff.pow(2).sum(-1)
    widths = torch.tensor(list(bandwidths), dtype=torch.float64, device=points.device)
    return torch.exp(-sq[None] / (2.0 * widths[:, None, None] ** 2))


def derivative_kernel_covariance(
    points: torch.Tensor, labels: torch.Tensor | None, bandwidths: Sequence[float]
) -> torch.Tensor:
    """The dense covariance C of the derivative GP at `points` ([M, d]), float64 [M·d, M·d].

    Row/column index j·d + a is ∂_a at point j. A reference for tests and small cases; the
    sampler never builds it.
    """
    w = points.to(torch.float64)
    m, d = w.shape
    widths = torch.tensor(list(bandwidths), dtype=torch.float64, device=w.device)
    kernels = _rbf_stack(w, bandwidths) * _label_kernel(labels, m, w.device)[None]
    delta = w[:, None, :] - w[None, :, :]
    eye = torch.eye(d, dtype=torch.float64, device=w.device)
    first = torch.einsum("kjl,k,ab->jalb", kernels, widths**-2, eye)
    second = torch.einsum("kjl,k,jla,jlb->jalb", kernels, widths**-4, delta, delta)
    return (first - second).reshape(m * d, m * d)


def _cholesky_with_jitter(matrix: torch.Tensor, relative_jitter: float) -> torch.Tensor:
    """Lower Cholesky factor of matrix + λI, λ escalating from relative_jitter·mean(diag).

    Fails loudly instead of ever returning without noise.
    """
    size = matrix.shape[-1]
    eye = torch.eye(size, dtype=matrix.dtype, device=matrix.device)
    scale = float(matrix.diagonal().mean().clamp_min(1e-300))
    jitter = max(relative_jitter, 1e-15)
    while jitter <= _MAX_RELATIVE_JITTER:
        factor, info = torch.linalg.cholesky_ex(matrix + jitter * scale * eye)
        if int(info) == 0:
            return factor
        jitter *= 10.0
    raise MechanismFailure(
        "the derivative-GP covariance is not positive definite even with jitter "
        f"{_MAX_RELATIVE_JITTER:g}·mean(diag); refusing to release a gradient without noise"
    )


def _block_noise(
    points: torch.Tensor,
    bandwidths: Sequence[float],
    normals_span: torch.Tensor,
    normals_perp: torch.Tensor,
    jitter: float,
) -> torch.Tensor:
    """Derivative-GP noise for points that share one label (c_jl = 1), float64 [n, m, d].

    `normals_span` [n, m·r] and `normals_perp` [n, d, m] are standard normals with
    r = min(d, m − 1); the map is linear in them, which lets tests read off its covariance.

    With U = span{w_j − w_1} and an orthonormal Q ⊇ U, every δ_jl lies in U, so the covariance
    splits into independent parts: on U⊥ it is A ⊗ P⊥ with A = Σ_ℓ K_ℓ/ℓ², on U an (m·r)-sized
    block matrix. This is exact (spec §3.6) and costs one (m·r)² Cholesky instead of (m·d)².
    """
    m = points.shape[0]
    widths = torch.tensor(list(bandwidths), dtype=torch.float64, device=points.device)
    kernels = _rbf_stack(points, bandwidths)
    a_mat = (kernels * widths[:, None, None] ** -2).sum(0)
    a_factor = _cholesky_with_jitter(a_mat, jitter)
    xi = normals_perp @ a_factor.T  # [n, d, m], Cov(xi[:, :, j], xi[:, :, l]) = A_jl I_d
    if m == 1:
        return xi.transpose(1, 2)
    q_basis, _ = torch.linalg.qr((points[1:] - points[0]).T, mode="reduced")  # [d, r]
    r = q_basis.shape[1]
    coords = points @ q_basis  # [m, r]
    delta = coords[:, None, :] - coords[None, :, :]
    quartic = (kernels * widths[:, None, None] ** -4).sum(0)
    eye_r = torch.eye(r, dtype=torch.float64, device=points.device)
    outer = quartic[:, :, None, None] * delta[:, :, :, None] * delta[:, :, None, :]  # [j,l,a,b]
    span_cov = (a_mat[:, :, None, None] * eye_r - outer).permute(0, 2, 1, 3)
    span_factor = _cholesky_with_jitter(span_cov.reshape(m * r, m * r), jitter)
    span_part = (normals_span @ span_factor.T).reshape(-1, m, r) @ q_basis.T  # [n, m, d]
    perp = xi - q_basis @ (q_basis.T @ xi)
    return span_part + perp.transpose(1, 2)


def _span_rank(m: int, d: int) -> int:
    """Dimension r of the orthonormal basis that `_block_noise` uses for m points in R^d."""
    return min(d, m - 1)


def sample_derivative_noise(
    points: torch.Tensor,
    labels: torch.Tensor | None,
    bandwidths: Sequence[float],
    generator: torch.Generator,
    *,
    jitter: float = 1e-8,
    num_samples: int = 1,
) -> torch.Tensor:
    """Draw the gradient field of GP(0, k*) paths at `points` [M, d], float64 [num_samples, M, d].

    Points with different labels are independent (c_jl = 0), so each label is a block. The
    standard normals come from `generator` (on its own device) and are moved to the points'.
    """
    w = points.detach().to(torch.float64)
    m, d = w.shape
    out = torch.zeros(num_samples, m, d, dtype=torch.float64, device=w.device)
    if labels is None:
        groups = [torch.arange(m, device=w.device)]
    else:
        groups = [torch.nonzero(labels == c).flatten() for c in torch.unique(labels).tolist()]
    for index in groups:
        size = int(index.numel())
        if size == 0:
            continue
        r = _span_rank(size, d)
        draw_device = generator.device
        normals_span = torch.randn(
            num_samples, size * r, generator=generator, dtype=torch.float64, device=draw_device
        ).to(w.device)
        normals_perp = torch.randn(
            num_samples, d, size, generator=generator, dtype=torch.float64, device=draw_device
        ).to(w.device)
        out[:, index] = _block_noise(w[index], bandwidths, normals_span, normals_perp, jitter)
    return out


def noise_scale(noise_multiplier: float, sum_sensitivity: float, normalizer: float) -> float:
    """σΔ: the GP scale for f_S = (1/B)·sum, with Δ = sum_sensitivity / B."""
    return float(noise_multiplier) * float(sum_sensitivity) / float(normalizer)


def privatize_embedding_gradient(
    embedding_gradient: torch.Tensor,
    points: torch.Tensor,
    labels: torch.Tensor | None,
    bandwidths: Sequence[float],
    *,
    noise_multiplier: float,
    sum_sensitivity: float,
    normalizer: float,
    generator: torch.Generator,
    jitter: float = 1e-8,
    across_ranks: bool = False,
) -> torch.Tensor:
    """Release ∇_w f_S(w_j) + σΔ·η_j at the generated points (the per-step mechanism).

    `embedding_gradient` [M, d] is ∇f_S at `points` with f_S normalised by the public B =
    `normalizer`; σ = `noise_multiplier`, Δ = `sum_sensitivity` / B. Returns float64 [M, d].
    A batch [S, M, d] is S independent releases at the same points, each with its own GP draw
    (one covariance factorisation for all; the white-box audit runs its canaries so).
    `across_ranks` (data-parallel, see `dpsynth.privacy.mechanisms.distributed`):
    `embedding_gradient` is this rank's share of the sum over the batch (it is linear in the
    records); the shares are all-reduced and only rank 0's carries the one GP draw, which every rank
    makes alike.
    """
    if noise_multiplier <= 0 or not math.isfinite(noise_multiplier):
        raise UsageError(f"noise multiplier must be positive and finite, got {noise_multiplier}")
    batched = embedding_gradient.dim() == 3
    if batched and across_ranks:
        raise UsageError("a batch of releases is not split across ranks")
    releases = int(embedding_gradient.shape[0]) if batched else 1
    eta = sample_derivative_noise(
        points, labels, bandwidths, generator, jitter=jitter, num_samples=releases
    )
    scale = noise_scale(noise_multiplier, sum_sensitivity, normalizer)
    partial = embedding_gradient.to(torch.float64)
    noisy = partial + scale * (eta if batched else eta[0])
    if across_ranks:
        return all_reduce_sum({"gradient": noisy_partial(partial, noisy)})["gradient"]
    return noisy
