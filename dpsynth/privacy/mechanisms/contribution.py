"""Contribution bounding: at most K rows per privacy unit, chosen with secret randomness.

A data owner's table often holds people, not rows: a patient with several tests, a customer
with several orders. DP over rows then protects one test, not the patient. With a privacy
unit (a column naming the person) and a public bound K, every unit keeps at most K of its
rows before any mechanism reads the table; each mechanism's sensitivity is then scaled for K
rows (`UnitBound.max_rows`), so the run's guarantee holds per unit: adding or removing
one person (with all their rows) changes what the mechanisms see by at most K rows.

Which K rows a unit keeps is drawn uniformly from the run's secret stream (never the first
K in file order, which an adversary who knows the file could predict, and never the public
seed). The choice is replayed identically whenever the run reads its data again (a resume:
`PrivateRandomness.replayable`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from dpsynth.errors import DpsynthError, UsageError


@dataclass(frozen=True)
class UnitBound:
    """A privacy unit: the column naming it and the most rows one unit may hold (public)."""

    column: str
    max_rows: int

    def __post_init__(self) -> None:
        if not isinstance(self.max_rows, int) or self.max_rows < 1:
            raise UsageError(
                f"{{max_rows_per_unit}} must be a whole number ≥ 1, got {self.max_rows!r}",
                parameter="max_rows_per_unit",
            )

    def to_json(self) -> dict[str, object]:
        """A JSON-ready dict."""
        return {"column": self.column, "max_rows_per_unit": self.max_rows}


def bound_contributions(units: np.ndarray, max_rows: int, generator: torch.Generator) -> np.ndarray:
    """The indices (ascending) of the rows kept: at most `max_rows` per distinct value of
    `units`, each unit's kept rows a uniform draw among its rows from `generator` (secret)."""
    values = np.asarray(units, dtype=object)
    if values.ndim != 1:
        raise DpsynthError("the unit column must be one value per row")
    if max_rows < 1:
        raise DpsynthError("a unit keeps at least one row")
    n = len(values)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    codes, _ = _factorize(values)
    # a uniform random key per row; sorting by (unit, key) puts each unit's rows in random
    # order, and the first max_rows of each unit are a uniform subset of its rows
    keys = torch.rand(n, generator=generator, dtype=torch.float64).numpy()
    order = np.lexsort((keys, codes))
    sorted_codes = codes[order]
    starts = np.flatnonzero(np.r_[True, sorted_codes[1:] != sorted_codes[:-1]])
    rank = np.arange(n) - np.repeat(starts, np.diff(np.r_[starts, n]))
    return np.sort(order[rank < max_rows]).astype(np.int64)


def rows_per_unit(units: np.ndarray) -> np.ndarray:
    """How many rows each distinct unit holds (one entry per unit, order unspecified)."""
    codes, count = _factorize(np.asarray(units, dtype=object))
    return np.bincount(codes, minlength=count).astype(np.int64)


def unit_indices(units: np.ndarray) -> np.ndarray:
    """Each row's unit as an index 0 … U − 1 (int64; equal values, equal indices)."""
    return _factorize(np.asarray(units, dtype=object))[0]


def _factorize(values: np.ndarray) -> tuple[np.ndarray, int]:
    """Integer codes of `values` (equal strings, equal codes) and the number of distinct ones."""
    uniques, codes = np.unique(values.astype(str), return_inverse=True)
    return codes.astype(np.int64), len(uniques)
