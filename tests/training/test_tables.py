"""Tables: schema, loading, encoding round trip, the schema release mechanism, train → sample →
evaluate on CSVs, and the built-in german-credit split."""

from __future__ import annotations

import csv
import json
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from dpsynth.cli import app
from dpsynth.data.builtin_tables import TABLES_DIR
from dpsynth.data.schema import DATA_SOURCE
from dpsynth.data.schema_draft import draft_schema
from dpsynth.data.schema_file import parse_schema
from dpsynth.data.sources import load_table, read_table
from dpsynth.data.table_codec import TableCodec, encode_table, read_csv_table
from dpsynth.errors import DataError, UsageError
from dpsynth.ledger import Ledger
from dpsynth.privacy.accounting.compose import compose_epsilon
from dpsynth.privacy.mechanisms.histograms import (
    category_counts,
    noisy,
    numeric_bin_edges,
    numeric_counts,
    plan_histogram_release,
    release_schema_statistics,
)

runner = CliRunner()

ROWS = [
    ["age", "job", "city", "score", "note", "label"],
    ["34", " clerk", "Paris", "0.5", "x", "yes"],
    ["51", "?", "Lyon", "1.25", "y", "no"],
    ["28", "nurse", " Paris", "-2.0", "z", "no"],
    ["63", "clerk", "Nice", "3.5", "w", "yes"],
]


def write_csv(path: Path, rows: list[list[str]]) -> Path:
    with path.open("w", newline="") as handle:
        csv.writer(handle).writerows(rows)
    return path


def small_schema(**changes: object) -> dict:
    schema = {
        "target": "label",
        "columns": [
            {"name": "age", "type": "integer", "min": 18, "max": 90},
            {"name": "job", "type": "categorical", "categories": ["clerk", "nurse", "?"]},
            {"name": "city", "type": "categorical", "categories": ["Paris", "Lyon", "Nice"]},
            {"name": "score", "type": "numeric", "min": -5, "max": 5},
            {"name": "note", "type": "ignored"},
            {"name": "label", "type": "categorical", "categories": ["no", "yes"]},
        ],
    }
    schema.update(changes)
    return schema


def test_csv_loader_strips_blanks_keeps_missing_token_as_category(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "t.csv", ROWS)
    raw = read_csv_table(path)
    assert raw.header == tuple(ROWS[0]) and raw.n == 4
    assert raw.column("job").tolist() == ["clerk", "?", "nurse", "clerk"]
    table = encode_table(raw, parse_schema(small_schema()), "csv:t", "csv")
    assert table.shape == (1 + 3 + 3 + 1,)
    assert table.y.tolist() == [1, 0, 0, 1] and table.classes == ("no", "yes")
    # job block: clerk, ?, nurse, clerk
    assert table.x[:, 1:4].argmax(1).tolist() == [0, 2, 1, 0]
    # integer scaled from [18, 90] to [-1, 1]
    assert table.x[0, 0].item() == pytest.approx(2 * (34 - 18) / 72 - 1)
    info = table.info().to_json()
    assert info["modality"] == "table" and info["schema"]["target"] == "label"


def test_csv_loader_errors_are_data_errors(tmp_path: Path) -> None:
    schema = parse_schema(small_schema())
    bad_header = write_csv(tmp_path / "h.csv", [ROWS[0][::-1], *ROWS[1:]])
    with pytest.raises(DataError, match="header does not match"):
        encode_table(read_csv_table(bad_header), schema, "s", "csv")
    bad_number = [r[:] for r in ROWS]
    bad_number[2][3] = "high"
    with pytest.raises(DataError, match="'score' is numeric but row 3"):
        encode_table(read_csv_table(write_csv(tmp_path / "n.csv", bad_number)), schema, "s", "csv")
    # a missing-value token in a number column without `missing`: named, with the way out
    bad_number[2][3] = "?"
    with pytest.raises(DataError, match=r"'score' row 3 is missing \('\?'\).*\"missing\": true"):
        encode_table(read_csv_table(write_csv(tmp_path / "m.csv", bad_number)), schema, "s", "csv")
    unlisted = [r[:] for r in ROWS]
    unlisted[1][2] = "Rome"
    raw = read_csv_table(write_csv(tmp_path / "u.csv", unlisted))
    with pytest.raises(DataError, match="not in the schema's category list"):
        encode_table(raw, schema, "s", "csv")
    # an `other` category absorbs unlisted values
    other = small_schema()
    other["columns"][2]["other"] = "Nice"
    table = encode_table(raw, parse_schema(other), "s", "csv")
    assert table.x[0, 4:7].argmax().item() == 2
    with pytest.raises(UsageError, match="must be categorical"):
        parse_schema(small_schema(target="age"))


