"""What every run's records offer the training layer, whoever holds or counts them.

Images and tables read into memory (`ImageData`, `TableData`) and a table counted out of core
by an engine (`TableSource`: DuckDB, Dask) are one kind of thing to `training.start`,
`training.resume` and the loop: records with N, a content digest, a public description, the
rows the loop hands over (none for an engine), the units the loop samples, a way to give a
trainer what it counts with, and something to close. Rows in memory are the `memory` engine:
the loop hands their rows to the trainer, which counts them itself; an out-of-core engine gives
a marginal trainer its counter instead (`attach_to`), and holds no rows.
"""

from __future__ import annotations

from typing import Protocol

import torch

from dpsynth.data.images import DataInfo

# The engine that holds its rows (images, a table read in memory).
MEMORY_ENGINE = "memory"


class Records(Protocol):
    """A run's records (see the module)."""

    spec: str
    dataset_id: str
    x: torch.Tensor  # the rows the loop hands over (no rows for an engine's source)
    y: torch.Tensor

    @property
    def engine(self) -> str:
        """Who counts the rows: `memory`, or the out-of-core engine's spec."""
        ...

    @property
    def rows_in_memory(self) -> bool:
        """Whether the rows are held here (an engine's source counts them, never holds them)."""
        ...

    @property
    def n(self) -> int:
        """N, the records the run trains on."""
        ...

    @property
    def content_digest(self) -> str:
        """The records' plain digest (in memory only: it is a membership test)."""
        ...

    @property
    def sampling_units(self) -> torch.Tensor | None:
        """Each row's unit index when a unit keeps more than one row (the loop then samples
        units), else None (rows are sampled, each its own unit)."""
        ...

    def info(self, fingerprint: str = "") -> DataInfo:
        """The public description, with the ledger's keyed `fingerprint`."""
        ...

    def as_float(self) -> torch.Tensor:
        """The rows on the generators' scale."""
        ...

    def attach_to(self, trainer: object, method: str) -> None:
        """Give `trainer` what it counts with, when that is not the rows the loop hands over
        (UsageError, exit 2, for a trainer that needs rows an engine does not hold)."""
        ...

    def close(self) -> None:
        """Release what holds the records open (an engine's connection or cluster client)."""
        ...
