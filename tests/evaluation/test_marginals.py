"""The marginal fidelity metric (`evaluate --metrics marginals`): exact TVDs on hand-made
tables, public binning, the fixed 3-way triples, an independent pandas reference, and the CLI
path with its bad inputs."""

from __future__ import annotations

import csv
import itertools
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from dpsynth.cli import app
from dpsynth.data.schema_file import parse_schema
from dpsynth.data.table_codec import RawTable
from dpsynth.evaluation import marginals
from dpsynth.evaluation.marginals import (
    category_codes,
    discretise,
    marginal_fidelity,
    numeric_codes,
    three_way_subsets,
)

runner = CliRunner()

SCHEMA = parse_schema(
    {
        "target": "label",
        "columns": [
            {"name": "x", "type": "numeric", "min": 0, "max": 100},
            {"name": "c", "type": "categorical", "categories": ["a", "b", "c"]},
            {"name": "skip", "type": "ignored"},
            {"name": "label", "type": "categorical", "categories": ["no", "yes"]},
        ],
    },
    "test schema",
)


def table(rows: list[tuple[str, ...]], header: tuple[str, ...] = ("x", "c", "skip", "label")):
    """A RawTable of string rows (as `read_csv_table` gives)."""
    columns = tuple(np.array([r[i] for r in rows], dtype=str) for i in range(len(header)))
    return RawTable(header, columns, "test")


def test_identical_tables_have_zero_tvd_everywhere() -> None:
    rows = [("5", "a", "", "no"), ("55", "b", "z", "yes"), ("99", "c", "", "yes")] * 7
    found = marginal_fidelity(table(rows), table(rows[::-1]), SCHEMA)
    assert found["columns"] == 3  # the ignored column is not a marginal
    assert found["one_way"]["per_column"] == {"x": 0.0, "c": 0.0, "label": 0.0}
    assert found["two_way"]["mean"] == 0.0 and found["two_way"]["count"] == 3
    assert found["three_way"]["mean"] == 0.0 and found["three_way"]["count"] == 1
    assert found["three_way"]["subsets"] == [["x", "c", "label"]]


def test_disjoint_tables_have_tvd_one() -> None:
    a = table([("5", "a", "", "no")] * 4)
    b = table([("95", "b", "", "yes")] * 3)
    found = marginal_fidelity(a, b, SCHEMA)
    assert found["one_way"]["per_column"] == {"x": 1.0, "c": 1.0, "label": 1.0}
    assert found["two_way"]["mean"] == 1.0 and found["three_way"]["mean"] == 1.0


def test_known_overlaps() -> None:
    # c: uniform on {a, b} against uniform on {b, c}: TVD ½(½ + 0 + ½) = ½.
    a = table([("5", "a", "", "no"), ("5", "b", "", "yes")] * 5)
    b = table([("5", "b", "", "no"), ("5", "c", "", "yes")] * 3)
    found = marginal_fidelity(a, b, SCHEMA)
    assert found["one_way"]["per_column"] == pytest.approx({"x": 0.0, "c": 0.5, "label": 0.0})
    # pairs: x×c ½, x×label 0, c×label: (a,no),(b,yes) against (b,no),(c,yes): disjoint, 1.
    assert found["two_way"]["mean"] == pytest.approx((0.5 + 0.0 + 1.0) / 3)
    assert found["two_way"]["worst"][0] == {"columns": ["c", "label"], "tvd": 1.0}
    # Same 1-way marginals, swapped pairing: the 2-way marginal sees it, the 1-way ones do not.
    left = table([("5", "a", "", "no"), ("5", "b", "", "yes")])
    right = table([("5", "a", "", "yes"), ("5", "b", "", "no")])
    swapped = marginal_fidelity(left, right, SCHEMA)
    assert swapped["one_way"]["mean"] == 0.0
    assert swapped["two_way"]["worst"][0] == {"columns": ["c", "label"], "tvd": 1.0}


