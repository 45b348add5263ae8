"""A number's missing flag in a wide table's DP schema release is read from every round's
count of its empty cells: a column with no empty cell is rarely flagged (each false flag makes
the model write empty cells where the rows have none: caravan, with no empty cell, had four
flagged numbers a release), and one with a tenth of its cells empty keeps its flag."""

from __future__ import annotations

import numpy as np

from tests.privacy.test_schema_ranges import _released_entry, _wide_plan

ROWS = 1303


def _flags(values: np.ndarray, releases: int) -> int:
    """How many of `releases` flag the number missing, at nhefs' noise (1,303 rows of a
    40-number table at ε = 1)."""
    plan = _wide_plan(ROWS, numbers=40)
    return sum(
        bool(_released_entry(values, "integer", plan, seed).missing) for seed in range(releases)
    )


def test_a_number_without_empty_cells_is_rarely_flagged_missing() -> None:
    values = np.random.default_rng(0).integers(20, 80, ROWS).astype(float)
    assert _flags(values, 300) <= 11  # 6 of 300; round 3's count alone at 1.5 deviations: 16


def test_a_number_with_a_tenth_of_its_cells_empty_keeps_its_flag() -> None:
    values = np.random.default_rng(1).integers(20, 80, ROWS).astype(float)
    values[np.random.default_rng(2).random(ROWS) < 0.1] = np.nan
    assert _flags(values, 100) >= 97  # 99 of 100; round 3's count alone: 94
