"""DPAF's networks: a cDCGAN generator and a discriminator split around the aggregation.

The discriminator (and the phase-1 classifier C, which has the same feature extractor) is
`conv1` (label injected at the first layer, cDCGAN style) → `conv2*` → LeakyReLU → SIN
(per-sample, per-channel standardisation, no affine part) → a flat feature vector h with
‖h‖₂ ≤ √(m·p²). The aggregation sits after h; the head (two linear layers) reads either a
(noisy) batch aggregate or, for the generator's loss, one sample's h. There is no BatchNorm
anywhere private data flows (spec §10.1-F1): every layer before the aggregation is a
per-sample function, so a record's feature vector depends on that record alone.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from dpsynth.methods.blocks import ConditionalNet

_SIN_EPS = 1e-5


def sin(maps: Tensor) -> Tensor:
    """Simplified instance normalisation, flattened: [b, m, p, p] → [b, m·p²].

    Each channel of each sample is standardised over its H×W positions; with the ε under the
    square root each channel's norm is ≤ √(HW), so each row's norm is ≤ √(m·H·W).
    """
    mean = maps.mean(dim=(2, 3), keepdim=True)
    var = maps.var(dim=(2, 3), keepdim=True, unbiased=False)
    return ((maps - mean) / torch.sqrt(var + _SIN_EPS)).flatten(1)


def _down(in_channels: int, out_channels: int, side: int) -> tuple[nn.Conv2d, int]:
    """A DCGAN down-sampling conv for a `side`×`side` input, and its output side.

    Halves the side while it is above 4 (k4 s2 p1 for even sides, k3 s2 p1 for odd ones, as
    7 → 4 on MNIST); at 4 or below it keeps the side (k3 s1 p1), so SIN always has p ≥ 2.
    """
    if side > 4:
        kernel = 4 if side % 2 == 0 else 3
        return nn.Conv2d(in_channels, out_channels, kernel, 2, 1), (side + 1) // 2
    return nn.Conv2d(in_channels, out_channels, 3, 1, 1), side


class Features(nn.Module):
    """conv1 (image ‖ label-fill branches, then more convs) → conv2* → SIN → h.

    `conv1_layers` ≥ 1 counts the first (two-branch) layer; channels double per layer from
    `width` (the first layer's output, half image and half label).
    """

    def __init__(
        self,
        shape: tuple[int, int, int],
        num_classes: int,
        width: int,
        conv1_layers: int,
        conv2_layers: int,
    ) -> None:
        super().__init__()
        channels, side = shape[0], max(shape[1], shape[2])
        self.num_classes = num_classes
        self.image_in, after = _down(channels, width // 2, side)
        self.label_in, _ = _down(num_classes, width - width // 2, side)
        side = after
        layers: list[nn.Module] = []
        current = width
        for _ in range(conv1_layers - 1):
            conv, side = _down(current, current * 2, side)
            layers += [conv, nn.LeakyReLU(0.2)]
            current *= 2
        self.conv1_rest = nn.Sequential(*layers)
        layers = []
        for index in range(conv2_layers):
            conv, side = _down(current, current * 2, side)
            layers.append(conv)
            if index < conv2_layers - 1:
                layers.append(nn.LeakyReLU(0.2))
            current *= 2
        self.conv2 = nn.Sequential(*layers)
        with torch.no_grad():  # the feature size from a dry run (non-square images too)
            probe = self.forward(torch.zeros(1, *shape), torch.zeros(1, num_classes))
        self.channels = current
        self.dim = int(probe.shape[1])
        # The sensitivity of one record's h: √(m·p²) (spec §2.2).
        self.bound = math.sqrt(self.dim)

    def conv1_parameters(self) -> list[nn.Parameter]:
        """The parameters of conv1 (transferred from C, then frozen)."""
        return [
            *self.image_in.parameters(),
            *self.label_in.parameters(),
            *self.conv1_rest.parameters(),
        ]

    def forward(self, x: Tensor, onehot: Tensor) -> Tensor:
        """h [b, m·p²] for images x [b, C, H, W] in [-1, 1] and one-hot labels [b, K]."""
        fill = onehot[:, :, None, None].expand(-1, -1, x.shape[2], x.shape[3])
        out = torch.cat([self.image_in(x), self.label_in(fill)], dim=1)
        out = self.conv1_rest(F.leaky_relu(out, 0.2))
        return sin(F.leaky_relu(self.conv2(out), 0.2))


class AggregateRows:
    """What one record contributes to the aggregate: its h, or (`per_class`) onehot(y) ⊗ [h, a].

    Per-class rows put a record's features (and a constant count coordinate a) into the block
    of its own label and zeros elsewhere, so the sum over a batch holds each class's feature
    sum and a·(its count). A row's norm is ‖[h, a]‖ ≤ √(m·p² + a²) = `bound` either way: the
    same sensitivity, one noise draw for all blocks.
    """

    def __init__(self, feature_dim: int, num_classes: int, per_class: bool, count: float) -> None:
        self.feature_dim = feature_dim
        self.num_classes = num_classes
        self.per_class = per_class
        self.count = float(count)
        if per_class:
            self.dim = num_classes * (feature_dim + 1)
            self.bound = math.sqrt(feature_dim + self.count**2)
        else:
            self.dim = feature_dim
            self.bound = math.sqrt(feature_dim)

    def __call__(self, h: Tensor, onehot: Tensor) -> Tensor:
        """Rows [b, dim] for features h [b, m·p²] and one-hot labels [b, K]."""
        if not self.per_class:
            return h
        extended = torch.cat([h, h.new_full((h.shape[0], 1), self.count)], dim=1)
        return (onehot[:, :, None] * extended[:, None, :]).flatten(1)

    def class_means(self, total: Tensor) -> Tensor | None:
        """Per-class mean features [K, m·p²] from a (noisy) sum of rows; None before any.

        Each block's feature sum is divided by its count coordinate / a (at least 1).
        """
        if not self.per_class or not bool(total.any()):
            return None
        blocks = total.view(self.num_classes, self.feature_dim + 1)
        counts = (blocks[:, -1] / self.count).clamp_min(1.0)
        return blocks[:, :-1] / counts[:, None]


class Head(nn.Module):
    """The two FC* layers after the aggregation: dim → hidden → outputs."""

    def __init__(self, dim: int, hidden: int, outputs: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Linear(dim, hidden), nn.LeakyReLU(0.2), nn.Linear(hidden, outputs)
        )

    def forward(self, aggregate: Tensor) -> Tensor:
        """Logits [b, outputs] for aggregates (or single-sample features) [b, dim]."""
        return self.body(aggregate)


class Classifier(nn.Module):
    """Phase 1's C: the same features with a K-way head, trained per sample (no aggregation)."""

    def __init__(self, features: Features, hidden: int) -> None:
        super().__init__()
        self.features = features
        self.head = Head(features.dim, hidden, features.num_classes)

    def forward(self, x: Tensor, onehot: Tensor) -> Tensor:
        """Class logits [b, K]."""
        return self.head(self.features(x, onehot))


class CondGenerator(ConditionalNet):
    """cDCGAN generator: (z ‖ one-hot) branches at 4×4 → doubling ConvT layers → tanh, cropped.

    BatchNorm is allowed here: the generator only ever sees its own samples.
    """

    def __init__(
        self, shape: tuple[int, int, int], num_classes: int, latent_dim: int, width: int
    ) -> None:
        super().__init__(shape, num_classes, latent_dim)
        side, upsamples = 8, 1
        while side < max(shape[1], shape[2]):
            side, upsamples = side * 2, upsamples + 1
        channels = width * 2**upsamples
        self.z_in = nn.Sequential(
            nn.ConvTranspose2d(latent_dim, channels // 2, 4, 1, 0),
            nn.BatchNorm2d(channels // 2),
            nn.ReLU(True),
        )
        self.y_in = nn.Sequential(
            nn.ConvTranspose2d(num_classes, channels // 2, 4, 1, 0),
            nn.BatchNorm2d(channels // 2),
            nn.ReLU(True),
        )
        layers: list[nn.Module] = []
        for _ in range(upsamples - 1):
            layers += [
                nn.ConvTranspose2d(channels, channels // 2, 4, 2, 1),
                nn.BatchNorm2d(channels // 2),
                nn.ReLU(True),
            ]
            channels //= 2
        layers.append(nn.ConvTranspose2d(channels, shape[0], 4, 2, 1))
        self.body = nn.Sequential(*layers)

    def forward(self, z: Tensor, onehot: Tensor) -> Tensor:
        """Images [b, C, H, W] in [-1, 1]."""
        out = torch.cat([self.z_in(z[:, :, None, None]), self.y_in(onehot[:, :, None, None])], 1)
        image = torch.tanh(self.body(out))
        _, height, width = self.shape
        top = (image.shape[2] - height) // 2
        left = (image.shape[3] - width) // 2
        return image[:, :, top : top + height, left : left + width]
