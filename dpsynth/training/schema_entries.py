"""A table's schema entries read off the data, released with DP and written into the schema.

`plan_release` sorts the columns to release by what they need (a category list; a range,
edges, a missing flag and maybe a precision; a boolean's missing flag) and calibrates
`dpsynth.privacy.releases.schema_plan` for them; `apply_release` runs the two rounds of
`dpsynth.privacy.releases.schema_release` on the counts of whichever engine reads the rows
(`dpsynth.training.schema_counting` in memory) and returns the schema with the released
entries, each marked with its source. What becomes of a
column whose release found too little:
- a category list with no value above the threshold: only the `(other)` category; a list
  whose kept values leave no significant rest: no `(other)`, the rest merges into the
  commonest kept value (`catch_all`);
- a number with no range: ignored (written empty), and a warning to declare bounds;
- a missing flag not released although the file has empty cells: those cells are encoded at the
  middle of the range (a public rule, `dpsynth.data.column_values`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from dpsynth.data.column_values import RELEASED_PREFIX
from dpsynth.data.schema import MINUTES_PER_DAY, Column, Schema
from dpsynth.errors import UsageError
from dpsynth.privacy.releases.schema_counts import RangeCounts, ShapeCounts
from dpsynth.privacy.releases.schema_plan import (
    NumberSpec,
    SchemaReleasePlan,
    plan_schema_release,
)
from dpsynth.privacy.releases.schema_reach import epsilon_for_reach, release_reach
from dpsynth.privacy.releases.schema_release import (
    ReleasedShape,
)
from dpsynth.privacy.releases.schema_rounds import release_rounds
from dpsynth.training.release_notes import GUESSED_RANGE

OTHER = "(other)"
# A released list keeps its `(other)` category when N less the kept categories' noisy counts
# clears this many deviations of its noise (`catch_all`).
OTHER_Z = 2.0


@dataclass(frozen=True)
class ReleaseColumns:
    """The columns a release covers, by what it releases of them."""

    categorical: tuple[Column, ...]
    numbers: tuple[Column, ...]
    booleans: tuple[Column, ...]

    @property
    def names(self) -> list[str]:
        """Every released column's name."""
        return [c.name for c in (*self.categorical, *self.numbers, *self.booleans)]


def release_columns(schema: Schema) -> ReleaseColumns:
    """The schema's columns with entries read off the data. The target's label set, when read
    off the data, is a category list like the others: released through the threshold (a label
    held by a few rows does not survive), never published as drafted."""
    derived = [c for c in schema.columns if c.data_derived]
    return ReleaseColumns(
        tuple(c for c in derived if c.type == "categorical"),
        tuple(c for c in derived if c.is_numeric),
        tuple(c for c in derived if c.type == "boolean"),
    )


def number_spec(column: Column) -> NumberSpec:
    """What the release needs of a number or time column (its kind; decimals for floats)."""
    return NumberSpec(column.type, decimals=column.type == "numeric")


def plan_release(
    schema: Schema, rows: int, epsilon: float, delta: float, unit_rows: int = 1
) -> tuple[ReleaseColumns, SchemaReleasePlan]:
    """The columns to release and the release's calibrated plan (from public facts only:
    `rows` is N or the declared public size; `unit_rows` the rows a privacy unit may hold)."""
    columns = release_columns(schema)
    plan = plan_schema_release(
        epsilon,
        delta,
        rows,
        len(columns.categorical),
        {c.name: number_spec(c) for c in columns.numbers},
        len(columns.booleans),
        unit_rows=unit_rows,
        target=any(c.name == schema.target for c in columns.categorical),
    )
    return columns, plan


# A release is refused (before anything is spent) when a category value or a range bin would
# need more than this share of the rows to clear the noise: a list would keep at most its
# two or three commonest values, a number at best a crude range (cars, 324 rows at ε = 1
# with a need of 40% released 2-way TVD 0.98 against 0.29 for real rows). `epsilon_for_reach`
# then names the ε at which a value held by ADVICE_SHARE of the rows gets through.
REFUSE_SHARE = 0.25
ADVICE_SHARE = 0.1


def epsilon_needed(schema: Schema, rows: int, delta: float) -> float | None:
    """The ε at which `train`'s DP release of the schema's entries read off the data keeps the
    values held by ADVICE_SHARE of `rows` (inf: none does; None: nothing to release)."""
    columns = release_columns(schema)
    target = any(c.name == schema.target for c in columns.categorical)
    return _advised_epsilon(columns, rows, delta, target=target) if columns.names else None


def _advised_epsilon(
    columns: ReleaseColumns, rows: int, delta: float, unit_rows: int = 1, target: bool = False
) -> float:
    """The ε at which a release of `columns` keeps the values held by ADVICE_SHARE of `rows`."""
    return epsilon_for_reach(
        ADVICE_SHARE * rows,
        delta,
        rows,
        len(columns.categorical),
        {c.name: number_spec(c) for c in columns.numbers},
        len(columns.booleans),
        unit_rows,
        target,
    )


