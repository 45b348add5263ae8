"""Round 3 of the DP schema release puts a number's fine bins where round 1 found its values: a
range kept wide by its padding (where the noise can hide a tail) is not cut into even bins
over the padding. labor-market's log incomes, 8.8–11.1, kept as 7.4–43, were drawn over two
model bins of 1.5 (mst at ε = 1, three secret seeds: one-way TVD on the held-out rows 0.32
before, 0.13 now)."""

from __future__ import annotations

import numpy as np

from dpsynth.privacy.releases.schema_grids import fine_grid, range_grid
from tests.privacy.test_schema_ranges import _released_entry, _wide_plan


def test_a_floats_fine_bins_go_inside_its_range_before_padding() -> None:
    core = (8.0, 2.0**3.5)  # one bin of the range grid: [8, 11.3)
    grid = fine_grid(7.41, 43.45, "numeric", 16, core)
    assert grid[0] == 7.41 and grid[-1] == 43.45 and np.all(np.diff(grid) > 0)
    inside = np.sum((grid[:-1] >= core[0]) & (grid[1:] <= core[1] + 1e-9))
    assert inside >= 8, grid
    # the padding steps on the range grid's own edges
    padding = grid[(grid > core[1] + 1e-9) & (grid < 43.45)]
    assert set(padding.tolist()) <= set(range_grid("numeric").tolist())
    # an even grid where the core is most of the range, and geometric bins for a range over
    # orders of magnitude, as before
    assert np.allclose(fine_grid(0.5, 1.5, "numeric", 8, (0.6, 1.4)), np.linspace(0.5, 1.5, 9))
    assert np.array_equal(
        fine_grid(0, 1e6, "numeric", 32, (1, 100)), fine_grid(0, 1e6, "numeric", 32)
    )


def test_whole_numbers_kept_wide_get_their_bins_inside_the_core() -> None:
    """Alcohol codes 0–5 released as −12–1027 (nhefs, ε = 1) were cut into bins of 65 and
    drawn up to 40; inside round 1's range before padding, [0, 6), they keep a bin a value.
    Whole numbers that fit one a bin keep that grid."""
    grid = fine_grid(-12, 1027, "integer", 16, (0.0, 6.0))
    assert np.all(grid == np.round(grid)) and grid[0] == -12 and grid[-1] == 1028
    assert set(range(7)) <= set(grid.tolist()), grid  # 0, 1, …, 6: a bin a value
    assert np.array_equal(fine_grid(0, 12, "integer", 16, (0, 6)), fine_grid(0, 12, "integer", 16))
    ages = fine_grid(8, 254, "integer", 16, (23.0, 91.0))  # nhefs' ages, 25–74, kept as 8–254
    assert np.sum((ages[:-1] >= 23) & (ages[1:] <= 91)) >= 8, ages


def test_a_log_income_kept_wide_by_its_padding_gets_model_bins_over_its_values() -> None:
    """Log incomes of 3,896 rows (8.8–11.1) among 22 floats at ε = 1: the model's bins inside
    the values' own range, in ten releases."""
    rng = np.random.default_rng(0)
    values = np.clip(rng.normal(10.0, 0.45, 3896), 8.8, 11.1)
    plan = _wide_plan(len(values), "numeric", numbers=22)
    counts = []
    for seed in range(10):
        column = _released_entry(values, "numeric", plan, seed)
        edges = np.asarray(column.edges)
        counts.append(int(np.sum((edges > 8.8) & (edges < 11.1))))
    assert sum(c >= 4 for c in counts) >= 8, counts