def test_numbers_are_binned_on_the_schema_bounds_not_the_data() -> None:
    values = np.array(["0", "5", "9.99", "10", "55", "100", "100.5", "-1", "n/a", "inf", "x"])
    # 10 bins, then the missing bucket (10: "n/a"), then `other` (11: outside, not a number)
    assert numeric_codes(values, 0, 100).tolist() == [0, 0, 0, 1, 5, 9, 11, 11, 10, 11, 11]
    assert numeric_codes(np.array(["3", "3", "4"]), 3, 3).tolist() == [0, 0, 11]
    # 1..4 and 5..8 span the data's own range very differently, but on the public [0, 100]
    # they share the first bin: TVD 0. A data-range binning would see them apart.
    low = table([(str(v), "a", "", "no") for v in (1, 2, 3, 4)])
    high = table([(str(v), "a", "", "no") for v in (5, 6, 7, 8)])
    assert marginal_fidelity(low, high, SCHEMA)["one_way"]["per_column"]["x"] == 0.0
    narrow = parse_schema(
        {
            "target": "label",
            "columns": [
                {"name": "x", "type": "numeric", "min": 1, "max": 8},
                {"name": "c", "type": "categorical", "categories": ["a"]},
                {"name": "skip", "type": "ignored"},
                {"name": "label", "type": "categorical", "categories": ["no", "yes"]},
            ],
        },
        "narrow",
    )
    assert marginal_fidelity(low, high, narrow)["one_way"]["per_column"]["x"] == 1.0


def test_values_outside_the_schema_go_to_an_other_bucket() -> None:
    column = SCHEMA.columns[1]
    assert category_codes(np.array(["a", "zzz", "c", ""]), column).tolist() == [0, 3, 2, 3]
    declared = parse_schema(
        {
            "target": "label",
            "columns": [
                {"name": "c", "type": "categorical", "categories": ["a", "rest"], "other": "rest"},
                {"name": "label", "type": "categorical", "categories": ["no", "yes"]},
            ],
        },
        "declared other",
    ).columns[0]
    assert category_codes(np.array(["a", "zzz", "rest"]), declared).tolist() == [0, 1, 1]
    real = table([("5", "a", "", "no"), ("500", "q", "", "maybe")])
    coded = discretise(real, SCHEMA)
    assert coded.sizes == (12, 4, 3)  # 10 bins, missing, other
    assert coded.codes.tolist() == [[0, 0, 0], [11, 3, 2]]
    assert coded.other_share == {"x": 0.5, "c": 0.5, "label": 0.5}
    # An out-of-range synthetic value matches no in-range real value.
    found = marginal_fidelity(
        table([("500", "a", "", "no")]), table([("100", "a", "", "no")]), SCHEMA
    )
    assert found["one_way"]["per_column"]["x"] == 1.0
    assert found["other_share"] == {"synthetic": {"x": 1.0}, "real": {}}


def test_three_way_subsets_are_fixed_public_and_distinct() -> None:
    assert three_way_subsets(4, count=100) == list(itertools.combinations(range(4), 3))
    first = three_way_subsets(41)
    assert first == three_way_subsets(41) and len(first) == 100 == len(set(first))
    assert all(a < b < c < 41 for a, b, c in first)
    assert three_way_subsets(41, seed=1) != first
    assert three_way_subsets(3, count=0) == []