def check_reach(
    columns: ReleaseColumns, plan: SchemaReleasePlan, epsilon: float, default_share: float | None
) -> None:
    """UsageError when the planned release could keep hardly anything of some kind of column
    at this size (public facts only: nothing is read or spent). `default_share`: the share of the
    run's ε the release takes by default (None: the user gave its ε)."""
    specs = {c.name: number_spec(c) for c in columns.numbers}
    reach = release_reach(plan, len(columns.categorical), specs)
    rows = plan.rows
    lost = []
    if reach.category_rows is not None and reach.category_rows > REFUSE_SHARE * rows:
        lost.append(
            f"a category value needs about {reach.category_rows:,.0f} rows "
            f"(more than a quarter of them: {len(columns.categorical)} list(s) would keep "
            "hardly a value beyond '(other)')"
        )
    if reach.range_rows is not None and reach.range_rows > REFUSE_SHARE * rows:
        lost.append(
            f"a number's range needs about {reach.range_rows:,.0f} rows in one bin of its grid "
            f"({len(columns.numbers)} number(s) would be written empty or over a crude range)"
        )
    if not lost:
        return
    needed = _advised_epsilon(
        columns, rows, plan.delta, plan.unit_rows, plan.target_noise_std is not None
    )
    which = (
        f"the default {{schema_epsilon}} ({epsilon:.3g}, {default_share:.0%} of {{epsilon}})"
        if default_share is not None
        else f"{{schema_epsilon}} {epsilon:g}"
    )
    advice = (
        "a DP release of them keeps the values held by a tenth of the rows from "
        f"{{schema_epsilon}} {needed:.2g}"
        if math.isfinite(needed)
        else "no ε releases them usefully at this size"
    )
    raise UsageError(
        f"{which} is too small to release the schema entries read off the data from "
        f"{rows:,} rows: to clear the noise, {' and '.join(lost)}. Nothing was spent. Declare "
        "what you know from public sources (category lists, min and max) in the schema and "
        "delete their 'source' marks, or give {schema_public} if every marked entry is "
        f"public; {advice}",
        parameters=("schema_epsilon", "epsilon", "schema_public"),
    )


@dataclass(frozen=True)
class AppliedRelease:
    """The schema with the released entries, the release's warnings, per number the share of
    its values estimated beyond its released range (from the noisy counts), and each released
    column's noisy histogram (`ReleasedShape`, and for a category list its kept values' noisy
    counts) for the model to reuse as its 1-way measurement."""

    schema: Schema
    warnings: list[str]
    clipped: dict[str, float]
    shapes: dict[str, ReleasedShape]
    category_counts: dict[str, tuple[list[str], list[float]]]
    category_noise: dict[str, float]
    # the noise's deviation of each `clipped` estimate, in the same share
    clipped_deviation: dict[str, float] = field(default_factory=dict)
    # the numbers whose range round 2's second look found (round 1 found none)
    second_looks: tuple[str, ...] = ()


# The schema entries' release on some rows: (schema, columns, plan, generator, source) → the
# applied release (`apply_release` on the counts of whatever reads the rows: the rows held,
# `schema_counting.release_in_memory`, or an engine's passes, `engine_release.EngineRun`).
ReleaseRun = Callable[
    [Schema, ReleaseColumns, SchemaReleasePlan, torch.Generator, str], AppliedRelease
]


