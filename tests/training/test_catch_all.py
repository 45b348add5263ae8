"""A released category list's catch-all: `(other)` only when the rows its kept values leave
clear the noise; otherwise the commonest kept value absorbs the unlisted ones, so a column
of two values never writes `(other)` (issue 68: 0.7% of a `sex` column was `(other)`)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dpsynth.data.csvtable import RawTable
from dpsynth.data.discrete import codes_from_raw, schema_domain
from dpsynth.data.schema_draft import draft_table
from dpsynth.methods.marginal.one_ways import released_measurements
from dpsynth.privacy.releases.schema_plan import SchemaReleasePlan
from dpsynth.training.release_notes import describe_released
from dpsynth.training.schema_counting import release_in_memory
from dpsynth.training.schema_entries import OTHER, catch_all, plan_release
from dpsynth.training.table_prepare import one_way_record

ROWS = 3000


def _plan(epsilon: float) -> SchemaReleasePlan:
    raw = _table(np.random.default_rng(0), 0)
    schema, _ = draft_table(list(raw.header), list(raw.columns), "label")
    return plan_release(schema, ROWS, epsilon, 1e-6)[1]


def test_the_rest_is_kept_only_when_it_clears_the_noise() -> None:
    plan = _plan(1.0)
    std = plan.category_noise_std
    # two values that hold every row (their noisy counts sum to N within the noise)
    assert catch_all(["F", "M"], [1500.0 + 0.5 * std, 1500.0 - std], plan) == "F"
    # a rest of many deviations: rare values that do exist keep their own category
    rest = 5 * std * np.sqrt(2)
    assert catch_all(["F", "M"], [1500.0 - rest, 1500.0], plan) == OTHER
    # nothing kept: every value is '(other)'; a kept value spelt '(other)' is not reused
    assert catch_all([], [], plan) == OTHER
    assert catch_all([OTHER], [float(ROWS) + std], plan) == OTHER


def _table(rng: np.random.Generator, rare: int) -> RawTable:
    sex = rng.choice(["F", "M"], ROWS, p=[0.4, 0.6]).astype(object)
    sex[:rare] = "X"  # values no release keeps at this size
    city = rng.choice(["north", "south", "east", "west"], ROWS).astype(object)
    label = rng.choice(["a", "b"], ROWS).astype(object)
    names = ("sex", "city", "label")
    return RawTable(names, (sex, city, label), "t")


@pytest.mark.parametrize("rare", [0, 3])
def test_a_two_value_column_writes_no_other_and_measures_its_merged_value(rare: int) -> None:
    raw = _table(np.random.default_rng(1), rare)
    schema, _ = draft_table(list(raw.header), list(raw.columns), "label")
    columns, plan = plan_release(schema, raw.n, 1.0, 1e-6)
    applied = release_in_memory(
        raw, schema, columns, plan, torch.Generator().manual_seed(3), "released with DP (t)"
    )
    sex = next(c for c in applied.schema.columns if c.name == "sex")
    assert tuple(sex.categories) == ("F", "M") and sex.other == "M"
    line = describe_released(sex.to_json(), "label", applied.warnings)
    assert line == "kept 2 categories (F, M); the rest becomes M"
    # the rows of 'X' are encoded as the commonest value, never dropped
    domain = schema_domain(applied.schema, 8, True)
    codes = codes_from_raw(raw, applied.schema, domain)
    index = next(i for i, a in enumerate(domain.attributes) if a.name == "sex")
    exact = np.bincount(codes[:, index], minlength=domain.sizes[index])
    assert exact.sum() == ROWS and exact[1] == np.sum(raw.column("sex") != "F")
    # its 1-way measurement: N less F's noisy count, an unbiased count of M and the rest
    measured = released_measurements(domain, applied.schema, one_way_record(applied), ROWS)
    values = measured[index].values
    noisy_f = applied.category_counts["sex"][1][applied.category_counts["sex"][0].index("F")]
    assert values[0] == pytest.approx(noisy_f) and values[1] == pytest.approx(ROWS - noisy_f)
    assert abs(values[1] - exact[1]) < 5 * plan.category_noise_std


def test_a_column_whose_rare_values_are_many_keeps_other() -> None:
    rng = np.random.default_rng(2)
    raw = _table(rng, 0)
    sex = raw.column("sex").copy()
    # 30% of the rows spread over 300 values, none of which clears the threshold
    spread = rng.random(ROWS) < 0.3
    sex[spread] = [f"v{i}" for i in rng.integers(0, 300, int(spread.sum()))]
    raw = RawTable(raw.header, (sex, raw.column("city"), raw.column("label")), "t")
    schema, _ = draft_table(list(raw.header), list(raw.columns), "label")
    columns, plan = plan_release(schema, raw.n, 1.0, 1e-6)
    applied = release_in_memory(
        raw, schema, columns, plan, torch.Generator().manual_seed(4), "released with DP (t)"
    )
    column = next(c for c in applied.schema.columns if c.name == "sex")
    assert column.other == OTHER and column.categories[-1] == OTHER
