"""RDP-GAN's networks built for a data set (D and G), the labels it generates, and the sampler
of a trained run."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from dpsynth.data.images import DataInfo
from dpsynth.data.table_codec import block_layout
from dpsynth.methods.blocks import LatentGenerator
from dpsynth.methods.rdpgan.nets import (
    ConvDiscriminator,
    ConvGenerator,
    MLPDiscriminator,
    MLPGenerator,
)


def build_discriminator(info: DataInfo, config: Mapping[str, Any]) -> nn.Module:
    """D for this data's record shape and labels (no BatchNorm)."""
    if config["arch"] == "conv":
        return ConvDiscriminator(tuple(info.shape), len(info.classes), int(config["width"]))
    return MLPDiscriminator(tuple(info.shape), len(info.classes), int(config["hidden"]))


def build_generator(info: DataInfo, config: Mapping[str, Any]) -> nn.Module:
    """The conditional G for this data's record shape and labels."""
    latent = int(config["latent_dim"])
    if config["arch"] == "conv":
        return ConvGenerator(tuple(info.shape), len(info.classes), latent, int(config["width"]))
    layout = block_layout(info) if info.modality == "table" else ()
    return MLPGenerator(
        tuple(info.shape),
        len(info.classes),
        latent,
        int(config["hidden"]),
        layout=layout,
        hard_head=config.get("head", "soft") == "hard",
    )


def label_weights(info: DataInfo) -> torch.Tensor | None:
    """A table target's declared public class weights (schema `weights`), else None."""
    if info.modality != "table" or not info.schema:
        return None
    target = next(c for c in info.schema["columns"] if c["name"] == info.schema["target"])
    weights = target.get("weights")
    return torch.tensor([float(w) for w in weights], dtype=torch.float64) if weights else None


class RDPGANGenerator(LatentGenerator):
    """Samples uint8 images [b, C, H, W] (or encoded table rows float32 [b, D]) from the
    trained conditional generator, its latent at scale `truncation` (`Generator.truncation`)."""

    build_net = staticmethod(build_generator)
