"""Poisson subsampling: the batches of DP-SGD and its relatives, drawn from a secret stream.

The accountant's `PoissonGaussian` event assumes exactly this: each record joins each batch
independently with probability q, so batch sizes vary and an empty batch is possible.
"""

from __future__ import annotations

import torch
from torch import Tensor

from dpsynth.errors import UsageError


class PoissonSampler:
    """Poisson subsampling: each of `n` records joins each batch independently with prob q."""

    def __init__(self, n: int, sampling_rate: float, generator: torch.Generator) -> None:
        if n < 0:
            raise UsageError(f"record count must be ≥ 0, got {n}")
        if not 0.0 <= sampling_rate <= 1.0:
            raise UsageError(f"sampling rate must be in [0, 1], got {sampling_rate}")
        self.n = int(n)
        self.sampling_rate = float(sampling_rate)
        self.generator = generator

    def next(self) -> torch.LongTensor:
        """The next batch: sorted int64 indices (on the generator's device); may be empty."""
        # float64 draws: with float32 both the draw grid (2^-24) and q itself (rounded to
        # float32) could make the realised rate exceed the q the accountant was given.
        draws = torch.rand(
            self.n, generator=self.generator, device=self.generator.device, dtype=torch.float64
        )
        return torch.nonzero(draws < self.sampling_rate).flatten()

    def state(self) -> Tensor:
        """The generator state (a uint8 CPU tensor) for an exact resume."""
        return self.generator.get_state()

    def load_state(self, state: Tensor) -> None:
        """Restore a state from `state()`; the following batches repeat the saved sequence."""
        self.generator.set_state(state.to("cpu", torch.uint8))


class UnitPoissonSampler(PoissonSampler):
    """Poisson subsampling of privacy units: each unit joins each batch independently with
    probability q, all its rows together (user-level DP-SGD). `units` [N] holds each row's
    unit index in 0 … U − 1; `next` returns the rows of the units drawn, sorted. The
    accountant's `PoissonGaussian` event then holds per unit, once a unit's rows together move
    the clipped sum by at most C (each row clipped to C / K for at most K rows a unit)."""

    def __init__(self, units: Tensor, sampling_rate: float, generator: torch.Generator) -> None:
        units = torch.as_tensor(units, dtype=torch.int64).flatten()
        count = int(units.max()) + 1 if units.numel() else 0
        super().__init__(count, sampling_rate, generator)
        self.units = units.to(generator.device)

    def next(self) -> torch.LongTensor:
        """The rows of the next batch's units: sorted int64 indices; may be empty."""
        drawn = super().next()
        chosen = torch.zeros(self.n, dtype=torch.bool, device=self.units.device)
        chosen[drawn] = True
        return torch.nonzero(chosen[self.units]).flatten()


def batch_sampler(
    n: int, sampling_rate: float, generator: torch.Generator, units: Tensor | None = None
) -> PoissonSampler:
    """The loop's sampler: of records, or of privacy units when `units` (each row's unit
    index) is given."""
    if units is None:
        return PoissonSampler(n, sampling_rate, generator)
    return UnitPoissonSampler(units, sampling_rate, generator)
