"""The DP schema release's noisy histograms reused as MST's and AIM's 1-way measurements: they
must be the columns' 1-way marginals in the model's own bins (checked against the exact codes
at negligible noise), and the runs that reuse them must plan fewer measurements."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dpsynth.data.csvtable import RawTable
from dpsynth.data.discrete import codes_from_raw, schema_domain
from dpsynth.data.schema_draft import draft_table
from dpsynth.methods.marginal.one_ways import released_measurements
from dpsynth.methods.marginal.trainer import MEASURE_PHASE
from dpsynth.training.schema_counting import release_in_memory
from dpsynth.training.schema_entries import plan_release
from dpsynth.training.table_prepare import one_way_record

ROWS = 4000


def _table() -> RawTable:
    rng = np.random.default_rng(5)
    income = np.round(rng.lognormal(10.5, 0.8, ROWS), 2)
    income[rng.random(ROWS) < 0.2] = 0.0  # an exact zero held by a fifth of the rows
    income_text = income.astype(str).astype(object)
    income_text[rng.random(ROWS) < 0.1] = ""  # empty cells
    count = rng.poisson(3, ROWS).astype(str)
    ward = rng.choice([f"w{i}" for i in range(8)], ROWS).astype(object)
    ward[:3] = "rare"  # a value no release keeps: '(other)'
    smoker = rng.choice(["yes", "no"], ROWS).astype(object)
    smoker[rng.random(ROWS) < 0.3] = ""
    flag = rng.choice(["0", "1"], ROWS).astype(object)  # an indicator: a boolean, no missing
    label = rng.choice(["a", "b", "c"], ROWS).astype(object)
    names = ["income", "count", "ward", "smoker", "flag", "label"]
    columns = [income_text, count, ward, smoker, flag, label]
    return RawTable(tuple(names), tuple(np.asarray(c, dtype=object) for c in columns), "t")


def test_released_histograms_are_the_model_bins_one_way_marginals() -> None:
    raw = _table()
    schema, _ = draft_table(list(raw.header), list(raw.columns), "label")
    # ε = 1000: noise of a fraction of a row, so the released counts are the exact ones
    columns, plan = plan_release(schema, raw.n, 1000.0, 1e-6)
    applied = release_in_memory(
        raw, schema, columns, plan, torch.Generator().manual_seed(0), "released with DP (t)"
    )
    released_schema = applied.schema
    domain = schema_domain(released_schema, 8, True)
    codes = codes_from_raw(raw, released_schema, domain)
    measured = released_measurements(domain, released_schema, one_way_record(applied), float(raw.n))
    kinds = {a.name: a.kind for a in domain.attributes}
    names = {"income", "count", "ward", "smoker", "flag", "label"}
    assert kinds["income"] == "edges" and names <= {domain.attributes[i].name for i in measured}
    for index, measurement in measured.items():
        exact = np.bincount(codes[:, index], minlength=domain.sizes[index])
        assert measurement.clique == (index,)
        assert measurement.values == pytest.approx(exact, abs=1.0), domain.attributes[index].name


def test_a_run_that_reuses_them_plans_fewer_measurements() -> None:
    from dataclasses import replace

    from dpsynth.data.images import DataInfo
    from dpsynth.methods.base import PrivacyTarget
    from dpsynth.methods.marginal.mst import MSTMethod
    from dpsynth.methods.marginal.one_ways import ONE_WAYS_KEY

    raw = _table()
    schema, _ = draft_table(list(raw.header), list(raw.columns), "label")
    columns, plan = plan_release(schema, raw.n, 1.0, 1e-6)
    applied = release_in_memory(
        raw, schema, columns, plan, torch.Generator().manual_seed(0), "released with DP (t)"
    )
    info = DataInfo(
        "t", "csv", raw.n, (1,), tuple(applied.schema.classes), "", "t", "table",
        applied.schema.to_json(),
    )  # fmt: skip
    method = MSTMethod()
    config = method.config("small", {}, info)
    target = PrivacyTarget(2.0, 1e-6)
    alone = method.plan(info, target, config)
    reused = method.plan(info, target, {**config, ONE_WAYS_KEY: one_way_record(applied)})
    count = next(e for e in alone.events if e.annotation("phase") == MEASURE_PHASE).count
    fewer = next(e for e in reused.events if e.annotation("phase") == MEASURE_PHASE).count
    assert fewer == count - 6  # every column's 1-way comes from the release
    # fewer measurements in the same budget: less noise on each
    sigma = next(e for e in alone.events if e.annotation("phase") == MEASURE_PHASE)
    sigma_reused = next(e for e in reused.events if e.annotation("phase") == MEASURE_PHASE)
    assert sigma_reused.noise_multiplier < sigma.noise_multiplier
    assert replace(info) == info
