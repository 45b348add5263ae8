"""DP-Kernel's sampler of a trained run (images or encoded table rows)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch.nn import functional as F

from dpsynth.data.images import DataInfo, to_uint8
from dpsynth.methods.base import Generator, draw_latent, sample_truncation
from dpsynth.methods.dpkernel.binning import NumberBins, number_bins
from dpsynth.methods.dpkernel.nets import VectorGenerator, build_network


def one_hot_or_none(labels: torch.Tensor, num_classes: int) -> torch.Tensor | None:
    """Float one-hot rows [b, K] of class indices; None for an unconditional generator."""
    return F.one_hot(labels, num_classes).float() if num_classes else None


class DPKernelGenerator(Generator):
    """Samples uint8 images [b, C, H, W] from a trained vector generator (no private data).

    `truncation` scales the latent z ~ N(0, I) before the network (the "truncation trick" of
    GAN sampling): below 1 it trades diversity for samples nearer the generator's typical
    output. It is post-processing of the released generator, so it costs no privacy.
    """

    def __init__(
        self,
        net: VectorGenerator,
        classes: tuple[str, ...],
        device: torch.device,
        modality: str = "image",
        truncation: float = 1.0,
        bins: NumberBins | None = None,
    ):
        self.net = net.to(device).eval()
        self.bins = bins  # a table's numbers generated as bins (decoded to values here)
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
    ) -> DPKernelGenerator:
        """The sampler from saved `ema.*` tensors (if the run kept an EMA), else
        `generator.*`."""
        net = build_network(info, config)
        prefix = "ema." if any(k.startswith("ema.") for k in tensors) else "generator."
        net.load_state_dict(generator_weights(tensors, prefix))
        return cls(
            net,
            info.classes,
            device,
            info.modality,
            sample_truncation(config),
            number_bins(info, config),
        )

    @torch.no_grad()
    def sample(
        self, labels: torch.Tensor, batch_size: int, generator: torch.Generator
    ) -> Iterator[torch.Tensor]:
        """Yield uint8 batches for `labels` in order; latents come from `generator`."""
        for start in range(0, int(labels.numel()), batch_size):
            chunk = labels[start : start + batch_size].to(torch.int64)
            z = draw_latent(chunk.numel(), self.net.latent_dim, generator, self.truncation)
            vectors = self.net(
                z.to(self.device),
                one_hot_or_none(chunk.to(self.device), self.net.num_classes),
            )
            if self.modality == "table":  # encoded rows; the codec decodes them
                yield (
                    vectors.float().cpu()
                    if self.bins is None
                    else self.bins.decode(vectors, generator)
                )
            else:
                yield to_uint8(vectors.reshape(-1, *self.shape)).cpu()


def generator_weights(
    tensors: Mapping[str, torch.Tensor], prefix: str = "generator."
) -> dict[str, torch.Tensor]:
    """The saved tensors under `prefix` (`generator.` or `ema.`), the prefix cut off."""
    return {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}
