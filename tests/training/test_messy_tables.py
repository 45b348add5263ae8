"""Real-world tables: empty cells in numbers, dates and times, identifiers, booleans, a long
code column. The draft types them, the quick path refuses a leaking list, and the safe
default path gives a release with numbers, dates, missing cells at the real rates, fresh
identifiers and no column drowned in '(other)'."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from dpsynth.cli import app
from dpsynth.data.column_values import column_numbers
from dpsynth.data.schema import DATA_SOURCE, Column
from dpsynth.data.schema_draft import draft_table
from dpsynth.data.schema_file import parse_schema
from dpsynth.data.table_codec import RawTable, TableCodec, encode_table
from dpsynth.data.timecols import format_time_series, guess_time_format, time_series
from dpsynth.ledger import Ledger
from dpsynth.methods.marginal.domain import Attribute, codes_from_rows, rows_from_codes
from dpsynth.privacy.accounting.compose import compose_epsilon
from dpsynth.privacy.releases.schema_grids import fine_grid
from dpsynth.privacy.releases.schema_plan import NEEDS
from dpsynth.privacy.releases.schema_reach import epsilon_for_reach, release_reach
from dpsynth.privacy.releases.schema_release import (
    NumberSpec,
    plan_schema_release,
    release_ranges,
    supported_bins,
)

runner = CliRunner()
ROWS = 3000


def messy_frame(rows: int = ROWS, seed: int = 7) -> pd.DataFrame:
    """A hospital-style table as data owners hold it (strings, as written to the CSV)."""
    rng = np.random.default_rng(seed)
    age = rng.integers(18, 95, rows).astype(object)
    age[rng.random(rows) < 0.05] = ""
    bmi = np.round(rng.normal(27, 5, rows), 1).astype(object)
    bmi[rng.random(rows) < 0.15] = ""
    smoker = rng.choice(["yes", "no"], rows, p=[0.3, 0.7]).astype(object)
    smoker[rng.random(rows) < 0.10] = ""
    weights = np.arange(12, 0, -1.0)
    ward = rng.choice([f"W{i:02d}" for i in range(12)], rows, p=weights / weights.sum())
    minutes = rng.integers(0, 5 * 365 * 24 * 60, rows)
    admitted = pd.Timestamp("2019-01-01") + pd.to_timedelta(minutes, unit="min")
    born = pd.Timestamp("1930-01-01") + pd.to_timedelta(rng.integers(0, 25000, rows), unit="D")
    born_text = np.asarray(born.strftime("%d/%m/%Y"), dtype=object)
    born_text[rng.random(rows) < 0.08] = ""
    return pd.DataFrame(
        {
            "patient_id": [f"P{100000 + i}" for i in rng.permutation(rows)],
            "admitted": admitted.strftime("%Y-%m-%dT%H:%M:%S+01:00"),
            "born": born_text,
            "age": age,
            "bmi": bmi,
            "smoker": smoker,
            "ward": ward,
            "diag_code": rng.choice([f"C{i:04d}" for i in range(2000)], rows),
            "los_days": np.clip(rng.geometric(0.2, rows), 1, 90).astype(str),
            "outcome": rng.choice(["home", "transfer", "died"], rows, p=[0.7, 0.2, 0.1]),
        }
    )


@pytest.fixture(scope="module")
def messy(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The table, its draft, and one safe-path release (mst at ε = 3) sampled to a CSV."""
    folder = tmp_path_factory.mktemp("messy")
    frame = messy_frame()
    path = folder / "patients.csv"
    frame.to_csv(path, index=False)
    drafted = runner.invoke(app, ["data", "schema", f"csv:{path}", "--target", "outcome"])
    assert drafted.exit_code == 0, drafted.output
    schema = folder / "schema.json"
    schema.write_text(drafted.stdout)
    ledger = folder / "ledger.jsonl"
    trained = runner.invoke(
        app,
        ["train", "--method", "mst", "--data", f"csv:{path}", "--schema", str(schema),
         "--epsilon", "3", "--out", str(folder / "run"), "--ledger", str(ledger),
         "--device", "cpu", "--json"],
    )  # fmt: skip
    assert trained.exit_code == 0, trained.output
    out = folder / "synth.csv"
    sampled = runner.invoke(
        app, ["sample", str(folder / "run"), "--n", "2000", "--out", str(out),
              "--ledger", str(ledger), "--json"],
    )  # fmt: skip
    assert sampled.exit_code == 0, sampled.output
    synthetic = pd.read_csv(out, dtype=str, keep_default_na=False)
    return {
        "folder": folder,
        "path": path,
        "frame": frame,
        "draft": json.loads(drafted.stdout),
        "draft_output": drafted.output,
        "schema": schema,
        "ledger": ledger,
        "train": json.loads(trained.stdout),
        "synthetic": synthetic,
    }


