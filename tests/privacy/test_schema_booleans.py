"""A boolean's missing flag in a wide table's DP schema release: a column with no empty cell is
rarely flagged (each false flag puts phantom empty cells in the synthetic rows), and one with
a fifth of its cells empty keeps its flag."""

from __future__ import annotations

import numpy as np
import torch

from dpsynth.privacy.releases.schema_plan import NumberSpec, plan_schema_release
from dpsynth.privacy.releases.schema_release import release_shapes

ROWS = 1300


def _flags(codes: np.ndarray, releases: int) -> int:
    """How many of `releases` flag the boolean missing, at nhefs' noise (1,300 rows, 38
    numbers and 25 booleans released at ε = 0.7)."""
    specs = {f"c{i}": NumberSpec("integer") for i in range(38)}
    plan = plan_schema_release(0.7, 1e-5, ROWS, 2, specs, 25)
    flagged = 0
    for seed in range(releases):
        generator = torch.Generator().manual_seed(seed)
        shape = release_shapes({}, {"b": codes}, plan, generator)["b"]
        flagged += shape.missing
    return flagged


def test_a_boolean_without_empty_cells_is_rarely_flagged_missing() -> None:
    codes = np.random.default_rng(0).integers(0, 2, ROWS)  # 0 false, 1 true
    assert _flags(codes, 400) <= 8  # about 0.6%; 1.5 deviations flagged 6.7%


def test_a_boolean_with_a_fifth_of_its_cells_empty_keeps_its_flag() -> None:
    codes = np.random.default_rng(1).integers(0, 2, ROWS)
    codes[np.random.default_rng(2).random(ROWS) < 0.2] = 2  # missing
    assert _flags(codes, 100) >= 95