def test_tvds_match_an_independent_pandas_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(3)

    def random_rows(n: int, skew: float) -> list[tuple[str, ...]]:
        x = rng.uniform(-10, 110, n) * skew  # some values fall outside [0, 100]
        c = rng.choice(["a", "b", "c", "d"], n, p=[0.4, 0.3, 0.2, 0.1])
        y = rng.choice(["no", "yes"], n)
        return [(f"{v:.3f}", k, "", t) for v, k, t in zip(x, c, y, strict=True)]

    a, b = table(random_rows(500, 1.0)), table(random_rows(300, 0.8))
    found = marginal_fidelity(a, b, SCHEMA)

    def frame(raw: RawTable) -> pd.DataFrame:
        x = raw.column("x").astype(float)
        bins = np.where((x >= 0) & (x <= 100), np.minimum((x // 10), 9), -1).astype(int)
        c = np.where(np.isin(raw.column("c"), ["a", "b", "c"]), raw.column("c"), "OTHER")
        return pd.DataFrame({"x": bins, "c": c, "label": raw.column("label")})

    fa, fb = frame(a), frame(b)

    def reference(columns: list[str]) -> float:
        p = fa.groupby(columns).size() / len(fa)
        q = fb.groupby(columns).size() / len(fb)
        both = pd.concat([p, q], axis=1).fillna(0.0)
        return 0.5 * float((both[0] - both[1]).abs().sum())

    for name in ("x", "c", "label"):
        assert found["one_way"]["per_column"][name] == pytest.approx(reference([name]))
    pairs = [reference(list(p)) for p in itertools.combinations(["x", "c", "label"], 2)]
    assert found["two_way"]["mean"] == pytest.approx(np.mean(pairs))
    assert found["three_way"]["mean"] == pytest.approx(reference(["x", "c", "label"]))
    # The sparse count (joint domains too large for a dense vector) gives the same numbers.
    monkeypatch.setattr(marginals, "_DENSE_CELLS", 0)
    sparse = marginal_fidelity(a, b, SCHEMA)
    assert sparse["two_way"]["mean"] == pytest.approx(found["two_way"]["mean"])
    assert sparse["three_way"]["mean"] == pytest.approx(found["three_way"]["mean"])


def write_csv(path: Path, rows: list[list[str]]) -> Path:
    with path.open("w", newline="") as handle:
        csv.writer(handle).writerows(rows)
    return path


def test_cli_marginals_with_ml_and_bad_inputs(tmp_path: Path) -> None:
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps(SCHEMA.to_json()))
    header = ["x", "c", "skip", "label"]
    rng = np.random.default_rng(0)
    body = [
        [f"{rng.uniform(0, 100):.2f}", str(rng.choice(["a", "b", "c"])), "", str(label)]
        for label in ["no", "yes"] * 30
    ]
    real = write_csv(tmp_path / "real.csv", [header, *body])
    synth = write_csv(tmp_path / "synth.csv", [header, *body[::-1]])
    ledger = str(tmp_path / "ledger.jsonl")
    done = runner.invoke(
        app,
        ["evaluate", "--synthetic", str(synth), "--real", f"csv:{real}", "--schema", str(schema),
         "--metrics", "ml,marginals", "--seeds", "1", "--report", str(tmp_path / "report"),
         "--ledger", ledger, "--json"],
    )  # fmt: skip
    assert done.exit_code == 0, done.output
    result = json.loads(done.stdout)
    assert result["metrics_requested"] == ["accuracy", "roc_auc", "marginals"]
    assert result["metrics"]["marginals"]["two_way"]["mean"] == 0.0  # the same rows, reordered
    assert set(result["metrics"]["classifiers"]) == {"logreg", "gbm"}
    assert any("marginals on csv:" in r for r in result["non_private_contents"])
    page = (tmp_path / "report" / "report.md").read_text()
    assert "## Marginal fidelity" in page and "| 2-way TVD | 0.0000" in page
    assert json.loads((tmp_path / "report" / "report.json").read_text())["metrics"]["marginals"]

    # without --metrics a table gets what fits a table (ml and marginals), not fid
    default = runner.invoke(
        app,
        ["evaluate", "--synthetic", str(synth), "--real", f"csv:{real}", "--schema", str(schema),
         "--seeds", "1", "--ledger", ledger, "--json"],
    )  # fmt: skip
    assert default.exit_code == 0, default.output
    assert json.loads(default.stdout)["metrics_requested"] == [
        "accuracy", "roc_auc", "marginals",
    ]  # fmt: skip

    alone = runner.invoke(
        app,
        ["evaluate", "--synthetic", str(synth), "--real", f"csv:{real}", "--schema", str(schema),
         "--metrics", "marginals", "--ledger", ledger],
    )  # fmt: skip
    assert alone.exit_code == 0, alone.output
    assert "2-way TVD" in alone.stdout and "roc_auc" not in alone.stdout

    def one_line_error(args: list[str], code: int) -> str:
        bad = runner.invoke(app, ["evaluate", "--ledger", ledger, *args])
        assert bad.exit_code == code, bad.output
        assert "Traceback" not in bad.output
        lines = bad.stderr.strip().splitlines()
        assert len(lines) == 1, bad.stderr
        return lines[0]

    missing = write_csv(
        tmp_path / "missing.csv", [[h for h in header if h != "c"], ["1", "", "no"]]
    )
    for metrics in ("marginals", "ml,marginals", "ml"):
        line = one_line_error(
            ["--synthetic", str(missing), "--real", f"csv:{real}", "--schema", str(schema),
             "--metrics", metrics],
            4,
        )  # fmt: skip
        assert "'c'" in line and "missing.csv" in line
    line = one_line_error(
        ["--synthetic", str(synth), "--real", f"csv:{real}", "--schema", str(schema),
         "--metrics", "marginals", "--real-train", f"csv:{real}"],
        2,
    )  # fmt: skip
    assert "--real-train" in line
    line = one_line_error(
        ["--synthetic", str(synth), "--real", f"csv:{real}", "--schema", str(schema),
         "--metrics", "tvd3"],
        2,
    )  # fmt: skip
    assert "marginals" in line


def test_german_credit_real_rows_score_near_the_sampling_floor(tmp_path: Path) -> None:
    # The real training rows against the held-out ones: small TVDs, ordered 1 < 2 < 3-way
    # (200 held-out rows spread over ever more cells), no value outside the bundled schema.
    from dpsynth.data.sources import read_table

    train, _, schema = read_table("german-credit")
    test = read_table("german-credit:test")[0]
    assert schema is not None
    found = marginal_fidelity(train, test, schema)
    assert found["columns"] == 21 and found["two_way"]["count"] == 210
    assert 0 < found["one_way"]["mean"] < found["two_way"]["mean"] < found["three_way"]["mean"]
    assert found["two_way"]["mean"] < 0.15
    assert found["other_share"] == {"synthetic": {}, "real": {}}


def test_a_synthetic_number_column_written_empty_is_scored(tmp_path: Path) -> None:
    """A column the release dropped is written empty; both classifiers still score (gradient
    boosting's binning refused a column without any value)."""
    schema = parse_schema(
        {
            "target": "label",
            "columns": [
                {"name": "x", "type": "numeric", "min": 0, "max": 100, "missing": True},
                {"name": "c", "type": "categorical", "categories": ["a", "b", "c"]},
                {"name": "label", "type": "categorical", "categories": ["no", "yes"]},
            ],
        },
        "test schema",
    )
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(schema.to_json()))
    rng = np.random.default_rng(1)
    header = ["x", "c", "label"]
    real = [[f"{rng.uniform(0, 100):.1f}", str(rng.choice(["a", "b", "c"])), lab]
            for lab in ["no", "yes"] * 40]  # fmt: skip
    synth = [["", c, lab] for _, c, lab in real]
    done = runner.invoke(
        app,
        ["evaluate", "--synthetic", str(write_csv(tmp_path / "s.csv", [header, *synth])),
         "--real", f"csv:{write_csv(tmp_path / 'r.csv', [header, *real])}", "--schema",
         str(path), "--metrics", "ml", "--seeds", "1", "--ledger", str(tmp_path / "l.jsonl"),
         "--json"],
    )  # fmt: skip
    assert done.exit_code == 0, done.output
    scores = json.loads(done.stdout)["metrics"]["classifiers"]
    assert set(scores) == {"logreg", "gbm"}