def test_encode_decode_round_trip_preserves_header_order_dtypes_strings(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "t.csv", ROWS)
    raw = read_csv_table(path)
    schema = parse_schema(small_schema())
    table = encode_table(raw, schema, "s", "csv")
    codec = TableCodec(schema)
    frame = codec.decode(table.x.numpy(), table.y.numpy(), np.random.default_rng(0))
    assert list(frame.columns) == ROWS[0]
    text = codec.csv_text(frame, header=True)
    back = pd.read_csv(pd.io.common.StringIO(text), dtype=str, keep_default_na=False)
    assert back["age"].tolist() == ["34", "51", "28", "63"]  # integers stay integers
    assert back["job"].tolist() == ["clerk", "?", "nurse", "clerk"]
    assert back["city"].tolist() == ["Paris", "Lyon", "Paris", "Nice"]
    assert [float(v) for v in back["score"]] == [0.5, 1.25, -2.0, 3.5]
    assert back["label"].tolist() == ["yes", "no", "no", "yes"]
    assert back["note"].tolist() == ["", "", "", ""]  # ignored: written empty
    # numbers outside the public bounds are clipped, integers rounded into them
    clipped = codec.decode(np.full((1, codec.dim), 5.0), np.array([0]), np.random.default_rng(0))
    assert clipped["age"].iloc[0] == 90 and clipped["score"].iloc[0] == 5.0


def test_draft_marks_every_data_derived_entry(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "t.csv", ROWS)
    result = runner.invoke(app, ["data", "schema", f"csv:{path}"])
    assert result.exit_code == 0, result.output
    drafted = json.loads(result.stdout)
    kinds = {c["name"]: c["type"] for c in drafted["columns"]}
    assert kinds == {
        "age": "integer",  # 4 distinct whole numbers: still a number, never '(other)' text
        "job": "categorical",
        "city": "categorical",
        "score": "numeric",
        "note": "categorical",
        "label": "categorical",
    }
    assert drafted["target"] == "label"
    assert all(c["source"] == DATA_SOURCE for c in drafted["columns"])
    score = next(c for c in drafted["columns"] if c["name"] == "score")
    assert (score["min"], score["max"]) == (-2, 3.5)
    schema = parse_schema(drafted)
    assert schema.data_derived() == [c["name"] for c in drafted["columns"]]
    many = draft_schema(["n", "t"], [[str(i) for i in range(30)], ["a", "b"] * 15], "t")
    assert many.columns[0].type == "integer" and many.columns[0].max == 29


def _train(
    tmp_path: Path, *extra: str, data: str = "german-credit", out: str = "run", epsilon: str = "2"
) -> object:
    args = ["train", "--method", "dpkernel", "--data", data, "--epsilon", epsilon]
    args += ["--preset", "tiny", "--set", "steps=10", "--out", str(tmp_path / out)]
    args += ["--ledger", str(tmp_path / "ledger.jsonl"), "--device", "cpu", "--json", *extra]
    return runner.invoke(app, args)


def _german_subset(tmp_path: Path, rows: int = 300) -> tuple[Path, Path]:
    """The first rows of german-credit as a user's CSV, with a drafted schema."""
    lines = (TABLES_DIR / "german_credit.csv").read_text().splitlines()[: rows + 1]
    path = tmp_path / "g.csv"
    path.write_text("\n".join(lines) + "\n")
    drafted = runner.invoke(app, ["data", "schema", f"csv:{path}"])
    schema = tmp_path / "g.schema.json"
    schema.write_text(drafted.stdout)
    return path, schema


