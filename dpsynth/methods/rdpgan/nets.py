"""RDP-GAN's conditional networks.

Two families, chosen by the `arch` setting:
- `mlp`: D and G over FLAT vectors of any length (the authors' MNIST code, spec §2.3). An
  image is flattened on the way into D and G's output is reshaped to the record shape, so a
  table record mode (a D-dim vector per row) needs only another `shape`;
- `conv`: the spec's 3-layer conditional DCGAN (§10.3) for images with sides divisible by 4.

The discriminator has no BatchNorm (spec §10.6): every layer is a per-record function, so a
record's gradient depends on that record alone and clipping bounds its contribution. It
returns a logit; the sigmoid lives inside the loss (softplus form of BCE). The generator
sees only its own samples and may use BatchNorm.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from dpsynth.methods.blocks import ConditionalNet, TableHead, mlp_layers


def _flat(shape: tuple[int, ...]) -> int:
    return int(math.prod(shape))


class MLPDiscriminator(nn.Module):
    """(x flattened ‖ one-hot label) → hidden → hidden → logit, LeakyReLU 0.2."""

    def __init__(self, shape: tuple[int, ...], num_classes: int, hidden: int) -> None:
        super().__init__()
        self.shape = tuple(shape)
        self.body = nn.Sequential(
            nn.Linear(_flat(shape) + num_classes, hidden),
            nn.LeakyReLU(0.2),
            nn.Linear(hidden, hidden),
            nn.LeakyReLU(0.2),
            nn.Linear(hidden, 1),
        )

    def forward(self, x: Tensor, onehot: Tensor) -> Tensor:
        """Logits [b] for records x [b, *shape] and one-hot labels [b, K]."""
        return self.body(torch.cat([x.flatten(1), onehot], dim=1)).squeeze(1)


class MLPGenerator(ConditionalNet):
    """(z ‖ one-hot label) → hidden → hidden → flat record → tanh, reshaped to `shape`.

    With a table `layout` ((kind, size) blocks of the encoding), the output head is the shared
    `TableHead` instead: a softmax per categorical block and a tanh per number.
    """

    def __init__(
        self,
        shape: tuple[int, ...],
        num_classes: int,
        latent_dim: int,
        hidden: int,
        layout: tuple[tuple[str, int], ...] = (),
        hard_head: bool = False,
    ) -> None:
        super().__init__(shape, num_classes, latent_dim)
        self.body = nn.Sequential(*mlp_layers(latent_dim + num_classes, hidden, _flat(shape)))
        self.head: nn.Module = TableHead(layout, hard=hard_head) if layout else nn.Tanh()

    def forward(self, z: Tensor, onehot: Tensor) -> Tensor:
        """Records [b, *shape] in [-1, 1] (encoded rows [b, D] for a table)."""
        return self.head(self.body(torch.cat([z, onehot], dim=1))).view(-1, *self.shape)


def _groups(channels: int) -> int:
    return 8 if channels % 8 == 0 else 1


class ConvDiscriminator(nn.Module):
    """Conv(C+K label planes → w, k4 s2 p1) → LReLU → Conv(w → 2w, k4 s2 p1) → GroupNorm →
    LReLU → Linear → logit (spec §10.3, with a linear head so any side divisible by 4 works)."""

    def __init__(self, shape: tuple[int, int, int], num_classes: int, width: int) -> None:
        super().__init__()
        channels, height, side = shape
        self.shape = tuple(shape)
        self.conv1 = nn.Conv2d(channels + num_classes, width, 4, 2, 1)
        self.conv2 = nn.Conv2d(width, 2 * width, 4, 2, 1)
        self.norm = nn.GroupNorm(_groups(2 * width), 2 * width)
        self.head = nn.Linear(2 * width * (height // 4) * (side // 4), 1)

    def forward(self, x: Tensor, onehot: Tensor) -> Tensor:
        """Logits [b] for images x [b, C, H, W] and one-hot labels [b, K]."""
        planes = onehot[:, :, None, None].expand(-1, -1, x.shape[2], x.shape[3])
        out = F.leaky_relu(self.conv1(torch.cat([x, planes], dim=1)), 0.2)
        out = F.leaky_relu(self.norm(self.conv2(out)), 0.2)
        return self.head(out.flatten(1)).squeeze(1)


class ConvGenerator(ConditionalNet):
    """(z ‖ one-hot) → Linear to 2w@(H/4) → BN-ReLU → ConvT(2w → w) → BN-ReLU → ConvT(w → C)
    → tanh (3 layers, spec §10.3)."""

    def __init__(
        self, shape: tuple[int, int, int], num_classes: int, latent_dim: int, width: int
    ) -> None:
        super().__init__(shape, num_classes, latent_dim)
        channels, height, side = self.shape
        self.start = (2 * width, height // 4, side // 4)
        self.fc = nn.Linear(latent_dim + num_classes, _flat(self.start))
        self.body = nn.Sequential(
            nn.BatchNorm2d(2 * width),
            nn.ReLU(),
            nn.ConvTranspose2d(2 * width, width, 4, 2, 1),
            nn.BatchNorm2d(width),
            nn.ReLU(),
            nn.ConvTranspose2d(width, channels, 4, 2, 1),
        )

    def forward(self, z: Tensor, onehot: Tensor) -> Tensor:
        """Images [b, C, H, W] in [-1, 1]."""
        out = self.fc(torch.cat([z, onehot], dim=1)).view(-1, *self.start)
        return torch.tanh(self.body(out))
