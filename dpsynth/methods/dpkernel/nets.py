"""DP-Kernel's generator network: (latent, one-hot label) → a record vector (conv decoder, MLP or
table MLP ending in `TableHead`)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from dpsynth.data.images import DataInfo
from dpsynth.data.table_codec import block_layout
from dpsynth.errors import UsageError
from dpsynth.methods.blocks import ConditionalNet, TableHead, mlp_layers
from dpsynth.methods.dpkernel.binning import number_bins


def _norm_layer(kind: str, channels: int) -> nn.Module:
    if kind == "batch":
        return nn.BatchNorm2d(channels)
    if kind == "group":
        return nn.GroupNorm(min(8, channels), channels)
    if kind == "none":
        return nn.Identity()
    raise UsageError(f"norm must be batch, group or none, got {kind!r}")


class VectorGenerator(ConditionalNet):
    """(latent z, one-hot label) → a record vector of dimension d in [-1, 1].

    `arch="conv"`: the paper's DCGAN decoder (MMD-GAN `CondDecoder`: Linear(nz + K → nz), then
    transposed convolutions from 4×4 doubling to the next power of two ≥ the image side),
    center-cropped to the image and flattened. `arch="mlp"`: two hidden layers, for vectors
    without spatial structure (table rows). Labels enter only when `num_classes > 0`.
    """

    def __init__(
        self,
        shape: tuple[int, ...],
        num_classes: int,
        latent_dim: int,
        width: int,
        arch: str = "conv",
        norm: str = "batch",
        layout: Sequence[tuple[str, int]] = (),
        hard_head: bool = False,
        label_input: str = "embed",
    ) -> None:
        super().__init__(shape, num_classes, latent_dim)
        self.arch = arch
        self.dim = math.prod(self.shape)
        if arch == "conv":
            if len(self.shape) != 3:
                raise UsageError("arch=conv needs image-shaped records (C, H, W); use arch=mlp")
            if label_input == "layers" and num_classes:
                # The label as K extra input channels of every layer (not only squeezed with z
                # through one Linear into nz values), so each layer can draw a class's shape.
                self.embed = None
                self.body = LabelledConvDecoder(self.shape, latent_dim, num_classes, width, norm)
            elif label_input in ("embed", "layers"):
                self.embed = (
                    nn.Linear(latent_dim + num_classes, latent_dim) if num_classes else None
                )
                self.body = _conv_decoder(self.shape, latent_dim, width, norm)
            else:
                raise UsageError(f"label_input must be embed or layers, got {label_input!r}")
        elif arch == "table":
            if not layout:
                raise UsageError("arch=table needs a table (its schema's column blocks)")
            self.embed = None
            self.body = nn.Sequential(
                *mlp_layers(latent_dim + num_classes, width, self.dim),
                TableHead(layout, hard=hard_head),
            )
        elif arch == "mlp":
            self.embed = None
            self.body = nn.Sequential(*mlp_layers(latent_dim + num_classes, width, self.dim))
        else:
            raise UsageError(f"arch must be conv, mlp or table, got {arch!r}")
        self.apply(_init_weights)

    def forward(self, z: torch.Tensor, onehot: torch.Tensor | None) -> torch.Tensor:
        """Vectors [b, d] in [-1, 1]."""
        code = z if onehot is None or not self.num_classes else torch.cat([z, onehot], 1)
        if self.arch == "table":
            return self.body(code)
        if self.arch == "mlp":
            return torch.tanh(self.body(code))
        if isinstance(self.body, LabelledConvDecoder):
            image = self.body(z, onehot)
        else:
            if self.embed is not None:
                code = self.embed(code)
            image = self.body(code[:, :, None, None])
        _, height, width = self.shape
        top = (image.shape[2] - height) // 2
        left = (image.shape[3] - width) // 2
        image = image[:, :, top : top + height, left : left + width]
        return torch.tanh(image).flatten(1)


def _conv_decoder(shape: tuple[int, ...], latent_dim: int, width: int, norm: str) -> nn.Sequential:
    """DCGAN decoder: latent (nz, 1, 1) → 4×4 → … → side (power of two ≥ max(H, W), ≥ 8)."""
    channels_out, height, width_px = shape
    side, upsamples = 8, 1
    while side < max(height, width_px):
        side, upsamples = side * 2, upsamples + 1
    channels = width * 2 ** (upsamples - 1)
    layers: list[nn.Module] = [
        nn.ConvTranspose2d(latent_dim, channels, 4, 1, 0, bias=False),
        _norm_layer(norm, channels),
        nn.ReLU(True),
    ]
    for _ in range(upsamples - 1):
        layers += [
            nn.ConvTranspose2d(channels, channels // 2, 4, 2, 1, bias=False),
            _norm_layer(norm, channels // 2),
            nn.ReLU(True),
        ]
        channels //= 2
    layers.append(nn.ConvTranspose2d(channels, channels_out, 4, 2, 1, bias=False))
    return nn.Sequential(*layers)


class LabelledConvDecoder(nn.Module):
    """The DCGAN decoder of `_conv_decoder` with the one-hot label concatenated, as K constant
    channels, to the input of every transposed convolution (the first takes z ++ label)."""

    def __init__(
        self, shape: tuple[int, ...], latent_dim: int, num_classes: int, width: int, norm: str
    ) -> None:
        super().__init__()
        plain = _conv_decoder(shape, latent_dim, width, norm)
        convs = [m for m in plain if isinstance(m, nn.ConvTranspose2d)]
        self.convs = nn.ModuleList(
            nn.ConvTranspose2d(
                c.in_channels + num_classes, c.out_channels, 4, c.stride, c.padding, bias=False
            )
            for c in convs
        )
        # The norm + ReLU after each convolution but the last.
        self.acts = nn.ModuleList(
            nn.Sequential(_norm_layer(norm, c.out_channels), nn.ReLU(True)) for c in convs[:-1]
        )

    def forward(self, z: torch.Tensor, onehot: torch.Tensor) -> torch.Tensor:
        """Images [b, C, side, side] before the crop and tanh."""
        h = z[:, :, None, None]
        label = onehot[:, :, None, None]
        for index, conv in enumerate(self.convs):
            h = conv(torch.cat([h, label.expand(-1, -1, h.shape[2], h.shape[3])], 1))
            if index < len(self.acts):
                h = self.acts[index](h)
        return h


def _init_weights(module: nn.Module) -> None:
    """The paper's init: conv N(0, 0.02); norm γ N(1, 0.02), β 0; linear N(0, 0.1), b 0."""
    if isinstance(module, (nn.ConvTranspose2d, nn.Conv2d)):
        nn.init.normal_(module.weight, 0.0, 0.02)
    elif isinstance(module, (nn.BatchNorm2d, nn.GroupNorm)):
        nn.init.normal_(module.weight, 1.0, 0.02)
        nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, 0.0, 0.1)
        nn.init.zeros_(module.bias)


def build_network(info: DataInfo, config: Mapping[str, Any]) -> VectorGenerator:
    """The generator network for this data's shape, labels (and table layout) and config."""
    num_classes = len(info.classes) if config["conditional"] else 0
    layout = block_layout(info) if info.modality == "table" else ()
    shape = tuple(info.shape)
    bins = number_bins(info, config)
    if bins is not None:  # the kernel's space: numbers as one-hot bins
        layout, shape = bins.layout, (bins.dim,)
    return VectorGenerator(
        shape=shape,
        num_classes=num_classes,
        latent_dim=int(config["latent_dim"]),
        width=int(config["width"]),
        arch=str(config["arch"]),
        norm=str(config["norm"]),
        layout=layout,
        hard_head=config.get("head", "soft") == "hard",
        label_input=str(config.get("label_input", "embed")),
    )
