"""What a PGE config builds from public facts: the noise levels, the working resolution (and the
map of images to it and back), the score network and the frozen residual encoder."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch.nn import functional as F

from dpsynth.data.images import DataInfo
from dpsynth.errors import UsageError
from dpsynth.methods.pge.nets import RandomConvEncoder, ScoreUNet


def noise_levels(config: Mapping[str, Any]) -> torch.Tensor:
    """The σ levels, geometric from sigma_max down to sigma_min (fixed constants, not data)."""
    n = int(config["n_levels"])
    if n == 1:
        return torch.tensor([float(config["sigma_min"])])
    return torch.logspace(
        math.log10(float(config["sigma_max"])), math.log10(float(config["sigma_min"])), n
    )


def working_shape(config: Mapping[str, Any], data_shape: tuple[int, int, int]) -> tuple[int, int]:
    """The (H, W) the network works at: `image_size` if set, else the data size padded up to a
    multiple of the U-Net's down-sampling factor."""
    factor = 2 ** (len(config["ch_mult"]) - 1)
    size = int(config["image_size"])
    if size > 0:
        if size % factor:
            raise UsageError(f"image_size {size} must be a multiple of {factor} for ch_mult")
        return size, size
    _, h, w = data_shape
    return -(-h // factor) * factor, -(-w // factor) * factor


def describe_transform(config: Mapping[str, Any], data_shape: tuple[int, int, int]) -> str:
    """A one-line statement of how data is mapped to the working resolution and back."""
    _, h, w = data_shape
    wh, ww = working_shape(config, data_shape)
    if (wh, ww) == (h, w):
        return f"none ({h}x{w} used as is)"
    if config["resize"] == "pad":
        if wh < h or ww < w:
            raise UsageError(
                f"image_size {wh} is smaller than the data ({h}x{w}); use resize=resize"
            )
        return (
            f"pad {h}x{w} -> {wh}x{ww} with -1 (black) on the bottom/right; "
            "samples are cropped back"
        )
    return f"bilinear resize {h}x{w} -> {wh}x{ww}; samples are resized back"


def to_working(
    x: torch.Tensor, config: Mapping[str, Any], data_shape: tuple[int, int, int]
) -> torch.Tensor:
    """Map data-shaped images [b,C,H,W] in [-1,1] to the working resolution."""
    _, h, w = data_shape
    wh, ww = working_shape(config, data_shape)
    if (wh, ww) == (h, w):
        return x
    if config["resize"] == "pad":
        return F.pad(x, (0, ww - w, 0, wh - h), value=-1.0)
    return F.interpolate(x, size=(wh, ww), mode="bilinear", align_corners=False, antialias=True)


def from_working(
    x: torch.Tensor, config: Mapping[str, Any], data_shape: tuple[int, int, int]
) -> torch.Tensor:
    """Inverse of `to_working` (crop, or resize back)."""
    _, h, w = data_shape
    if tuple(x.shape[-2:]) == (h, w):
        return x
    if config["resize"] == "pad":
        return x[..., :h, :w]
    return F.interpolate(x, size=(h, w), mode="bilinear", align_corners=False, antialias=True)


def build_score_net(config: Mapping[str, Any], info: DataInfo) -> ScoreUNet:
    """The score U-Net for this config and data shape (weights from the current torch RNG)."""
    return ScoreUNet(
        channels=info.shape[0],
        num_classes=len(info.classes),
        nf=int(config["nf"]),
        ch_mult=[int(m) for m in config["ch_mult"]],
        num_res_blocks=int(config["num_res_blocks"]),
        attn_levels=[int(a) for a in config["attn_levels"]],
        mid_attention=bool(config["mid_attention"]),
        residual_channels=int(config["residual_channels"])
        if config["residual"] == "random-conv"
        else 0,
    )


def build_encoder(config: Mapping[str, Any], info: DataInfo) -> RandomConvEncoder | None:
    """The residual module's frozen encoder (seeded constant, data-independent), or None."""
    if config["residual"] != "random-conv":
        return None
    return RandomConvEncoder(
        info.shape[0], int(config["residual_channels"]), len(config["ch_mult"]) - 1
    )
