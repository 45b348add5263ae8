"""RDP-GAN's networks built for a data set (D and G), the labels it generates, and the sampler
of a trained run."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from dpsynth.data.images import DataInfo, to_uint8
from dpsynth.data.table_codec import block_layout
from dpsynth.methods.base import Generator, draw_latent, sample_truncation
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


def one_hot_labels(labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Float one-hot rows [b, K] of class indices (the networks' label input)."""
    return F.one_hot(labels, num_classes).float()


class RDPGANGenerator(Generator):
    """Samples uint8 images [b, C, H, W] (or encoded table rows float32 [b, D]) from the
    trained conditional generator, its latent at scale `truncation` (`Generator.truncation`)."""

    def __init__(
        self,
        net: nn.Module,
        classes: tuple[str, ...],
        device: torch.device,
        modality: str = "image",
        truncation: float = 1.0,
    ):
        self.net = net.to(device).eval()
        self.truncation = float(truncation)
        self.modality = modality
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
    ) -> RDPGANGenerator:
        """The sampler from the saved `generator.*` tensors."""
        net = build_generator(info, config)
        net.load_state_dict(with_prefix(tensors, "generator."))
        return cls(net, info.classes, device, info.modality, sample_truncation(config))

    @torch.no_grad()
    def sample(
        self, labels: torch.Tensor, batch_size: int, generator: torch.Generator
    ) -> Iterator[torch.Tensor]:
        """Yield uint8 batches for `labels` in order; latents come from `generator`."""
        for start in range(0, int(labels.numel()), batch_size):
            chunk = labels[start : start + batch_size].to(torch.int64)
            z = draw_latent(chunk.numel(), self.net.latent_dim, generator, self.truncation)
            onehot = one_hot_labels(chunk.to(self.device), self.net.num_classes)
            records = self.net(z.to(self.device), onehot)
            if self.modality == "table":
                yield records.float().cpu()  # encoded rows; `sample_table` decodes them
            else:
                yield to_uint8(records).cpu()


def with_prefix(tensors: Mapping[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """The tensors whose names start with `prefix`, the prefix cut off."""
    return {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}