def test_draft_types_real_columns_and_says_what_it_did(messy: dict) -> None:
    kinds = {c["name"]: c["type"] for c in messy["draft"]["columns"]}
    assert kinds == {
        "patient_id": "id",
        "admitted": "datetime",
        "born": "date",
        "age": "integer",  # not a categorical of its values because of empty cells
        "bmi": "numeric",
        "smoker": "boolean",
        "ward": "categorical",
        "diag_code": "ignored",  # 2,000 codes in 3,000 rows: too rare to release
        "los_days": "integer",
        "outcome": "categorical",
    }
    columns = {c["name"]: c for c in messy["draft"]["columns"]}
    assert columns["age"]["missing"] and columns["bmi"]["missing"] and columns["born"]["missing"]
    assert not columns["admitted"]["missing"] and not columns["los_days"]["missing"]
    assert columns["bmi"]["decimals"] == 1
    assert columns["admitted"]["format"] == "%Y-%m-%dT%H:%M:%S%:z"
    assert columns["admitted"]["timezone"] == "+01:00"
    assert columns["born"]["format"] == "%d/%m/%Y"
    assert (columns["smoker"]["true"], columns["smoker"]["false"]) == ("yes", "no")
    # no per-record value is ever listed as a category
    listed = {v for c in messy["draft"]["columns"] for v in c.get("categories", [])}
    assert not listed & set(messy["frame"]["patient_id"]) and not listed & set(
        messy["frame"]["diag_code"]
    )
    output = messy["draft_output"]
    assert "note: patient_id: one value per row → id" in output
    assert "note: diag_code: 2,000 values" in output or "note: diag_code:" in output


