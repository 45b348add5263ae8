"""The DP schema release's noisy histograms as MST's and AIM's 1-way measurements.

The schema release (`dpsynth.privacy.releases.schema_release`) measures each released column
with Gaussian noise: a number's [missing | zero | fine bins], a boolean's [false | true |
missing], a category list's kept values. A column's model bins are unions of those cells (a
number's edges are fine-grid edges), so its 1-way marginal is a sum of released noisy counts:
post-processing, no new spend. The run then measures only the 1-way marginals the release did
not cover, and ε is spent once on each (the release's and the run's events compose in the
ledger as before).

A measurement here has one σ per bin (the estimator's weights): a bin summing m noisy cells
has variance m·s². A category list's
'(other)' (or the kept value that absorbs the rest) is N minus the other kept values' noisy
counts (N is public). A column whose bins do not
line up with the released cells (a time of day, a point mass inside a fine bin) is measured
by the run as before.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from dpsynth.data.discrete import Attribute, TableDomain, number_codes
from dpsynth.data.images import DataInfo
from dpsynth.data.schema import Schema
from dpsynth.data.table_codec import _scale, codec_for
from dpsynth.methods.marginal.model import Measurement

# The run config's key holding the release's histograms (`released_one_ways` of the record).
ONE_WAYS_KEY = "released_one_ways"


def _codes(values: np.ndarray, attribute: Attribute, schema: Schema) -> np.ndarray:
    column = next(c for c in schema.columns if c.name == attribute.name)
    return number_codes(_scale(np.asarray(values, dtype=np.float64), column), attribute)


def _number(
    attribute: Attribute, schema: Schema, released: Mapping[str, Any], kind: str
) -> tuple[np.ndarray, np.ndarray] | None:
    """The bins' noisy counts and noisy-cell counts of a number, or None when its bins do
    not line up with the released cells."""
    grid = np.asarray(released["grid"], dtype=np.float64)
    counts = np.asarray(released["counts"], dtype=np.float64)
    if attribute.kind != "edges" or len(grid) < 2 or len(counts) != len(grid) + 1:
        return None
    unit = {"integer": 1.0, "date": 86400.0}.get(kind)
    # a value within a hair of an edge may be coded across it (the codec's float32 tolerance):
    # the check reads each fine bin a hundredth inside its edges (whole numbers: its ends)
    lows = grid[:-1] if unit else grid[:-1] + 0.01 * np.diff(grid)
    if unit and kind == "integer" and grid[0] <= 0.0 <= grid[-1]:
        # exact zeros are counted apart: a fine bin from 0 holds only larger values
        lows = np.where(lows == 0.0, unit, lows)
    highs = grid[1:] - unit if unit else grid[1:] - 0.01 * np.diff(grid)
    lows = np.minimum(lows, highs)  # [0, 1) of whole numbers, zeros apart: empty, any code
    first, last = _codes(lows, attribute, schema), _codes(highs, attribute, schema)
    if not np.array_equal(first, last):
        return None
    size = attribute.size
    values, cells = np.zeros(size), np.zeros(size)
    np.add.at(values, first, counts[2:])
    np.add.at(cells, first, 1.0)
    zero = int(_codes(np.array([0.0]), attribute, schema)[0])
    values[zero] += counts[1]
    cells[zero] += 1.0
    missing = (
        size - 1
        if attribute.missing
        else int(number_codes(np.zeros(1, dtype=np.float32), attribute)[0])
    )
    values[missing] += counts[0]
    cells[missing] += 1.0
    return values, cells


def _category(
    levels: tuple[str, ...], released: Mapping[str, Any], n: float, other: str | None
) -> tuple[np.ndarray, np.ndarray] | None:
    kept = dict(zip(released["values"], released["counts"], strict=True))
    values, cells = np.zeros(len(levels)), np.zeros(len(levels))
    for i, level in enumerate(levels):
        if level in kept:
            values[i], cells[i] = kept[level], 1.0
        elif level != other:
            return None  # a level the release did not measure
    if other is not None and other in levels:
        # the catch-all holds every row the other kept values do not: N less their counts
        # (a kept value that is also the catch-all holds the unlisted rows too)
        rest = {level: count for level, count in kept.items() if level != other}
        i = levels.index(other)
        values[i] = n - sum(rest.values())
        cells[i] = max(len(rest), 1)
    return values, cells


def released_measurements(
    domain: TableDomain, schema: Schema, one_ways: Mapping[str, Any], n: float
) -> dict[int, Measurement]:
    """The 1-way measurements the release already made, by attribute index (see the
    module docstring); `n` the public record count."""
    out: dict[int, Measurement] = {}
    columns = {c.name: c for c in schema.columns}
    for index, attribute in enumerate(domain.attributes):
        released = one_ways.get(attribute.name)
        column = columns.get(attribute.name)
        if released is None or column is None:
            continue
        if released["kind"] == "number":
            made = _number(attribute, schema, released, column.type)
        elif released["kind"] == "boolean":
            counts = np.asarray(released["counts"], dtype=np.float64)  # false, true, missing
            if attribute.size == 3:
                made = (counts, np.ones(3))
            else:  # no missing level: a missing cell is encoded false (the codec's rule)
                made = (np.array([counts[0] + counts[2], counts[1]]), np.array([2.0, 1.0]))
        else:
            other = column.other if attribute.kind != "target" else None
            made = _category(tuple(column.levels), released, n, other)
        if made is None:
            continue
        values, cells = made
        # a bin summing m noisy cells has variance m·s² (a bin of none: not measured, weight ~0)
        sigma = float(released["noise_std"]) * np.sqrt(np.where(cells > 0, cells, 1e6))
        out[index] = Measurement((index,), values, sigma)
    return out


def released_one_ways(
    domain: TableDomain, info: DataInfo, config: Mapping[str, Any]
) -> dict[int, Measurement]:
    """The 1-way measurements a run's config carries from its DP schema release (none
    without one)."""
    one_ways = config.get(ONE_WAYS_KEY)
    if not one_ways or info.modality != "table":
        return {}
    return released_measurements(domain, codec_for(info).schema, one_ways, float(info.n))
