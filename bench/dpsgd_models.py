"""Small networks shared by the DP-SGD tests and `python -m bench.dpsgd`."""

from __future__ import annotations

from torch import Tensor, nn


class SmallCNN(nn.Module):
    """An MNIST classifier: two conv layers with GroupNorm and ReLU, a linear head.

    Input [B, 1, 28, 28], output logits [B, 10]. GroupNorm (not BatchNorm) keeps records
    independent, as per-record gradients require. By default each block is conv → 2x2 max
    pool → GroupNorm → ReLU: normalising after the pool touches 4x fewer values, which matters
    for per-record gradients because vmap runs GroupNorm as several elementwise kernels.
    `norm_after_pool=False` gives the textbook conv → GroupNorm → ReLU → pool order.
    """

    def __init__(self, channels: int = 16, classes: int = 10, norm_after_pool: bool = True) -> None:
        super().__init__()
        self.features = nn.Sequential(
            *_block(1, channels, norm_after_pool), *_block(channels, 2 * channels, norm_after_pool)
        )
        self.head = nn.Linear(2 * channels * 7 * 7, classes)

    def forward(self, x: Tensor) -> Tensor:
        """Logits for a batch of 1x28x28 images."""
        return self.head(self.features(x).flatten(1))


def _block(cin: int, cout: int, norm_after_pool: bool) -> list[nn.Module]:
    conv, pool = nn.Conv2d(cin, cout, 3, padding=1), nn.MaxPool2d(2)
    norm, act = nn.GroupNorm(4, cout), nn.ReLU()
    return [conv, pool, norm, act] if norm_after_pool else [conv, norm, act, pool]


class ScoreMLP(nn.Module):
    """A tiny score network s(x): R^d -> R^d, for losses that differentiate w.r.t. x."""

    def __init__(self, dim: int = 3, hidden: int = 16) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(dim, hidden), nn.Tanh(), nn.Linear(hidden, dim))

    def forward(self, x: Tensor) -> Tensor:
        """The score estimate at x [B, d]."""
        return self.net(x)