def test_unreviewed_schema_is_released_with_dp_by_default_or_declared_public(
    tmp_path: Path,
) -> None:
    path, schema = _german_subset(tmp_path)
    missing = _train(tmp_path, data=f"csv:{path}")
    assert missing.exit_code == 2 and "--schema" in missing.output
    # the safe default: the drafted entries are released with DP out of --epsilon (a quarter
    # of 20 is enough for 300 rows: see the refusal test below)
    (tmp_path / "default").mkdir()
    released = _train(
        tmp_path / "default", "--schema", str(schema), data=f"csv:{path}", epsilon="20"
    )
    assert released.exit_code == 0, released.output
    entries = Ledger(tmp_path / "default" / "ledger.jsonl").entries()
    assert entries[0]["command"] == "schema-release"
    report = json.loads(released.stdout)
    assert report["schema_release"]["epsilon"] == pytest.approx(0.25 * 20, rel=0.02)
    # dpkernel scales a number by its range: its ends are not stretched to the padded range
    assert report["schema_release"]["end_bins_reach_padded_range"] is False
    config = json.loads((tmp_path / "default" / "run" / "config.json").read_text())
    kept = {c["name"]: c for c in config["data"]["schema"]["columns"]}
    assert len(kept["purpose"]["categories"]) > 3  # the release kept values, not (other) alone
    assert kept["credit_amount"]["type"] == "integer" and kept["credit_amount"]["max"] > 0
    config = json.loads((tmp_path / "default" / "run" / "config.json").read_text())
    sources = {c["name"]: c.get("source", "") for c in config["data"]["schema"]["columns"]}
    assert all(s.startswith("released with DP") for n, s in sources.items() if n != "credit_risk")
    accepted = _train(tmp_path, "--schema", str(schema), "--schema-public", data=f"csv:{path}")
    assert accepted.exit_code == 0, accepted.output
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    sources = {c.get("source") for c in config["data"]["schema"]["columns"]}
    assert sources == {"declared public by the user (--schema-public)"}


def test_a_schema_release_too_small_to_keep_anything_is_refused_before_any_spend(
    tmp_path: Path,
) -> None:
    """300 rows at ε = 2: the default release (0.5) would need ~180 rows per category value
    and per range bin, so every list would be '(other)' and every number empty."""
    path, schema = _german_subset(tmp_path)
    for extra in ((), ("--schema-epsilon", "0.5")):
        result = _train(tmp_path, "--schema", str(schema), *extra, data=f"csv:{path}")
        assert result.exit_code == 2, result.output
        text = " ".join(result.output.split())
        assert "too small to release the schema entries" in text and "300 rows" in text
        assert "Nothing was spent" in text and "--schema-public" in text
        needed = float(text.rsplit("--schema-epsilon ", 1)[1].split()[0])
        assert 1.0 < needed < 20.0
        ledger = tmp_path / "ledger.jsonl"
        assert not ledger.exists() or not Ledger(ledger).entries()
    assert "the default --schema-epsilon (0.5, 25% of --epsilon)" in " ".join(
        _train(tmp_path, "--schema", str(schema), data=f"csv:{path}").output.split()
    )


def test_data_schema_says_what_a_small_tables_release_needs(tmp_path: Path) -> None:
    path, _ = _german_subset(tmp_path)
    drafted = runner.invoke(app, ["data", "schema", f"csv:{path}"])
    assert drafted.exit_code == 0
    text = " ".join(drafted.stderr.split())
    assert "300 rows: a DP release of the marked entries keeps" in text
    assert "--schema-epsilon" in text


def test_image_only_methods_refuse_tables(tmp_path: Path) -> None:
    for method in ("pge", "psg", "dpaf"):
        result = runner.invoke(
            app,
            ["train", "--method", method, "--data", "german-credit", "--epsilon", "1",
             "--out", str(tmp_path / method), "--ledger", str(tmp_path / "l.jsonl")],
        )  # fmt: skip
        assert result.exit_code == 2, result.output
        assert f"--method {method} is image-only" in result.output
        assert "dpkernel" in result.output
    assert not (tmp_path / "l.jsonl").exists() or not Ledger(tmp_path / "l.jsonl").entries()


