"""Synthetic people: the rows of a table sampled from a run with a privacy unit, grouped into
synthetic units with fresh keys.

A run with `--privacy-unit COLUMN` released the share of units holding 1, 2, …, K rows with
DP (`config.json`'s `privacy_unit.unit_sizes`). Sampling draws unit sizes from those shares
with the public seed and gives consecutive rows (already in random order) one key per unit:
the id prefix and the unit's number (`syn-1`, `syn-2`, … in a file; a partition numbers its
units on from its first row's number, so keys are unique across partitions without any
coordination), never a real key. Rows of one synthetic unit are drawn independently: the
release reproduces how many rows people hold, not how a person's rows relate to each other.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

# The spawn key of the unit sizes' stream beside the seed ("unit" in ASCII).
_UNIT_KEY = 0x756E6974


class UnitKeys:
    """The unit key of each next row of a release (or of one partition), in order."""

    def __init__(self, shares: Sequence[float], seed: int, prefix: str, first_row: int = 0):
        probabilities = np.clip(np.asarray(shares, dtype=np.float64), 0.0, None)
        if probabilities.size == 0 or probabilities.sum() <= 0:
            probabilities = np.ones(1)
        self._shares = probabilities / probabilities.sum()
        sequence = np.random.SeedSequence(entropy=int(seed) % 2**128, spawn_key=(_UNIT_KEY,))
        self._rng = np.random.default_rng(sequence)
        self._prefix = prefix
        self._row = int(first_row)  # the release's row number of the next row (0-based)
        # units are numbered on from the first row's number: a partition of R rows holds at
        # most R units, so the keys of consecutive partitions never meet
        self._first, self._units = int(first_row), 0
        self._left = 0  # rows the current unit still takes
        self._key = ""

    def next(self, count: int) -> np.ndarray:
        """The keys of the next `count` rows (object array of strings)."""
        keys = np.empty(count, dtype=object)
        done = 0
        while done < count:
            if self._left == 0:
                self._left = int(self._rng.choice(len(self._shares), p=self._shares)) + 1
                self._units += 1
                self._key = f"{self._prefix}{self._first + self._units}"
            take = min(self._left, count - done)
            keys[done : done + take] = self._key
            done += take
            self._row += take
            self._left -= take
        return keys


@dataclass(frozen=True)
class UnitSpec:
    """A run's privacy unit as sampling needs it: the column, the DP shares of units with
    1 … K rows, and the column's key prefix."""

    column: str
    shares: tuple[float, ...]
    prefix: str

    def keys(self, seed: int, first_row: int = 0) -> UnitKeys:
        """The unit keys of a release (or a partition) from its public seed and first row."""
        return UnitKeys(self.shares, seed, self.prefix, first_row)

    def to_json(self) -> dict[str, Any]:
        """What a sample's manifest says of its synthetic people."""
        return {"column": self.column, "rows_per_unit_shares": list(self.shares)}


def units_of(run_config: Mapping[str, Any], schema_json: Mapping[str, Any]) -> UnitSpec | None:
    """The run's privacy unit for sampling (None: the run's unit is a row)."""
    from dpsynth.data.schema import DEFAULT_ID_PREFIX

    unit = run_config.get("privacy_unit")
    if not unit:
        return None
    column = str(unit["column"])
    prefix = next(
        (
            str(entry.get("prefix") or DEFAULT_ID_PREFIX)
            for entry in schema_json.get("columns", [])
            if entry.get("name") == column
        ),
        DEFAULT_ID_PREFIX,
    )
    shares = tuple(float(x) for x in (unit.get("unit_sizes") or [1.0]))
    return UnitSpec(column, shares, prefix)
