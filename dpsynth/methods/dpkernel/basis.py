"""The kernel's view of an image: its K lowest 2-D DCT frequencies (`kernel_frequencies`).

DP-Kernel's per-step release is the gradient of the batch's kernel mean embedding at the
generated points, plus derivative-GP noise of the same norm in every direction the kernel
sees. On raw pixels that is d = H·W white-noise coordinates a point, while the signal (a
kernel-weighted mean of images minus the point) lies mostly in low spatial frequencies. A
kernel on the K lowest DCT coefficients, k(Px, Pw) with P a fixed orthonormal [K, d] matrix,
is still a unit-diagonal Gaussian kernel (the same RKHS sensitivity), but its noise lives in K
dimensions: the noise norm falls by √(d / K) while the smooth part of the signal is kept.

P is a public constant of the shape (no data read), so projecting a record is a public
per-record map, like the table binning: the mechanism sees the records Px.
"""

from __future__ import annotations

import torch

from dpsynth.privacy.releases.frequency import dct_matrix


def low_frequency_basis(shape: tuple[int, int, int], count: int) -> torch.Tensor:
    """Rows: the `count` lowest 2-D DCT basis images of each channel, float64 [C·count, C·H·W].

    Frequencies (u, v) are ordered by u² + v² (then u, then v), the same for every channel;
    the rows are orthonormal, so the kernel's distances are those of the kept frequencies.
    """
    channels, height, width = shape
    if not 1 <= count <= height * width:
        raise ValueError(f"count must be in 1..{height * width}, got {count}")
    rows, cols = dct_matrix(height), dct_matrix(width)
    order = sorted(
        ((u * u + v * v, u, v) for u in range(height) for v in range(width)),
    )[:count]
    images = torch.stack([torch.outer(rows[u], cols[v]).flatten() for _, u, v in order])
    pixels = height * width
    basis = torch.zeros(channels * count, channels * pixels, dtype=torch.float64)
    for c in range(channels):
        basis[c * count : (c + 1) * count, c * pixels : (c + 1) * pixels] = images
    return basis


class KernelView:
    """What the kernel is evaluated on: flattened images, or their low DCT frequencies."""

    def __init__(self, basis: torch.Tensor | None) -> None:
        self.basis = basis

    def __call__(self, flat: torch.Tensor) -> torch.Tensor:
        """[n, d] → [n, K·C] (differentiable; the identity without a basis)."""
        if self.basis is None:
            return flat
        return flat @ self.basis.to(device=flat.device, dtype=flat.dtype).T


def kernel_view(
    shape: tuple[int, ...], frequencies: int, modality: str, device: torch.device
) -> KernelView:
    """The view for `kernel_frequencies` = `frequencies` (0: every pixel, or not an image)."""
    if frequencies <= 0 or modality != "image":
        return KernelView(None)
    return KernelView(low_frequency_basis(tuple(shape), frequencies).to(device))  # type: ignore[arg-type]
