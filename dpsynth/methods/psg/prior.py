"""PSG's generator prior (spec psg §2.4): S = G(z_j, y_j; φ) for M fixed codes z_j.

Instead of optimising S's pixels, PSG may optimise the weights φ of a small conditional
generator whose M outputs, one per fixed latent code and balanced label, are S. The codes are
drawn once from public randomness and never change; only φ learns. Everything here is
post-processing of the released noisy gradients: the generator never sees a record.

The architecture follows the reference prior (GS-WGAN's DCGAN, z_dim 10, PixelNorm after every
hidden layer, identity output so S stays unclamped in the training scale), generalised to any
image side: a linear map to 4w channels at ⌈H/4⌉², two ×2 nearest upsamplings each followed by
a 3×3 convolution (4w → 2w → w), a 3×3 convolution to the image channels, and a centre crop.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn
from torch.nn import functional as F

PRIORS = ("none", "dcgan")
_PIXEL_NORM_EPS = 1e-8


class PixelNorm(nn.Module):
    """x / √(mean over channels of x² + 1e-8), per position (no learned parameters)."""

    def forward(self, x: Tensor) -> Tensor:
        """The normalised feature map (same shape)."""
        return x * torch.rsqrt(x.pow(2).mean(dim=1, keepdim=True) + _PIXEL_NORM_EPS)


class PriorGenerator(nn.Module):
    """G(z, onehot(y)) → images [b, C, H, W] in the (unclamped) training scale."""

    def __init__(
        self, shape: tuple[int, int, int], num_classes: int, latent_dim: int, width: int
    ) -> None:
        super().__init__()
        self.shape = tuple(int(s) for s in shape)
        self.num_classes = int(num_classes)
        self.latent_dim = int(latent_dim)
        channels, height, width_px = self.shape
        self.start_side = math.ceil(max(height, width_px) / 4)
        self.start_channels = 4 * width
        self.project = nn.Linear(
            self.latent_dim + self.num_classes, self.start_channels * self.start_side**2
        )
        self.body = nn.Sequential(
            nn.ReLU(),
            PixelNorm(),
            nn.Upsample(scale_factor=2, mode="nearest"),
            nn.Conv2d(4 * width, 2 * width, 3, padding=1),
            nn.ReLU(),
            PixelNorm(),
            nn.Upsample(scale_factor=2, mode="nearest"),
            nn.Conv2d(2 * width, width, 3, padding=1),
            nn.ReLU(),
            PixelNorm(),
            nn.Conv2d(width, channels, 3, padding=1),
        )

    def forward(self, codes: Tensor, labels: Tensor) -> Tensor:
        """Images for latent codes [b, latent_dim] and integer labels [b]."""
        onehot = F.one_hot(labels.to(torch.int64), self.num_classes).to(codes.dtype)
        start = self.project(torch.cat([codes, onehot], dim=1))
        start = start.view(-1, self.start_channels, self.start_side, self.start_side)
        image = self.body(start)
        _, height, width = self.shape
        top = (image.shape[2] - height) // 2
        left = (image.shape[3] - width) // 2
        return image[:, :, top : top + height, left : left + width]