def test_quick_path_refuses_a_long_list_read_off_the_data(messy: dict, tmp_path: Path) -> None:
    draft = messy["draft"]
    for column in draft["columns"]:
        if column["name"] == "diag_code":  # as a user who overrides the draft would
            column.update(
                type="categorical",
                categories=sorted(set(messy["frame"]["diag_code"])),
                source=DATA_SOURCE,
            )
    schema = tmp_path / "leaky.json"
    schema.write_text(json.dumps(draft))
    ledger = tmp_path / "ledger.jsonl"
    refused = runner.invoke(
        app,
        ["train", "--method", "mst", "--data", f"csv:{messy['path']}", "--schema", str(schema),
         "--schema-public", "--epsilon", "1", "--out", str(tmp_path / "run"),
         "--ledger", str(ledger)],
    )  # fmt: skip
    assert refused.exit_code == 2
    lines = [line for line in refused.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "'diag_code'" in lines[0] and "'id'" in lines[0]
    assert "--schema-epsilon" in lines[0]
    assert not ledger.exists() or not Ledger(ledger).entries()


def test_safe_default_spends_a_share_and_releases_every_entry(messy: dict) -> None:
    entries = Ledger(messy["ledger"]).entries()
    assert entries[0]["command"] == "schema-release"
    release = messy["train"]["schema_release"]
    # 70% of ε = 3 for mst and aim (their 1-way marginals are the release's histograms)
    assert release["epsilon"] == pytest.approx(2.1, rel=0.02)
    assert release["default_share"] == 0.7
    assert release["end_bins_reach_padded_range"] is True  # mst draws end bins by tails
    assert messy["train"]["dataset_total_epsilon"] <= 3.0


def test_release_keeps_missing_rates_formats_and_no_real_identifier(messy: dict) -> None:
    real, synthetic = messy["frame"], messy["synthetic"]
    assert list(synthetic.columns) == list(real.columns)
    # admitted has no empty cell, but the DP schema release may still flag it missing (its
    # combined noisy count clears MISSING_SIGNIFICANCE about 2% of the time): its rate is
    # held too.
    for name in ("age", "bmi", "smoker", "born", "admitted"):
        assert abs((synthetic[name] == "").mean() - (real[name] == "").mean()) <= 0.03, name
    assert not set(synthetic["patient_id"]) & set(real["patient_id"])
    assert synthetic["patient_id"].is_unique
    assert synthetic["patient_id"].str.fullmatch(r"syn-\d+").all()
    admitted = synthetic["admitted"][synthetic["admitted"] != ""]  # every written value
    assert admitted.str.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+01:00").all()
    born = synthetic["born"][synthetic["born"] != ""]
    assert born.str.fullmatch(r"\d\d/\d\d/\d{4}").all()
    bmi = synthetic["bmi"][synthetic["bmi"] != ""]
    assert bmi.str.fullmatch(r"-?\d+\.\d").all()  # the source's one decimal
    assert synthetic["age"][synthetic["age"] != ""].str.fullmatch(r"\d+").all()
    assert set(synthetic["smoker"]) <= {"yes", "no", ""}
    assert (synthetic["diag_code"] == "").all()  # ignored: written empty
    # numbers carry information: spread, no pile-up on one value
    ages = synthetic["age"][synthetic["age"] != ""].astype(int)
    assert ages.std() > 10 and ages.value_counts(normalize=True).iloc[0] < 0.1
    assert abs(ages.median() - 56) < 10


def test_no_column_is_mostly_other_on_the_safe_path(messy: dict) -> None:
    real, synthetic = messy["frame"], messy["synthetic"]
    for name in ("ward", "smoker", "outcome"):
        if real[name].value_counts(normalize=True).iloc[0] < 0.5:
            assert (synthetic[name] == "(other)").mean() <= 0.9, name
    kept = [c for c in synthetic["ward"].unique() if c != "(other)"]
    assert len(kept) >= 3


def test_times_round_trip_in_their_format_and_zone() -> None:
    column = Column(
        "t", "datetime", 0, 2e9, format="%Y-%m-%dT%H:%M:%S%:z", timezone="+01:00", missing=True
    )
    texts = np.array(["2021-03-04T10:15:00+01:00", "", "2021-06-04T10:15:00+02:00"], object)
    seconds = column_numbers(RawTable(("t",), (texts,), "x"), column)
    assert math.isnan(seconds[1]) and seconds[2] - seconds[0] == 92 * 86400 - 3600
    back = format_time_series(time_series(seconds, column), column)
    assert back.tolist() == ["2021-03-04T10:15:00+01:00", "", "2021-06-04T09:15:00+01:00"]
    assert guess_time_format(["2021-03-04 10:15"]) == ("%Y-%m-%d %H:%M", None)
    assert guess_time_format(["25.12.2020", "01.02.2021"]) == ("%d.%m.%Y", None)
    assert guess_time_format(["2021-03-04T10:15:00Z"]) == ("%Y-%m-%dT%H:%M:%SZ", None)
    assert guess_time_format(["hello"]) is None


def test_codec_missing_flag_round_trip_and_typed_decode() -> None:
    schema = parse_schema(
        {
            "target": "y",
            "columns": [
                {"name": "id", "type": "id", "prefix": "k"},
                {"name": "x", "type": "numeric", "min": 0, "max": 10, "missing": True,
                 "decimals": 2},
                {"name": "b", "type": "boolean", "true": "Y", "false": "N", "missing": True},
                {"name": "y", "type": "categorical", "categories": ["a", "b"]},
            ],
        }
    )  # fmt: skip
    raw = RawTable(
        ("id", "x", "b", "y"),
        tuple(
            np.asarray(v, dtype=object)
            for v in (["1", "2", "3"], ["1.5", "", "7"], ["y", "NA", "N"], ["a", "b", "a"])
        ),
        "t",
    )
    table = encode_table(raw, schema, "t", "csv")
    codec = table.codec
    assert isinstance(codec, TableCodec) and codec.dim == 1 + 2 + 3
    assert table.x[:, 1:3].argmax(1).tolist() == [0, 1, 0]  # the missing flag
    frame = codec.decode(table.x.numpy(), table.y.numpy(), np.random.default_rng(0), start=10)
    assert frame["id"].tolist() == ["k11", "k12", "k13"]
    assert frame["x"].isna().tolist() == [False, True, False]
    assert frame["b"].tolist()[0] is True and frame["b"].isna().tolist() == [False, True, False]
    text = codec.csv_text(frame, header=True).splitlines()
    assert text[0] == "id,x,b,y" and text[2] == "k12,,,b" and text[1].startswith("k11,1.50,Y,")


def test_point_masses_and_missing_bins_in_the_marginal_domain() -> None:
    edges = (0.0, 0.0, 5.0, 10.0)  # a point mass at 0, then (0, 5), [5, 10]
    attribute = Attribute("x", "edges", 4, 0, 0.0, 10.0, edges=edges, flag_start=1)
    from dpsynth.methods.marginal.domain import TableDomain

    domain = TableDomain((attribute, Attribute("y", "target", 2, -1)), 3)
    values = np.array([0.0, 0.1, 4.9, 5.0, 10.0])
    scaled = (values / 10.0 * 2 - 1).astype(np.float32)
    rows = np.zeros((6, 3), dtype=np.float32)
    rows[:5, 0], rows[:5, 1], rows[5, 2] = scaled, 1.0, 1.0
    import torch

    codes = codes_from_rows(torch.from_numpy(rows), torch.zeros(6, dtype=torch.long), domain)
    assert codes[:, 0].tolist() == [0, 1, 1, 2, 2, 3]
    uniform = np.random.default_rng(0).random((6, 2))
    back, _ = rows_from_codes(codes.astype(np.int64), domain, uniform)
    again = codes_from_rows(back, torch.zeros(6, dtype=torch.long), domain)
    assert again[:, 0].tolist() == codes[:, 0].tolist()
    assert back[0, 0].item() == -1.0  # the point mass is the value 0 itself


def test_schema_release_plan_is_one_sensitivity_one_gaussian_per_round() -> None:
    numbers = {"a": NumberSpec("numeric", decimals=True), "b": NumberSpec("date")}
    plan = plan_schema_release(1.0, 1e-6, 3000, 2, numbers, booleans=1)
    sigma = plan.noise_multiplier
    # every row adds 1 to one bin of each histogram: 2 category lists, 2 ranges, 2 spans, 2
    # shapes, 1 decimals and 1 boolean; Σ 1/s² over them is 3/σ² (three rounds at σ,
    # sensitivity 1)
    total = (
        2 / plan.category_noise_std**2
        + 2 / plan.range_noise_std**2
        + 2 / plan.span_noise_std**2
        + 2 / plan.shape_noise_std**2
        + 1 / plan.decimals_noise_std**2
        + 1 / plan.boolean_noise_std**2
    )
    assert total == pytest.approx(3 / sigma**2)
    # the precision is shared by need (public weights per kind of histogram)
    for kind, std in (
        ("range", plan.range_noise_std),
        ("span", plan.span_noise_std),
        ("shape", plan.shape_noise_std),
        ("decimals", plan.decimals_noise_std),
        ("boolean", plan.boolean_noise_std),
    ):
        ratio = (plan.category_noise_std / std) ** 2
        assert ratio == pytest.approx(NEEDS[kind] / NEEDS["category"])
    assert plan.events[-1].to_json() == {"type": "gaussian", "noise_multiplier": sigma, "count": 3}
    assert compose_epsilon(plan.events, 1e-6).epsilon <= 1.0
    from dp_accounting import dp_event
    from dp_accounting.pld import pld_privacy_accountant

    accountant = pld_privacy_accountant.PLDAccountant()
    accountant.compose(dp_event.GaussianDpEvent(sigma), 3)
    reference = accountant.get_epsilon(1e-6 - plan.threshold_delta)
    assert compose_epsilon(plan.events, 1e-6).epsilon == pytest.approx(reference, rel=0.02)


def test_release_reach_is_what_a_value_needs_to_clear_and_its_epsilon_is_the_smallest() -> None:
    numbers = {"a": NumberSpec("numeric"), "b": NumberSpec("date")}
    plan = plan_schema_release(0.5, 1e-6, 400, 3, numbers, booleans=1)
    reach = release_reach(plan, 3, numbers)
    assert reach.category_rows == plan.category_threshold
    # at the second look's noise: a number round 1 misses is read again in round 2
    look = plan.second_look_noise_std
    assert reach.range_rows == max(
        plan.range_cut("numeric", std=look), plan.range_cut("date", std=look)
    )
    # empirically: a category held by `reach` rows clears about half the time, by 0.7× rarely
    import torch

    generator = torch.Generator().manual_seed(0)
    for share, low, high in ((1.0, 0.4, 0.6), (0.7, 0.0, 0.05)):
        held = round(share * reach.category_rows)
        values = np.array(["a"] * held + ["b"] * (400 - held), dtype=object)
        kept = [
            "a" in release_ranges({"c": values}, {}, plan, generator)[0]["c"] for _ in range(400)
        ]
        assert low <= np.mean(kept) <= high, (share, np.mean(kept))
    # the ε for a reach of 40 rows: reached there, not 5% below it
    epsilon = epsilon_for_reach(40.0, 1e-6, 400, 3, numbers, 1)
    at = plan_schema_release(epsilon, 1e-6, 400, 3, numbers, booleans=1)
    below = plan_schema_release(epsilon / 1.05, 1e-6, 400, 3, numbers, booleans=1)
    assert release_reach(at, 3, numbers).worst() <= 40.0 < release_reach(below, 3, numbers).worst()


def test_a_range_is_not_stretched_by_one_false_bin() -> None:
    counts = np.array([0.0, 30.0, 0.0, 0.0, 12.0, 13.0, 0.0, 11.0, 0.0])
    # 30 clears the strict cut alone; 12 and 13 are neighbours over the loose one; 11 is alone
    assert supported_bins(counts, cut=10.0, alone_cut=20.0).tolist() == [1, 4, 5]
    # a column of latitudes (one grid bin, [32, 45.25]) at ε = 10: its range is stretched
    # past the next bins in about one release in a thousand (FALSE_ALONE), not one in twenty
    # as when any bin over the loose cut counted (2026-11-29: 32 … 5.5e7)
    import torch

    plan = plan_schema_release(2.5, 1e-6, 41_536, 8, {"lat": NumberSpec("numeric")}, booleans=3)
    values = np.random.default_rng(0).uniform(44.89, 45.05, 41_536)
    generator = torch.Generator().manual_seed(1)
    ranges = [
        release_ranges({}, {"lat": (values, NumberSpec("numeric"))}, plan, generator)[1]["lat"]
        for _ in range(3000)
    ]
    assert all(r is not None for r in ranges)
    # the range is padded by RANGE_PAD grid bins each side on purpose (round 2 trims the pad
    # where it is empty): [32, 45.25] becomes [16, 90.5]; one false bin more stretches it
    from dpsynth.privacy.releases.schema_release import RANGE_PAD

    pad = 2.0 ** (RANGE_PAD / 2)
    stretched = [r for r in ranges if r[0] < 22.6 / pad or r[1] > 64.1 * pad]
    assert len(stretched) <= 15, stretched  # 0.5%; expected 3


def test_fine_grid_is_public_and_follows_the_type() -> None:
    assert fine_grid(18, 94, "integer", 64).tolist()[:3] == [18.0, 20.0, 22.0]
    days = fine_grid(0, 86400 * 10, "date", 64)
    assert np.all(days % 86400 == 0)
    skewed = fine_grid(0, 1e6, "numeric", 32)
    assert skewed[0] == 0 and skewed[1] == pytest.approx(100) and skewed[-1] == 1e6


def test_draft_table_keeps_missing_tokens_of_categories_as_spelled() -> None:
    values = np.array(["a", "?", "b", "a", ""] * 10, dtype=object)
    schema, remarks = draft_table(["c", "y"], [values, np.array(["0", "1"] * 25, object)], "y")
    assert schema.columns[0].categories == ("", "?", "a", "b") and remarks == []


def test_shape_round_trims_a_coarse_range_to_where_the_rows_are() -> None:
    """Round 1's √2 grid releases months as 1–17; the shape round's edges stop at 12."""
    import torch

    from dpsynth.privacy.releases.schema_release import release_shapes

    rows = 60_000
    months = np.random.default_rng(3).integers(1, 13, rows).astype(np.float64)
    spec = NumberSpec("integer")
    plan = plan_schema_release(0.25, 1e-6, rows, 0, {"month": spec}, booleans=0)
    generator = torch.Generator().manual_seed(0)
    texts = months.astype(int).astype(str)
    shape = release_shapes({"month": (months, texts, spec, (1.0, 17.0))}, {}, plan, generator)
    edges = shape["month"].edges
    assert edges is not None
    assert edges[0] == 1.0
    assert edges[-1] == 12.0  # whole numbers: the last bin is closed, the max is 12
    # a range the rows fill is kept whole
    wide = np.random.default_rng(4).integers(1, 18, rows).astype(np.float64)
    texts = wide.astype(int).astype(str)
    shape = release_shapes({"month": (wide, texts, spec, (1.0, 17.0))}, {}, plan, generator)
    assert shape["month"].edges[-1] == 17.0


def test_classifiers_score_real_rows_through_the_released_category_list() -> None:
    """A real table scored against a released schema: its thousands of unlisted codes are
    the column's `other`, as in training (gradient boosting used to crash on them)."""
    from dpsynth.evaluation.table_classifiers import classifier_scores, table_frame

    rng = np.random.default_rng(0)
    rows = 600
    tail = np.array([f"N{i:04d}" for i in rng.integers(0, 3000, rows)], dtype=object)
    tail[:200] = "N0001"
    label = np.where(tail == "N0001", "a", rng.choice(["a", "b"], rows)).astype(object)
    raw = RawTable(("tailnum", "y"), (tail, label), "real")
    schema = parse_schema(
        {
            "target": "y",
            "columns": [
                {"name": "tailnum", "type": "categorical",
                 "categories": ["N0001", "(other)"], "other": "(other)"},
                {"name": "y", "type": "categorical", "categories": ["a", "b"]},
            ],
        }
    )  # fmt: skip
    frame, labels = table_frame(raw, schema)
    assert set(frame["tailnum"]) == {"N0001", "(other)"}
    scores = classifier_scores((frame, labels), (frame, labels), schema, ["accuracy"], 1)
    assert scores["gbm"]["accuracy"]["mean"] > 0.6
