"""The conditional-latent sampler of dpaf, rdpgan and dpkernel: a trained network
G(z, onehot(y)) whose latent z ~ N(0, t²I) is drawn from the caller's generator, t the run's
`sample_truncation` (or `sample --truncation`; post-processing, no privacy cost).

A backend's sampler subclasses `LatentGenerator` and names its network builder
(`build_net(info, config)`, the same the trainer builds G with); the rest is shared: the
sampler over a copy of G's weights (`loaded`, for `Trainer.own_generator`), rebuilt from a
run's saved tensors (`from_state`, under `saved_prefix`), and the batches of `sample`: uint8
images, or for a table the encoded rows that `sample_table` decodes.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, ClassVar, Self

import torch
from torch import nn
from torch.nn import functional as F

from dpsynth.data.images import DataInfo, to_uint8
from dpsynth.methods.base import Generator, GeneratorState, latent_batches, sample_truncation


def one_hot_labels(labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Float one-hot rows [b, K] of class indices (the networks' label input)."""
    return F.one_hot(labels, num_classes).float()


class ConditionalNet(nn.Module):
    """A conditional generator network G(z, onehot(y)) → records of `shape`, with the facts
    `LatentGenerator` samples it by: `latent_dim` and `num_classes` (0: unconditional)."""

    def __init__(self, shape: Sequence[int], num_classes: int, latent_dim: int) -> None:
        super().__init__()
        self.shape = tuple(int(s) for s in shape)
        self.num_classes = num_classes
        self.latent_dim = latent_dim


class LatentGenerator(Generator):
    """Samples records from a trained `ConditionalNet` `net`, its latent at scale
    `truncation`."""

    # Where the generator's weights are in a run's saved tensors.
    saved_prefix: ClassVar[str] = "generator."

    def __init__(
        self,
        net: ConditionalNet,
        classes: tuple[str, ...],
        device: torch.device,
        modality: str = "image",
        truncation: float = 1.0,
    ) -> None:
        self.net = net.to(device).eval()
        self.truncation = float(truncation)
        self.modality = modality
        self.classes = tuple(classes)
        self.shape = tuple(net.shape)  # type: ignore[assignment]
        self.device = device

    @staticmethod
    @abstractmethod
    def build_net(info: DataInfo, config: Mapping[str, Any]) -> ConditionalNet:
        """A new network G for this data's shape and labels and the run's config."""

    @classmethod
    def run_options(cls, info: DataInfo, config: Mapping[str, Any]) -> dict[str, Any]:
        """Further constructor arguments that follow from the run (default: none)."""
        return {}

    @classmethod
    def loaded(
        cls,
        weights: Mapping[str, torch.Tensor],
        info: DataInfo,
        config: Mapping[str, Any],
        device: torch.device,
    ) -> Self:
        """The sampler over a new G of the run loaded with `weights` (a copy: the trainer's
        own G keeps training)."""
        net = cls.build_net(info, config)
        net.load_state_dict(weights)
        truncation = sample_truncation(config)
        options = cls.run_options(info, config)
        return cls(net, info.classes, device, info.modality, truncation, **options)

    @classmethod
    def weights_prefix(cls, tensors: Mapping[str, torch.Tensor]) -> str:
        """The prefix of the weights to sample with among the saved tensors."""
        return cls.saved_prefix

    @classmethod
    def from_state(cls, state: GeneratorState) -> Self:
        """The sampler from the saved tensors under `weights_prefix`."""
        weights = state.under(cls.weights_prefix(state.tensors))
        return cls.loaded(weights, state.info, state.config, state.device)

    def label_input(self, labels: torch.Tensor) -> torch.Tensor | None:
        """G's label input: one-hot rows, or None for an unconditional G."""
        classes = int(self.net.num_classes)
        return one_hot_labels(labels, classes) if classes else None

    def records(self, out: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """G's outputs as the batch `sample` yields: uint8 images on the CPU, or a table's
        encoded rows (float32; `sample_table` decodes them)."""
        if self.modality == "table":
            return out.float().cpu()
        return to_uint8(out.reshape(-1, *self.shape)).cpu()

    @torch.no_grad()
    def sample(
        self, labels: torch.Tensor, batch_size: int, generator: torch.Generator
    ) -> Iterator[torch.Tensor]:
        """Yield batches for `labels` in order; latents come from `generator`."""
        latent_dim = int(self.net.latent_dim)
        for chunk, z in latent_batches(labels, batch_size, latent_dim, generator, self.truncation):
            out = self.net(z.to(self.device), self.label_input(chunk.to(self.device)))
            yield self.records(out, generator)