def test_schema_epsilon_release_is_in_the_ledger_and_composes(tmp_path: Path) -> None:
    path, schema_path = _german_subset(tmp_path, rows=400)
    schema = json.loads(schema_path.read_text())
    for column in schema["columns"]:
        if column["name"] == "credit_risk":
            column.pop("source")  # the label set is declared
    schema_path.write_text(json.dumps(schema))
    # 400 rows: a release of 2 keeps what a quarter of the rows hold (1 would be refused)
    result = _train(tmp_path, "--schema", str(schema_path), "--schema-epsilon", "2",
                    data=f"csv:{path}", epsilon="4")  # fmt: skip
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    entries = [e for e in Ledger(tmp_path / "ledger.jsonl").entries() if e["kind"] == "spend"]
    release, training = entries
    assert release["command"] == "schema-release" and training["command"] == "train"
    assert release["run_id"] == training["run_id"] == summary["run_id"]
    types = [e["type"] for e in release["events"]]
    assert types == ["threshold_delta", "gaussian"]
    delta = training["delta"]
    assert float(release["epsilon"]) <= 2.0 + 1e-9
    # the dataset's total is --epsilon: the release composed in as a prior spend
    total = compose_epsilon([*release["events"], *training["events"]], delta).epsilon
    assert total <= 4.0 and total > 3.9
    assert float(training["total_epsilon"]) == pytest.approx(total, rel=1e-3)
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["schema_release"]["ledger_seq"] == release["seq"]
    columns = config["data"]["schema"]["columns"]
    released = [c for c in columns if c["name"] != "credit_risk"]
    assert all(c["source"].startswith("released with DP") for c in released)
    # every released list names the category its unlisted values merge into
    assert all(c["other"] in c["categories"] for c in released if c["type"] == "categorical")
    # the sample's statement composes the schema release with the training spend
    out = tmp_path / "s.csv"
    ledger = str(tmp_path / "ledger.jsonl")
    sampled = runner.invoke(
        app, ["sample", str(tmp_path / "run"), "--n", "20", "--out", str(out), "--ledger", ledger]
    )
    assert sampled.exit_code == 0, sampled.output
    manifest = json.loads((tmp_path / "s.csv.manifest.json").read_text())
    assert manifest["privacy_source"]["epsilon"] == pytest.approx(total, rel=1e-6)
    assert "schema release" in manifest["privacy"]
    # a too small total refuses before anything is spent
    before = len(Ledger(tmp_path / "ledger.jsonl").entries())
    again = _train(tmp_path, "--schema", str(schema_path), "--schema-epsilon", "3",
                   data=f"csv:{path}", out="run2")  # fmt: skip
    assert again.exit_code == 2 and "below --epsilon" in again.output
    assert len(Ledger(tmp_path / "ledger.jsonl").entries()) == before


def test_threshold_delta_is_taken_off_the_delta() -> None:
    gaussian = {"type": "gaussian", "noise_multiplier": 2.0, "count": 1}
    with_threshold = compose_epsilon([gaussian, {"type": "threshold_delta", "delta": 4e-6}], 1e-5)
    assert with_threshold.epsilon == pytest.approx(compose_epsilon([gaussian], 6e-6).epsilon)
    assert with_threshold.delta == 1e-5
    assert math.isinf(compose_epsilon([{"type": "threshold_delta", "delta": 2e-5}], 1e-5).epsilon)


def test_histogram_sensitivity_one_per_column_and_noise_std() -> None:
    rng = np.random.default_rng(0)
    values = rng.normal(0, 100, size=500)
    edges = numeric_bin_edges()
    counts = numeric_counts(values, edges)
    # one row added changes exactly one bin by exactly 1 (L2 sensitivity 1 per column)
    for extra in (0.0, -3.7, 1e6, 5e20, -np.inf):
        change = numeric_counts(np.append(values, extra), edges) - counts
        assert np.abs(change).sum() == 1 and change.max() == 1
    names, cat = category_counts(np.array(["a", "b", "a"]))
    _, cat_plus = category_counts(np.array(["a", "b", "a", "b"]))
    assert names == ["a", "b"] and (cat_plus - cat).tolist() == [0, 1]
    # the noise has the planned std (empirical, 20,000 draws) and zero mean
    plan = plan_histogram_release(1.0, 1e-5, columns=4, categorical_columns=2)
    assert plan.noise_std == pytest.approx(plan.noise_multiplier * 2.0)
    generator = torch.Generator().manual_seed(1)
    draws = noisy(np.zeros(20000), plan.noise_std, generator)
    assert draws.std() == pytest.approx(plan.noise_std, rel=0.03)
    assert abs(draws.mean()) < 4 * plan.noise_std / math.sqrt(20000)
    # the threshold makes a count of 1 pass with probability at most δ_t / (categorical columns)
    assert plan.threshold > 1 + 4 * plan.noise_std
    assert compose_epsilon(list(plan.events), 1e-5).epsilon <= 1.0 + 1e-9


