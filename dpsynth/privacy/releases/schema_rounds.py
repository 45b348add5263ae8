"""The three rounds of the DP schema release, run on whatever counts the rows (an engine's
passes, or the rows in memory).

Each round's histograms are fixed by the round before's noisy output only, and their noise
by the plan (`schema_plan`), before any row is read:

1. round 1 (`release_ranges_from_counts`): the category lists and each number's rough range;
2. round 2: each number with a range counted on a finer grid and its padding trimmed
   (`release_spans_from_counts`); each number without one counted over the range grid again
   (`release_second_looks`), at the same noise;
3. round 3 (`release_shapes_from_counts`): the shapes inside the spans (a number found by the
   second look is trimmed here), the booleans and the decimals.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import torch

from dpsynth.privacy.releases.schema_concentration import (
    FINE_CORE_BINS,
    FINE_CORE_VALUES,
    QUIET_SHARE,
    narrow_core,
)
from dpsynth.privacy.releases.schema_counts import RangeCounts, ShapeCounts
from dpsynth.privacy.releases.schema_edges import (
    SpanRequest,
    beyond_range,
    release_spans_from_counts,
)
from dpsynth.privacy.releases.schema_grids import coarser_than_unit, fine_grid
from dpsynth.privacy.releases.schema_plan import NumberSpec, SchemaReleasePlan
from dpsynth.privacy.releases.schema_ranges import RangeRelease, release_ranges_from_counts
from dpsynth.privacy.releases.schema_release import (
    ReleasedShape,
    ShapeRequest,
    fine_bins,
    release_shapes_from_counts,
    shape_grid,
)
from dpsynth.privacy.releases.schema_second_look import (
    release_second_looks,
    second_look_grid,
)


@dataclass(frozen=True)
class ReleasedRounds:
    """What the three rounds released: round 1's output; each number with a range (from round
    1 or round 2's second look) and its shape; the share of its values estimated beyond its
    range and that estimate's deviation; the numbers the second look found; and the numbers
    whose range is the last resort's guess (no bin or window of the range grid cleared the
    noise: their values may be drawn far from the real ones)."""

    first: RangeRelease
    ranges: dict[str, tuple[float, float]]
    shapes: dict[str, ReleasedShape]
    clipped: dict[str, float]
    clipped_deviation: dict[str, float]
    second_looks: tuple[str, ...] = ()
    guessed: tuple[str, ...] = ()


def _round_two_grid(
    spec: NumberSpec,
    span: tuple[float, float],
    plan: SchemaReleasePlan,
    core: tuple[float, float] | None,
) -> tuple[np.ndarray, bool]:
    """Round 2's grid over a padded range (`shape_grid`), and whether it is FINE_CORE_BINS
    even bins instead: for whole numbers binned coarser than their unit whose range before
    padding lies in one magnitude over at least FINE_CORE_VALUES values (`narrow_core`), where
    the round's noise is below QUIET_SHARE of the rows (public: the plan, N and round 1's
    noisy output). Years 1992–1998 padded to 363–8192 were counted in bins of 327 years, so
    round 3 could only count the two that held them in bins of 6 (drawn over 1989–2000); in
    bins of 15, round 3 counts a year a bin. Only where it is quiet: at a louder noise a mode
    some decades off (ames' remodelling years, 12% at 1950) hides in it, and a span of a few
    fine bins would clip it (coarse bins hold it)."""
    grid = shape_grid(spec, span, plan)
    quiet = plan.span_noise_std <= QUIET_SHARE * plan.rows
    if spec.kind != "integer" or not quiet or not coarser_than_unit(grid) or not narrow_core(core):
        return grid, False
    assert core is not None
    if core[1] - core[0] < FINE_CORE_VALUES:  # ages 32–64 keep their bins of two
        return grid, False
    return fine_grid(span[0], span[1], spec.kind, FINE_CORE_BINS), True


def release_rounds(
    specs: Mapping[str, NumberSpec],
    plan: SchemaReleasePlan,
    generator: torch.Generator,
    count_ranges: Callable[[], RangeCounts],
    count_spans: Callable[[Mapping[str, np.ndarray]], ShapeCounts],
    count_shapes: Callable[[Mapping[str, np.ndarray]], ShapeCounts],
    target: str | None = None,
) -> ReleasedRounds:
    """The release's three rounds (the module docstring) on the counts the callables make:
    round 1's, then rounds 2 and 3 over the grids (per number) the round before fixed."""
    first = release_ranges_from_counts(count_ranges(), specs, plan, generator, target=target)
    found = {name: r for name, r in first.ranges.items() if r is not None}
    unfound = {name: specs[name] for name, r in first.ranges.items() if r is None}
    # round 2: each padded range on a finer grid; the range grid again where none was found
    grids, fine_core = {}, {}
    for name, span in found.items():
        grids[name], fine_core[name] = _round_two_grid(specs[name], span, plan, first.cores[name])
    grids.update({name: second_look_grid(spec) for name, spec in unfound.items()})
    counted = count_spans(grids)
    spans = release_spans_from_counts(
        counted,
        {
            name: SpanRequest(
                specs[name],
                grids[name],
                beyond_range(first.range_counts[name], specs[name].kind, span),
                first.cores[name],
                fine_core[name],
            )
            for name, span in found.items()
        },
        plan,
        generator,
    )
    looks = release_second_looks(counted, unfound, first, plan, generator)
    # round 3: the shapes inside the trimmed spans (their own fine grids, whole numbers one a
    # bin when few, a linear grid's bins inside its range before padding), or inside the second
    # look's padded range (trimmed here). Round 2 keeps its even grid: its trims read the
    # padding in fine bins (on the range grid's coarse ones they clipped more: loanapp's
    # ranges clipping > 2% went from 11.0 to 12.3 a release)
    requests: dict[str, ShapeRequest] = {}
    for name in specs:
        spec = specs[name]
        if name in found:
            span = spans[name]
            readings = ((first.missing[name], plan.range_noise_std),)
            readings += ((span.missing, plan.span_noise_std),)
            few = span.concentrated and span.few
            if span.concentrated and not span.few:  # a spread of decades: bins of a few years
                bins = fine_bins(plan.rows, plan.shape_noise_std)
                grid = fine_grid(span.span[0], span.span[1], spec.kind, bins)
            else:
                grid = shape_grid(spec, span.span, plan, span.concentrated, first.cores[name])
            requests[name] = ShapeRequest(
                spec,
                grid,
                core=first.cores[name],
                missing_readings=readings,
                concentrated=few,
                reach=found[name] if plan.reach_ends else None,
            )
        elif (look := looks[name]).range is not None:
            grid = shape_grid(spec, look.range, plan, core=look.core)
            requests[name] = ShapeRequest(
                spec,
                grid,
                trim=True,
                core=look.core,
                beyond=beyond_range(look.counts, spec.kind, look.range),
                beyond_std=look.noise_std,
                missing_readings=((look.missing, look.noise_std),),
                reach=look.range if plan.reach_ends else None,
            )
    shapes = release_shapes_from_counts(
        count_shapes({name: request.grid for name, request in requests.items()}),
        requests,
        plan,
        generator,
    )
    ranges = dict(found)
    clipped = {name: spans[name].clipped for name in found}
    deviation = {name: spans[name].clipped_deviation for name in found}
    for name in found:  # a range whose end bins reach past round 2's span clips less
        edges, reading = shapes[name].edges, spans[name].reading
        low, high = spans[name].span
        if edges is not None and reading is not None and (edges[0] < low or edges[-1] > high):
            clipped[name], deviation[name] = reading.share(edges[0], edges[-1])
    second = tuple(name for name in requests if name not in found)
    for name in second:
        look_range = looks[name].range
        assert look_range is not None  # requested because the second look found it
        ranges[name] = look_range
        clipped[name] = shapes[name].clipped or 0.0
        deviation[name] = shapes[name].clipped_deviation
    guessed = tuple(
        name
        for name in requests
        if name in first.guessed or (name in second and looks[name].guessed)
    )
    return ReleasedRounds(first, ranges, shapes, clipped, deviation, second, guessed)
