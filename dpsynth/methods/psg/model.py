"""The classifier F(·; θ) whose gradients PSG matches: the dataset-condensation ConvNet.

Per block: Conv3×3 → norm → ReLU → AvgPool 2×2; then one Linear head (spec psg §2.6). The
norm is per record (instance norm as GroupNorm(C, C), or none): BatchNorm mixes the records
of a batch, so a record's clipped gradient would no longer bound its influence (DP-SGD's
sensitivity argument needs per-record computations).
"""

from __future__ import annotations

from torch import Tensor, nn

from dpsynth.errors import UsageError

NORMS = ("instance", "none")


def _norm(kind: str, channels: int) -> nn.Module:
    if kind == "instance":
        return nn.GroupNorm(channels, channels, affine=True)
    if kind == "none":
        return nn.Identity()
    raise UsageError(f"norm must be one of {', '.join(NORMS)} for --method psg, got {kind!r}")


class ConvNet(nn.Module):
    """ConvNet(width, depth) for images (C, H, W) and `num_classes` labels.

    A 28×28 input gets padding 3 in the first convolution (28 → 32, as the reference code), so
    the feature map halves cleanly; other sizes use padding 1.
    """

    def __init__(
        self,
        shape: tuple[int, int, int],
        num_classes: int,
        width: int = 128,
        depth: int = 3,
        norm: str = "instance",
    ) -> None:
        super().__init__()
        channels, height, width_px = shape
        if depth < 1 or width < 1:
            raise UsageError("the PSG ConvNet needs depth ≥ 1 and width ≥ 1")
        layers: list[nn.Module] = []
        size_h, size_w = height, width_px
        in_channels = channels
        for block in range(depth):
            pad = 3 if block == 0 and (height, width_px) == (28, 28) else 1
            layers += [
                nn.Conv2d(in_channels, width, 3, padding=pad),
                _norm(norm, width),
                nn.ReLU(),
            ]
            size_h, size_w = size_h + 2 * pad - 2, size_w + 2 * pad - 2
            if size_h >= 2 and size_w >= 2:
                layers.append(nn.AvgPool2d(2))
                size_h, size_w = size_h // 2, size_w // 2
            in_channels = width
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(width * size_h * size_w, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        """Logits [b, num_classes] for images x [b, C, H, W]."""
        return self.classifier(self.features(x).flatten(1))
