"""The sampling half of the backend interface (`methods.base` re-exports it): the `Generator`
a trained run samples with, the saved state it is rebuilt from, and the latent helpers of the
generators that draw one.

A generator never touches data: `sample` yields batches of uint8 images, or for a table
(`DataInfo.modality == "table"`) batches of encoded rows float32 [b, D], which
`dpsynth.data.table_codec.TableCodec` decodes back to the CSV's columns.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from dpsynth.data.images import DataInfo
from dpsynth.errors import DpsynthError, UsageError


@dataclass(frozen=True)
class GeneratorState:
    """What rebuilds a run's generator: the data's public description, the run's config, the
    tensors its trainer saved (`Trainer.state_tensors`) and the device to sample on."""

    info: DataInfo
    config: Mapping[str, Any]
    tensors: Mapping[str, torch.Tensor]
    device: torch.device

    def under(self, prefix: str) -> dict[str, torch.Tensor]:
        """The saved tensors whose names start with `prefix`, the prefix cut off."""
        return saved_under(self.tensors, prefix)


class Generator(ABC):
    """A trained generator that can be sampled without any private data."""

    classes: tuple[str, ...]
    shape: tuple[int, int, int]
    # Where sampling runs; the caller's random generator must live on the same device.
    device: torch.device
    # The scale of the latent z ~ N(0, t²I) for generators that draw one (the "truncation
    # trick"; post-processing, no privacy cost); None for those without a latent (pge, psg).
    truncation: float | None = None

    @abstractmethod
    def sample(
        self, labels: torch.Tensor, batch_size: int, generator: torch.Generator
    ) -> Iterator[torch.Tensor]:
        """Yield uint8 image batches [b, C, H, W] for `labels` (int64 [n]), in order; for a
        table, encoded rows float32 [b, D] (one-hot blocks in [0, 1], numbers in [-1, 1]).

        Each batch has at most `batch_size` records.
        """

    @classmethod
    def from_state(cls, state: GeneratorState) -> Generator:
        """This generator rebuilt from a run's saved tensors (as its trainer's
        `state_tensors` wrote them); `Method.generator_from_state` calls it."""
        raise DpsynthError(f"{cls.__name__} cannot be rebuilt from saved tensors")

    def release_details(self, counts: Sequence[int]) -> dict[str, Any]:
        """Method-specific facts about serving `counts[c]` records of each class c, for the
        sample manifest ({} if none)."""
        return {}


def saved_under(tensors: Mapping[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """The tensors whose names start with `prefix`, the prefix cut off."""
    return {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}


def draw_latent(
    count: int, latent_dim: int, generator: torch.Generator, scale: float
) -> torch.Tensor:
    """`count` latents N(0, scale²I) drawn from `generator`, on the generator's own device (a
    CPU tensor cannot be drawn from a CUDA generator)."""
    z = torch.randn(count, latent_dim, generator=generator, device=generator.device)
    return z if scale == 1.0 else scale * z


def latent_batches(
    labels: torch.Tensor, batch_size: int, latent_dim: int, generator: torch.Generator, scale: float
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """`labels` (int64) in chunks of at most `batch_size`, in order, each with its latents
    (`draw_latent`: one draw a chunk, from `generator`)."""
    for start in range(0, int(labels.numel()), batch_size):
        chunk = labels[start : start + batch_size].to(torch.int64)
        yield chunk, draw_latent(chunk.numel(), latent_dim, generator, scale)


def check_truncation(value: float, option: str) -> float:
    """`value` as a latent scale in (0, 4] (UsageError naming `option` otherwise)."""
    if not 0 < float(value) <= 4:
        raise UsageError(f"{option}: must be in (0, 4], got {value}")
    return float(value)


def sample_truncation(config: Mapping[str, Any]) -> float:
    """The run's sampler latent scale (`sample_truncation`; 1 for runs saved without it)."""
    return float(config.get("sample_truncation", 1.0))
