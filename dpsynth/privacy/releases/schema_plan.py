"""The plan of a DP schema release: how its budget is shared among the columns, by need.

The release is a set of Gaussian noisy histograms, each row adding exactly 1 to one bin of
every histogram (add/remove adjacency). Histogram i gets noise of std s_i; the whole release is
one Gaussian mechanism on the histograms scaled by 1/s_i, of L2 sensitivity √Σ 1/s_i², however
the histograms are split into rounds (Gaussian mechanisms compose exactly, adaptively too). The
ledger records it as `gaussian` of count R at noise multiplier σ (R rounds at σ: Σ 1/s_i² =
R/σ²), beside the category lists' `threshold_delta`.

**Budget by need.** The precision Σ 1/s_i² is shared in proportion to a public weight per kind
of histogram (NEEDS), from the column types only, never from the rows:
- a category list (weight 1): its threshold decides which values survive at all;
- the target's label set: TARGET_PRECISION_SHARE of the whole release's precision (it must
  keep two labels), and never less than a list's;
- a number's range on the coarse grid (RANGE_NEED): where its rows are, padded afterwards;
- a number's span (SPAN_NEED): the padded range counted on a finer grid, to trim the padding
  where it is empty;
- a number's shape (SHAPE_NEED): its bin edges, missing share, and the 1-way measurement
  that MST and AIM reuse instead of measuring the column again;
- a boolean's [false | true | missing] (BOOLEAN_NEED): its missing flag and 1-way marginal;
- a float's precision (DECIMALS_NEED): every present value falls in one of 7 bins, so little
  precision tells 1 decimal from 2.
A column with public entries is not released and costs nothing.

`unit_rows` K > 1: the guarantee is per privacy unit of at most K rows (bounded before the
read): one unit moves each histogram by at most K in L2, so every std is K times the per-row
one at the same σ; and a unit brings up to K new values into a category list, each held by at
most K rows, so the threshold is K plus the noise's quantile at δ_c / K.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from scipy.stats import norm

from dpsynth.errors import UsageError
from dpsynth.privacy.accounting.calibration import calibrate_noise
from dpsynth.privacy.accounting.events import DpEvent, Gaussian, ThresholdDelta
from dpsynth.privacy.mechanisms.histograms import THRESHOLD_DELTA_SHARE
from dpsynth.privacy.releases.schema_grids import range_grid
from dpsynth.privacy.releases.schema_spans import FALSE_ALARM, FALSE_ALONE

RANGE_NEED = 0.5
SPAN_NEED = 0.3
SHAPE_NEED = 0.8
BOOLEAN_NEED = 0.4
DECIMALS_NEED = 0.1
TARGET_PRECISION_SHARE = 0.25
NEEDS = {
    "category": 1.0,
    "range": RANGE_NEED,
    "span": SPAN_NEED,
    "shape": SHAPE_NEED,
    "boolean": BOOLEAN_NEED,
    "decimals": DECIMALS_NEED,
}


def quantile_bins(rows: int) -> int:
    """The number of bins K the edges cut a number into: about log2(N), within [6, 16]
    (coarser for small tables, whose 2-way marginals could not resolve finer bins)."""
    return int(min(16, max(6, round(math.log2(max(rows, 2))))))


@dataclass(frozen=True)
class NumberSpec:
    """What the release needs of a number or time column: its kind and whether to release its
    precision."""

    kind: str  # "numeric", "integer", "datetime" or "date"
    decimals: bool = False


@dataclass(frozen=True)
class SchemaReleasePlan:
    """The noise of every histogram of the release, fixed before the data is read."""

    noise_multiplier: float
    category_noise_std: float
    category_threshold: float
    range_noise_std: float
    shape_noise_std: float
    threshold_delta: float
    rows: int
    epsilon: float
    delta: float
    events: tuple[DpEvent, ...]
    # rows one privacy unit may hold (1: the unit is a row): every noise std is scaled by it
    unit_rows: int = 1
    # the target's label list, when released: less noise than the other lists (see the plan)
    target_noise_std: float | None = None
    target_threshold: float | None = None
    boolean_noise_std: float = 0.0
    span_noise_std: float = 0.0
    decimals_noise_std: float = 0.0
    # kind of histogram → (histograms of that kind, weight): the allocation, for config.json
    allocation: tuple[tuple[str, int, float], ...] = ()
    # the numbers released (a bin alone clears a cut shared by their range histograms)
    numbers: int = 1
    # a trimmed number's end bins reach back to its padded range (`reached_edges`): for
    # methods that draw end bins by tails; one that scales a number by its range loses
    # resolution over a wide one
    reach_ends: bool = True

    @property
    def second_look_noise_std(self) -> float:
        """The noise of a range grid read twice (round 1's histogram, and round 2's look at
        a number round 1 found no range for, at the span histogram's noise), the two combined
        by their variances."""
        if self.span_noise_std <= 0.0:
            return self.range_noise_std
        return 1.0 / math.sqrt(self.range_noise_std**-2 + self.span_noise_std**-2)

    def range_cut(self, kind: str, alone: bool = False, std: float | None = None) -> float:
        """The noisy count a bin of a number's public range grid must clear (`kind`: the
        column's type; dates and times use the calendar grid) beside a neighbour that clears
        it too, or `alone` (see FALSE_ALARM), at the range histogram's noise or `std`. Not a
        privacy threshold (the grid is public)."""
        std = self.range_noise_std if std is None else std
        bins = len(range_grid(kind))
        # a bin alone stretches a range by orders of magnitude: its false-alarm rate is shared
        # by the release's numbers (at FALSE_ALONE a number, one release of nhefs' in three
        # had a number so stretched: its marital codes, 2-8, were released as -6.1e9 … 19)
        rate = FALSE_ALONE / max(self.numbers, 1) if alone else FALSE_ALARM
        return 1.0 + std * float(norm.isf(rate / bins))

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        stds = {
            "category": self.category_noise_std,
            "range": self.range_noise_std,
            "span": self.span_noise_std,
            "shape": self.shape_noise_std,
            "boolean": self.boolean_noise_std,
            "decimals": self.decimals_noise_std,
        }
        return {
            "mechanism": "gaussian noisy histograms: ranges (thresholded for category lists), "
            "then bin edges, missing flags and precision",
            "noise_multiplier": self.noise_multiplier,
            "category_noise_std": self.category_noise_std,
            "category_threshold": self.category_threshold,
            "target_noise_std": self.target_noise_std,
            "target_threshold": self.target_threshold,
            "range_noise_std": self.range_noise_std,
            "span_noise_std": self.span_noise_std,
            "shape_noise_std": self.shape_noise_std,
            "boolean_noise_std": self.boolean_noise_std,
            "decimals_noise_std": self.decimals_noise_std,
            "allocation": [
                {
                    "histogram": kind,
                    "count": count,
                    "need": weight,
                    "noise_std": self.target_noise_std if kind == "target" else stds[kind],
                }
                for kind, count, weight in self.allocation
            ],
            "threshold_delta": self.threshold_delta,
            "quantile_bins": quantile_bins(self.rows),
            "end_bins_reach_padded_range": self.reach_ends,
            **({"sensitivity_rows": self.unit_rows} if self.unit_rows > 1 else {}),
            "epsilon": self.epsilon,
            "delta": self.delta,
            "events": [e.to_json() for e in self.events],
        }


def plan_schema_release(
    epsilon: float,
    delta: float,
    rows: int,
    categorical: int,
    numbers: Mapping[str, NumberSpec],
    booleans: int,
    unit_rows: int = 1,
    target: bool = False,
) -> SchemaReleasePlan:
    """Calibrate the release so that it alone is (ε, δ)-DP, its precision shared by need.

    `target`: one of the `categorical` lists is the target's label set, which a run cannot
    lose (it needs two labels): it takes TARGET_PRECISION_SHARE of the release's precision, so its
    labels clear the threshold at fewer rows. `rows` is N or the declared public size N':
    every N-derived setting (bins) reads it."""
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise UsageError(f"--schema-epsilon must be a positive number, got {epsilon}")
    decimals = sum(spec.decimals for spec in numbers.values())
    shapes = len(numbers) + decimals + booleans
    if categorical + shapes == 0:
        raise UsageError("--schema-epsilon: no schema entry to release")
    # ranges and lists; the numbers' spans; shapes, booleans and decimals
    rounds = int(categorical + len(numbers) > 0) + int(len(numbers) > 0) + int(shapes > 0)
    share = THRESHOLD_DELTA_SHARE * delta if categorical else 0.0
    prior = (ThresholdDelta(share),) if categorical else ()
    calibration = calibrate_noise(epsilon, delta, 1.0, rounds, prior_events=prior)
    sigma = calibration.noise_multiplier
    lists = categorical - int(target)
    others = (
        lists * NEEDS["category"]
        + len(numbers) * (RANGE_NEED + SPAN_NEED + SHAPE_NEED)
        + booleans * BOOLEAN_NEED
        + decimals * DECIMALS_NEED
    )
    ratio = TARGET_PRECISION_SHARE / (1.0 - TARGET_PRECISION_SHARE)
    target_need = max(NEEDS["category"], others * ratio) if target else 0.0
    allocation = tuple(
        (kind, count, weight)
        for kind, count, weight in (
            ("category", lists, NEEDS["category"]),
            ("target", int(target), target_need),
            ("range", len(numbers), RANGE_NEED),
            ("span", len(numbers), SPAN_NEED),
            ("shape", len(numbers), SHAPE_NEED),
            ("boolean", booleans, BOOLEAN_NEED),
            ("decimals", decimals, DECIMALS_NEED),
        )
        if count
    )
    total_need = sum(count * weight for _, count, weight in allocation)
    # Σ_i 1/s_i² = rounds/σ², 1/s_i² = need_i · scale (per row; a unit's K scales every std)
    scale = rounds / (sigma**2 * total_need)
    k = int(unit_rows)

    def std(kind_need: float) -> float:
        return k / math.sqrt(kind_need * scale)

    category_std = std(NEEDS["category"])
    target_std = std(target_need) if target else None
    per_value = (share / categorical if categorical else delta) / k
    return SchemaReleasePlan(
        noise_multiplier=sigma,
        category_noise_std=category_std,
        category_threshold=float(k) + category_std * float(norm.isf(per_value)),
        range_noise_std=std(RANGE_NEED),
        shape_noise_std=std(SHAPE_NEED),
        span_noise_std=std(SPAN_NEED),
        threshold_delta=share,
        rows=rows,
        epsilon=calibration.total_epsilon,
        delta=delta,
        events=(*prior, Gaussian(sigma, rounds)),
        unit_rows=k,
        target_noise_std=target_std,
        target_threshold=(
            float(k) + target_std * float(norm.isf(per_value)) if target_std is not None else None
        ),
        boolean_noise_std=std(BOOLEAN_NEED),
        decimals_noise_std=std(DECIMALS_NEED),
        allocation=allocation,
        numbers=len(numbers),
    )