def test_release_keeps_frequent_categories_and_bounds_the_bulk() -> None:
    plan = plan_histogram_release(5.0, 1e-6, columns=2, categorical_columns=1)
    rows = 20000
    values = np.array(["common"] * (rows - 3) + ["rare"] * 3)
    numbers = np.random.default_rng(0).uniform(10, 60, size=rows)
    categories, bounds = release_schema_statistics(
        {"c": values}, {"x": numbers}, plan, torch.Generator().manual_seed(0)
    )
    assert categories == {"c": ["common"]}  # the rare value (3 rows) stays private
    low, high = bounds["x"]
    assert 5 <= low <= 10 and 60 <= high <= 91


def test_sample_streams_csv_and_evaluate(tmp_path: Path) -> None:
    trained = _train(tmp_path)
    assert trained.exit_code == 0, trained.output
    out = tmp_path / "synth.csv"
    sampled = runner.invoke(
        app,
        ["sample", str(tmp_path / "run"), "--n", "250", "--out", str(out), "--batch-size", "64",
         "--ledger", str(tmp_path / "ledger.jsonl"), "--device", "cpu", "--json"],
    )  # fmt: skip
    assert sampled.exit_code == 0, sampled.output
    manifest = json.loads((tmp_path / "synth.csv.manifest.json").read_text())
    header = (TABLES_DIR / "german_credit.csv").read_text().splitlines()[0]
    lines = out.read_text().splitlines()
    assert lines[0] == header and len(lines) == 251 and lines.count(header) == 1
    frame = pd.read_csv(out, dtype=str)
    schema = read_table("german-credit")[2]
    for column in schema.columns:
        if column.type == "categorical":
            assert set(frame[column.name]) <= set(column.categories)
        else:
            assert frame[column.name].str.fullmatch(r"-?\d+").all()  # integer dtype kept
    assert Counter(frame["credit_risk"]) == {"1": 125, "2": 125}  # balanced labels
    import hashlib

    assert manifest["output_sha256"] == hashlib.sha256(out.read_bytes()).hexdigest()
    releases = [e for e in Ledger(tmp_path / "ledger.jsonl").entries() if e["kind"] == "release"]
    assert releases and releases[-1]["output_sha256"] == manifest["output_sha256"]
    again = runner.invoke(
        app, ["sample", str(tmp_path / "run"), "--n", "5", "--out", str(out), "--device", "cpu",
              "--ledger", str(tmp_path / "ledger.jsonl")],
    )  # fmt: skip
    assert again.exit_code == 2 and "--force" in again.output
    evaluated = runner.invoke(
        app,
        ["evaluate", "--synthetic", str(out), "--real", "german-credit:test", "--metrics", "ml",
         "--seeds", "2", "--report", str(tmp_path / "report"), "--json",
         "--ledger", str(tmp_path / "ledger.jsonl")],
    )  # fmt: skip
    assert evaluated.exit_code == 0, evaluated.output
    result = json.loads(evaluated.stdout)
    for kind in ("logreg", "gbm"):
        scores = result["metrics"]["classifiers"][kind]
        assert 0.0 <= scores["accuracy"]["mean"] <= 1.0 and len(scores["roc_auc"]["per_seed"]) == 2
    assert (tmp_path / "report" / "report.md").read_text().count("| synthetic |") == 2
    assert result["release"] is not None
    # the statement is the ledger spend's, not the manifest's words taken on trust
    assert result["privacy"] == manifest["privacy"] and manifest["privacy"].startswith("(ε ≤")
    elsewhere = runner.invoke(
        app,
        ["evaluate", "--synthetic", str(out), "--real", "german-credit:test", "--metrics", "ml",
         "--seeds", "1", "--json", "--ledger", str(tmp_path / "other.jsonl")],
    )  # fmt: skip
    assert elsewhere.exit_code == 0, elsewhere.output
    unchecked = json.loads(elsewhere.stdout)
    assert "privacy" not in unchecked
    assert any("is not reported" in w for w in unchecked["warnings"])


