"""The kernel's view through features learnt from declared-public images (`kernel_features`).

A Gaussian kernel on pixels is a weak judge of a digit: two images of the same digit with the
stroke moved by two pixels are as far apart as a digit and a blob. DP-MEPF (Harder et al.,
2023) matches the data in the feature space of a network trained on public data instead.
Here the kernel sees each image as its pixels (or the view of `kernel_frequencies`) joined to
s · φ(x)/‖φ(x)‖, s being `kernel_feature_scale` times the smallest kernel width and φ the
penultimate layer of a small classifier trained on the `train --public` images, labelled with
the data's classes, before any private read.

Privacy: φ is fixed before the first private step and is a function of public images and the
public seed only, so the view is a public per-record map, like the DCT basis. The kernel on
the joined vector is still a unit-diagonal Gaussian kernel: the RKHS sensitivity, σ and the
accounting are those of the pixel kernel. The derivative-GP noise lies in the joined space
(d + K dimensions); the generator follows it through φ's Jacobian, which is post-processing.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class PublicEncoder(nn.Module):
    """Image [n, C, H, W] in [-1, 1] → features [n, K] (ReLU), with a class head for training.

    Two strided convolutions and a linear layer: small enough that the DP steps, which
    evaluate it on every record of the batch and every generated point, stay on the CPU
    budget. No normalisation layer, so a record's features depend on that record alone.
    """

    def __init__(self, shape: tuple[int, int, int], features: int, classes: int) -> None:
        super().__init__()
        channels, height, width = shape
        self.shape = shape
        self.body = nn.Sequential(
            nn.Conv2d(channels, 32, 3, stride=2, padding=1),
            nn.LeakyReLU(0.2),
            nn.Conv2d(32, 64, 3, stride=2, padding=1),
            nn.LeakyReLU(0.2),
            nn.Flatten(),
            nn.Linear(64 * ((height + 3) // 4) * ((width + 3) // 4), features),
            nn.ReLU(),
        )
        self.head = nn.Linear(features, classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """The features (not the class logits)."""
        return self.body(images)


def train_public_encoder(
    encoder: PublicEncoder,
    x: torch.Tensor,
    y: torch.Tensor,
    steps: int,
    seed: int,
    batch_size: int = 128,
) -> None:
    """Train `encoder` (and its head) as a classifier of the public images x [n, C, H, W] with
    labels y [n], `steps` Adam steps on batches drawn from the public seed; then freeze it.
    Reads no private record."""
    rng = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(encoder.parameters(), lr=1e-3)
    encoder.train()
    for _ in range(steps):
        index = torch.randint(0, len(x), (min(batch_size, len(x)),), generator=rng)
        batch = x[index.to(x.device)]
        # A small random shift (public randomness; ±2 pixels at 28×28, none below 14) so the
        # features do not key on position.
        reach = x.shape[-1] // 14
        shift = torch.randint(-reach, reach + 1, (2,), generator=rng).tolist()
        batch = torch.roll(batch, shifts=(shift[0], shift[1]), dims=(2, 3))
        logits = encoder.head(encoder(batch))
        loss = F.cross_entropy(logits, y[index.to(y.device)])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    encoder.eval()
    encoder.requires_grad_(False)


class FeatureView:
    """What the kernel sees: `inner`'s view of the flattened image joined to `scale` · φ/‖φ‖."""

    def __init__(self, inner: object, encoder: PublicEncoder, scale: float) -> None:
        self.inner = inner
        self.encoder = encoder
        self.scale = float(scale)

    def __call__(self, flat: torch.Tensor) -> torch.Tensor:
        """[n, d] → [n, d' + K], differentiable in `flat`, in `flat`'s dtype."""
        images = flat.to(torch.float32).reshape(len(flat), *self.encoder.shape)
        features = self.encoder(images)
        # Unit norm (a zero vector stays zero): distances in [0, √2·scale] for ReLU features.
        features = features / features.norm(dim=1, keepdim=True).clamp_min(1e-6)
        return torch.cat([self.inner(flat), (self.scale * features).to(flat.dtype)], dim=1)
