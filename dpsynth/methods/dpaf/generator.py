"""DPAF's network builders for a data set's shape and labels, and the sampler of a trained run."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch.nn import functional as F

from dpsynth.data.images import DataInfo, to_uint8
from dpsynth.methods.base import Generator, draw_latent, sample_truncation
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


def one_hot_labels(labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Float one-hot rows [b, K] of class indices (the networks' label input)."""
    return F.one_hot(labels, num_classes).float()


class DPAFGenerator(Generator):
    """Samples uint8 images [b, C, H, W] from the trained conditional generator, its latent at
    scale `truncation` (`Generator.truncation`)."""

    def __init__(
        self,
        net: CondGenerator,
        classes: tuple[str, ...],
        device: torch.device,
        truncation: float = 1.0,
    ):
        self.net = net.to(device).eval()
        self.truncation = float(truncation)
        self.classes = tuple(classes)
        self.shape = tuple(net.shape)  # type: ignore[assignment]
        self.device = device

    @classmethod
    def from_state(
        cls,
        info: DataInfo,
        config: Mapping[str, Any],
        tensors: Mapping[str, torch.Tensor],
        device: torch.device,
    ) -> DPAFGenerator:
        """The sampler from the saved `generator.*` tensors."""
        net = build_generator(info, config)
        net.load_state_dict(with_prefix(tensors, "generator."))
        return cls(net, info.classes, device, sample_truncation(config))

    @torch.no_grad()
    def sample(
        self, labels: torch.Tensor, batch_size: int, generator: torch.Generator
    ) -> Iterator[torch.Tensor]:
        """Yield uint8 batches for `labels` in order; latents come from `generator`."""
        for start in range(0, int(labels.numel()), batch_size):
            chunk = labels[start : start + batch_size].to(torch.int64)
            z = draw_latent(chunk.numel(), self.net.latent_dim, generator, self.truncation)
            onehot = one_hot_labels(chunk.to(self.device), self.net.num_classes)
            yield to_uint8(self.net(z.to(self.device), onehot)).cpu()


def with_prefix(tensors: Mapping[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """The tensors whose names start with `prefix`, the prefix cut off."""
    return {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}