def test_evaluate_real_vs_real_on_german_credit(tmp_path: Path) -> None:
    # Real training rows as the "synthetic" CSV: a sanity check of the classifiers and metrics.
    raw, _, _ = read_table("german-credit")
    synth = tmp_path / "real-train.csv"
    pd.DataFrame({h: c for h, c in zip(raw.header, raw.columns, strict=True)}).to_csv(
        synth, index=False
    )
    result = runner.invoke(
        app,
        ["evaluate", "--synthetic", str(synth), "--real", "german-credit:test", "--metrics", "ml",
         "--seeds", "1", "--json", "--ledger", str(tmp_path / "l.jsonl")],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    scores = json.loads(result.stdout)["metrics"]["classifiers"]
    assert 0.70 <= scores["logreg"]["accuracy"]["mean"] <= 0.85
    assert 0.72 <= scores["logreg"]["roc_auc"]["mean"] <= 0.90
    assert 0.65 <= scores["gbm"]["roc_auc"]["mean"] <= 0.90
    bad = runner.invoke(app, ["evaluate", "--synthetic", str(synth), "--real",
                              "german-credit:test", "--metrics", "fid"])  # fmt: skip
    assert bad.exit_code == 2 and "not a table metric" in bad.output


def test_german_credit_split_is_stratified_80_20_random_state_0() -> None:
    from sklearn.model_selection import train_test_split

    train, test = load_table("german-credit"), load_table("german-credit:test")
    assert (train.n, test.n) == (800, 200)
    full = read_csv_table(TABLES_DIR / "german_credit.csv")
    target = full.column("credit_risk")
    index_train, index_test = train_test_split(
        np.arange(full.n), test_size=0.2, random_state=0, stratify=target
    )
    raw_test = read_table("german-credit:test")[0]
    raw_train = read_table("german-credit")[0]
    for name in full.header:
        assert raw_test.column(name).tolist() == full.column(name)[index_test].tolist()
        assert raw_train.column(name).tolist() == full.column(name)[index_train].tolist()
    assert Counter(test.y.tolist()) == {0: 140, 1: 60}
    assert Counter(train.y.tolist()) == {0: 560, 1: 240}
    assert train.content_digest != test.content_digest
    assert (TABLES_DIR / "README.md").read_text().count("CC BY 4.0") == 1


def test_table_run_resumes_to_the_same_weights(tmp_path: Path) -> None:
    from dpsynth.training import train_run

    common = dict(
        method="dpkernel", data="german-credit", epsilon=2, preset="tiny", device="cpu",
        overrides={"steps": "12"}, privacy_seed=7,
    )  # fmt: skip
    train_run(out=tmp_path / "whole", ledger_path=tmp_path / "a.jsonl", **common)
    part = train_run(
        out=tmp_path / "part", ledger_path=tmp_path / "b.jsonl", stop_after_steps=5, **common
    )
    assert part["interrupted"] and part["steps"] == 5
    done = train_run(out=tmp_path / "part", ledger_path=tmp_path / "b.jsonl", resume=True,
                     method=None, data=None, epsilon=None)  # fmt: skip
    assert done["steps"] == 12 and done["ledger_status"] == "completed"
    from safetensors.torch import load_file

    whole = load_file(tmp_path / "whole" / "checkpoint.safetensors")
    resumed = load_file(tmp_path / "part" / "checkpoint.safetensors")
    for key in whole:
        if key.startswith("trainer/generator."):
            assert torch.equal(whole[key], resumed[key]), key


def test_table_flags_are_checked_before_anything_is_spent(tmp_path: Path) -> None:
    on_images = _train(tmp_path, "--schema-public", data="digits")
    assert on_images.exit_code == 2 and "are for tables" in on_images.output
    both = _train(tmp_path, "--schema-public", "--schema-epsilon", "1")
    assert both.exit_code == 2 and "exclude each other" in both.output
    nothing = _train(tmp_path, "--schema-epsilon", "1")  # the bundled schema is public already
    assert nothing.exit_code == 2 and "no entry read off the data" in nothing.output
    no_schema = runner.invoke(app, ["data", "inspect", f"csv:{TABLES_DIR / 'german_credit.csv'}"])
    assert no_schema.exit_code == 2 and "--schema" in no_schema.output
    assert (
        not (tmp_path / "ledger.jsonl").exists() or not Ledger(tmp_path / "ledger.jsonl").entries()
    )


CENSUS_TEST = (
    Path(__file__).resolve().parents[3] / "shared" / "data" / "census_income_kdd_test.csv.gz"
)


@pytest.mark.skipif(not CENSUS_TEST.is_file(), reason=f"{CENSUS_TEST} is absent (not bundled)")
def test_census_rows_with_blanks_and_missing_tokens_round_trip(tmp_path: Path) -> None:
    import gzip

    with gzip.open(CENSUS_TEST, "rt") as handle:
        lines = [next(handle) for _ in range(1501)]
    path = tmp_path / "census.csv"
    path.write_text("".join(lines))
    drafted = json.loads(runner.invoke(app, ["data", "schema", f"csv:{path}"]).stdout)
    for column in drafted["columns"]:
        column.pop("source")
        if column["name"] == "instance_weight":
            column.update(type="ignored")
            for key in ("min", "max", "categories"):
                column.pop(key, None)
    schema_path = tmp_path / "census.schema.json"
    schema_path.write_text(json.dumps(drafted))
    schema = parse_schema(drafted)
    assert schema.target == "income" and schema.classes == ("- 50000.", "50000+.")
    assert (
        "?"
        in next(c for c in schema.columns if c.name == "migration_prev_res_in_sunbelt").categories
    )
    trained = _train(tmp_path, "--schema", str(schema_path), data=f"csv:{path}")
    assert trained.exit_code == 0, trained.output
    out = tmp_path / "synth.csv"
    ledger = str(tmp_path / "ledger.jsonl")
    args = ["sample", str(tmp_path / "run"), "--n", "100", "--out", str(out), "--ledger", ledger]
    sampled = runner.invoke(app, [*args, "--device", "cpu"])
    assert sampled.exit_code == 0, sampled.output
    frame = pd.read_csv(out, dtype=str, keep_default_na=False)
    assert list(frame.columns) == [c.name for c in schema.columns]
    assert (frame["instance_weight"] == "").all()
    assert set(frame["income"]) <= {"- 50000.", "50000+."}


def test_target_weights_set_the_generated_label_proportions() -> None:
    from dpsynth.methods.dpkernel import DPKernelMethod, weighted_labels
    from dpsynth.privacy.accounting.plan import PrivacyTarget

    labels = weighted_labels(32, (0.94, 0.06))
    assert labels.tolist() == [0] * 29 + [1] * 3  # one each, then 30 by largest remainder
    assert Counter(weighted_labels(10, (0.5, 0.3, 0.2)).tolist()) == {0: 5, 1: 3, 2: 2}
    assert Counter(weighted_labels(3, (0.98, 0.01, 0.01)).tolist()) == {0: 1, 1: 1, 2: 1}
    obj = small_schema()
    obj["columns"][-1]["weights"] = [3, 1]
    schema = parse_schema(obj)
    assert schema.target_column.weights == (0.75, 0.25)
    assert parse_schema(schema.to_json()).target_column.weights == (0.75, 0.25)
    with pytest.raises(UsageError, match="one positive number per category"):
        parse_schema(small_schema(columns=[*obj["columns"][:-1], {**obj["columns"][-1],
                                                                   "weights": [1]}]))  # fmt: skip
    raw = read_csv_table(TABLES_DIR / "german_credit.csv")
    bundled = read_table("german-credit")[2].to_json()
    bundled["columns"][-1]["weights"] = [0.7, 0.3]
    info = encode_table(raw, parse_schema(bundled), "g", "csv").info()
    method = DPKernelMethod()
    config = method.config("tiny", {"steps": "1"}, info)
    plan = method.plan(info, PrivacyTarget(5.0, 1e-5), config)
    trainer = method.trainer(info, config, plan, torch.device("cpu"), 0)
    seen = []
    original = trainer.net.forward

    def spy(z, onehot):
        seen.append(onehot.argmax(1))
        return original(z, onehot)

    trainer.net.forward = spy  # type: ignore[method-assign]
    trainer.step(torch.zeros(0, info.shape[0]), torch.zeros(0, dtype=torch.int64))
    assert Counter(seen[0].tolist()) == {0: 22, 1: 10}


def test_evaluate_names_the_synthetic_columns_its_schema_does_not_score(tmp_path: Path) -> None:
    schema = json.loads((TABLES_DIR / "german_credit.schema.json").read_text())
    dropped = schema["columns"].pop(1)["name"]
    (tmp_path / "s.json").write_text(json.dumps(schema))
    table = str(TABLES_DIR / "german_credit.csv")
    result = runner.invoke(
        app,
        ["evaluate", "--synthetic", table, "--real", f"csv:{table}", "--schema",
         str(tmp_path / "s.json"), "--metrics", "ml", "--seeds", "1", "--json",
         "--ledger", str(tmp_path / "ledger.jsonl")],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    warnings = json.loads(result.stdout)["warnings"]
    assert any("not scored" in w and repr(dropped) in w for w in warnings), warnings
