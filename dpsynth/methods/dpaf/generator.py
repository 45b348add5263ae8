"""DPAF's network builders for a data set's shape and labels, and the sampler of a trained run."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dpsynth.data.images import DataInfo
from dpsynth.methods.blocks import LatentGenerator
from dpsynth.methods.dpaf.model import CondGenerator, Features


def build_features(info: DataInfo, config: Mapping[str, Any]) -> Features:
    """The discriminator's (or C's) feature extractor for this data's shape and labels."""
    return Features(
        tuple(info.shape),
        len(info.classes),
        int(config["width"]),
        int(config["conv1_layers"]),
        int(config["conv2_layers"]),
    )


def build_generator(info: DataInfo, config: Mapping[str, Any]) -> CondGenerator:
    """The conditional generator for this data's shape and labels."""
    return CondGenerator(
        tuple(info.shape), len(info.classes), int(config["latent_dim"]), int(config["g_width"])
    )


class DPAFGenerator(LatentGenerator):
    """Samples uint8 images [b, C, H, W] from the trained conditional generator, its latent at
    scale `truncation` (`Generator.truncation`)."""

    build_net = staticmethod(build_generator)
