"""A number's end bins reach to round 1's padded range where rounds 2 and 3 trimmed it: the
values trimmed off are counted in the end bins anyway, and `sample` draws an end bin by a tail
falling away from its neighbour, so they are drawn near the rows instead of piled on a
cliff. nhefs' systolic pressures (89–229) were released as 95–166 in 20 releases of 20,
clipping 4.5% of them; every synthetic value stopped at 166."""

from __future__ import annotations

import numpy as np

from dpsynth.privacy.releases.schema_edges import Beyond, ClipReading
from dpsynth.privacy.releases.schema_release import reached_edges
from tests.privacy.test_schema_ranges import _released_entry, _wide_plan


def test_end_bins_stretch_to_the_padded_range_but_not_across_zero_or_a_point_mass() -> None:
    edges = (95.0, 107.0, 130.0, 166.0)
    assert reached_edges(edges, (23.0, 725.0), "integer") == (23.0, 107.0, 130.0, 725.0)
    assert reached_edges(edges, (23.4, 725.6), "integer") == (24.0, 107.0, 130.0, 725.0)
    # a positive range does not reach below 0, a negative one not above it
    assert reached_edges((2.5, 4.0, 9.0), (-6.0, 20.0), "numeric") == (0.0, 4.0, 20.0)
    assert reached_edges((-9.0, -4.0, -2.5), (-20.0, 6.0), "numeric") == (-20.0, -4.0, 0.0)
    # a point mass at an end (zeros held by many rows) keeps its place
    assert reached_edges((0.0, 0.0, 5.0, 9.0), (-6.0, 50.0), "numeric") == (0.0, 0.0, 5.0, 50.0)
    # beside a point mass only, an end bin would be drawn evenly: left as it is
    assert reached_edges((0.0, 0.0, 6.0), (-6.0, 50.0), "numeric") == (0.0, 0.0, 6.0)
    # times and one-bin ranges are left as they are
    assert reached_edges(edges, (23.0, 725.0), "date") == edges
    assert reached_edges((1.0, 2.0), (0.0, 9.0), "numeric") == (1.0, 2.0)


def _pressures(rows: int, rng: np.random.Generator) -> np.ndarray:
    """Pressures around 128 with 5% of the rows in a thin upper tail up to 229."""
    body = np.round(np.clip(rng.normal(128, 16, rows), 89, 168))
    tail = rng.random(rows) < 0.05
    body[tail] = np.round(170 + 59 * rng.random(tail.sum()) ** 2)
    return body


def test_a_thin_tail_trimmed_by_the_noise_is_inside_the_released_range() -> None:
    """1,303 rows among 38 numbers at ε = 1 (nhefs): the release's range holds at least 98% of
    the values in 8 releases of 10, and the clipped share it estimates stays small."""
    rng = np.random.default_rng(3)
    values = _pressures(1303, rng)
    plan = _wide_plan(len(values), "integer", numbers=38)
    held, estimates = [], []
    for seed in range(10):
        release = _released_entry(values, "integer", plan, seed, whole=True)
        column = release.schema.columns[0]
        inside = np.mean((values >= column.min) & (values <= column.max))
        held.append(round(float(inside), 3))
        # the share `train` prints is read for the released range, not round 2's span
        estimates.append(release.clipped["x"] - 2 * release.clipped_deviation["x"])
    assert sum(h >= 0.98 for h in held) >= 8, held
    assert sum(e <= 0.02 for e in estimates) >= 8, estimates


def test_codes_held_a_value_a_bin_keep_their_ends(monkeypatch) -> None:
    """Codes 1–5 (a value a bin, 5% at 5) are released as without the reach: stretched over
    the padding, a last code's bin would be drawn as codes no row holds (caravan's and
    loanapp's codes: up to 45% of the draws outside the real range)."""
    from dpsynth.privacy.releases import schema_release

    rng = np.random.default_rng(4)
    codes = rng.choice([1.0, 2.0, 3.0, 4.0, 5.0], size=1303, p=[0.4, 0.3, 0.15, 0.1, 0.05])
    plan = _wide_plan(len(codes), "integer", numbers=38)
    pressures = _pressures(1303, rng)
    reached = [_released_entry(v, "integer", plan, 1) for v in (codes, pressures)]
    monkeypatch.setattr(schema_release, "reached_edges", lambda edges, reach, kind: edges)
    kept = [_released_entry(v, "integer", plan, 1) for v in (codes, pressures)]
    assert reached[0].edges == kept[0].edges
    assert reached[1].max > kept[1].max  # the same seed reaches for pressures


def test_the_clipped_share_is_read_for_the_range_released() -> None:
    """`ClipReading.share`: the mass of the fine bins a range leaves out, plus round 1's mass
    beyond the padded range where the range reaches its end (exact counts here, no noise)."""
    fine = np.array([5.0, 15.0, 30.0, 30.0, 10.0, 5.0, 3.0, 2.0, 0.0, 0.0])
    grid = np.arange(11, dtype=np.float64)
    reading = ClipReading(fine, grid, Beyond(0.0, 4.0, 8, 8), 100.0, 1.0, 1.0, unit=1.0)
    share, _ = reading.share(2.0, 5.0)  # leaves out bins 0, 1 and 6–9
    assert np.isclose(share, (5 + 15 + 3 + 2) / 100.0), share
    share, _ = reading.share(0.0, 9.0)  # the whole padded range: round 1's 4 beyond it
    assert np.isclose(share, 4 / 100.0), share
    floats = ClipReading(fine, grid, Beyond(0.0, 0.0, 8, 8), 100.0, 1.0, 1.0)
    assert np.isclose(floats.share(1.0, 10.0)[0], 5 / 100.0)


def test_only_methods_that_draw_end_bins_by_tails_get_the_reach() -> None:
    """dpkernel and rdpgan scale a number by its range (a wide one costs them resolution:
    loans at ε = 1, dpkernel's 2-way TVD 0.425 → 0.461), so their releases keep the span's
    ends; mst and aim draw end bins by tails."""
    from dataclasses import replace

    from dpsynth.methods.registry import get_method

    assert get_method("mst").draws_end_tails and get_method("aim").draws_end_tails
    assert not get_method("dpkernel").draws_end_tails
    assert not get_method("rdpgan").draws_end_tails
    values = _pressures(1303, np.random.default_rng(3))
    plan = _wide_plan(len(values), "integer", numbers=38)
    reached = _released_entry(values, "integer", plan, 1)
    kept = _released_entry(values, "integer", replace(plan, reach_ends=False), 1)
    assert kept.max < reached.max and kept.edges[1:-1] == reached.edges[1:-1]
