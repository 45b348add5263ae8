"""Small networks shared by the DP-SGD tests and `bench/dpsgd.py`."""

from __future__ import annotations

from torch import Tensor, nn


class SmallCNN(nn.Module):
    """An MNIST classifier: two conv layers with GroupNorm and ReLU, a linear head.

    Input [B, 1, 28, 28], output logits [B, 10]. GroupNorm (not BatchNorm) keeps records
    independent, as per-record gradients require.
    """

    def __init__(self, channels: int = 16, classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, channels, 3, padding=1),
            nn.GroupNorm(4, channels),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(channels, 2 * channels, 3, padding=1),
            nn.GroupNorm(4, 2 * channels),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.head = nn.Linear(2 * channels * 7 * 7, classes)

    def forward(self, x: Tensor) -> Tensor:
        """Logits for a batch of 1x28x28 images."""
        return self.head(self.features(x).flatten(1))


class ScoreMLP(nn.Module):
    """A tiny score network s(x): R^d -> R^d, for losses that differentiate w.r.t. x."""

    def __init__(self, dim: int = 3, hidden: int = 16) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(dim, hidden), nn.Tanh(), nn.Linear(hidden, dim))

    def forward(self, x: Tensor) -> Tensor:
        """The score estimate at x [B, d]."""
        return self.net(x)