def apply_release(
    schema: Schema,
    columns: ReleaseColumns,
    plan: SchemaReleasePlan,
    generator: torch.Generator,
    source: str,
    count_ranges: Callable[[], RangeCounts],
    count_shapes: Callable[[Mapping[str, np.ndarray]], ShapeCounts],
    count_spans: Callable[[Mapping[str, np.ndarray]], ShapeCounts] | None = None,
) -> AppliedRelease:
    """Run the release's three rounds (`release_rounds`) on the counts the callables make
    (rounds 2 and 3 over the grids the round before fixed: a pass each, in memory or on an
    engine; `count_spans` counts round 2, `count_shapes` when not given), and write what they
    released into the schema."""
    assert source.startswith(RELEASED_PREFIX)
    target = schema.target if plan.target_noise_std is not None else None
    specs = {c.name: number_spec(c) for c in columns.numbers}
    rounds = release_rounds(
        specs,
        plan,
        generator,
        count_ranges,
        count_spans or count_shapes,
        count_shapes,
        target=target,
    )
    first, found, shapes = rounds.first, rounds.ranges, rounds.shapes
    categories = first.categories
    warnings: list[str] = []
    for column in columns.categorical:
        kept = categories[column.name]
        if column.name == schema.target:
            schema = _released_labels(schema, column, kept, source)
            warnings.append(
                f"the target {column.name!r}: the labels that cleared the DP threshold are "
                f"{', '.join(kept)}; rows of any other label are left out of training (declare "
                "the label set public in the schema to keep them all)"
            )
            continue
        other = catch_all(kept, first.category_counts[column.name], plan)
        listed = tuple(kept) if other in kept else (*kept, other)
        schema = schema.replace_column(
            replace(column, categories=listed, other=other, source=source)
        )
    for column in columns.numbers:
        if column.name in found and shapes[column.name].empty:
            warnings.append(
                f"column {column.name!r}: its values' count did not clear the noise at this ε "
                "and size, so it is written empty: declare public bounds (min, max) to keep it"
            )
            schema = schema.replace_column(Column(column.name, "ignored", source=source))
            continue
        if column.name not in found:
            warnings.append(
                f"column {column.name!r}: no range cleared the noise at this ε and size, so it "
                "is written empty: declare public bounds (min, max) to keep it"
            )
            schema = schema.replace_column(Column(column.name, "ignored", source=source))
            continue
        if column.name in rounds.guessed:
            warnings.append(
                f"column {column.name!r}: {GUESSED_RANGE}: declare public bounds (min, max) to "
                "place its values"
            )
        schema = schema.replace_column(
            _released_number(column, found[column.name], shapes[column.name], source)
        )
    for column in columns.booleans:
        schema = schema.replace_column(
            replace(column, missing=shapes[column.name].missing, source=source)
        )
    noise = {
        c.name: (
            plan.target_noise_std
            if c.name == target and plan.target_noise_std is not None
            else plan.category_noise_std
        )
        for c in columns.categorical
    }
    kept_counts = {
        name: (first.categories[name], first.category_counts[name]) for name in categories
    }
    return AppliedRelease(
        schema,
        warnings,
        rounds.clipped,
        shapes,
        kept_counts,
        noise,
        rounds.clipped_deviation,
        rounds.second_looks,
    )


def catch_all(kept: Sequence[str], counts: Sequence[float], plan: SchemaReleasePlan) -> str:
    """The category that absorbs a released list's unlisted values (post-processing of the
    noisy counts). `(other)` when the rows the kept categories leave (N less their noisy
    counts) clear OTHER_Z deviations of that difference's noise, or when nothing was kept;
    otherwise the kept category with the largest noisy count. A column of two values (sex,
    a city) then never writes `(other)`: its catch-all would hold noise only, which the
    model would draw as a third value in about 1% of the rows. The price: unlisted values
    that do exist but hide in the noise (a few per cent at most) merge into the commonest
    category."""
    other = OTHER
    while other in kept:
        other += "*"
    if not kept:
        return other
    left = plan.rows - float(sum(counts))
    if left > OTHER_Z * plan.category_noise_std * math.sqrt(len(kept)):
        return other
    return kept[int(np.argmax(counts))]


def _released_number(
    column: Column, span: tuple[float, float], shape: ReleasedShape, source: str
) -> Column:
    """A number's schema entry from its released range and shape."""
    low, high = span
    edges = shape.edges
    if edges is not None:
        low, high = edges[0], edges[-1]
    if column.clock is not None:
        # a time of day lies in [00:00, 24:00] whatever the noise says (public knowledge)
        low, high = _within_day(low), _within_day(high)
        edges = None if edges is None else _edges_within_day(edges)
    if column.type == "integer":
        low, high = float(math.ceil(low)), float(math.floor(high))
        high = max(high, low)
    return replace(
        column,
        min=low,
        max=high,
        edges=edges if edges is not None and len(edges) > 2 else None,
        missing=shape.missing,
        decimals=shape.decimals if column.type == "numeric" else None,
        source=source,
    )


def _released_labels(schema: Schema, target: Column, kept: Sequence[str], source: str) -> Schema:
    """The schema with the target's released label set (no '(other)': a row whose label did
    not survive is left out of training, never relabelled). UsageError when fewer than two
    labels cleared the noise (the release is spent; nothing can be trained on)."""
    if len(kept) < 2:
        raise UsageError(
            f"the target {target.name!r}: {len(kept)} label(s) cleared the noise of the DP "
            "release at this ε and size (a label set needs two); declare the labels public "
            "in the schema (delete the target's 'source' mark) or raise {schema_epsilon}",
            parameter="schema_epsilon",
        )
    other = target.other if target.other in kept else None
    return schema.replace_column(
        replace(target, categories=tuple(kept), other=other, source=source)
    )


def _within_day(minutes: float) -> float:
    return min(max(float(minutes), 0.0), float(MINUTES_PER_DAY))


def _edges_within_day(edges: Sequence[float]) -> tuple[float, ...]:
    """Released bin edges clipped to the day, no value more than twice (a point mass)."""
    out: list[float] = []
    for edge in (_within_day(e) for e in edges):
        if not (len(out) >= 2 and out[-1] == out[-2] == edge):
            out.append(edge)
    return tuple(out)
