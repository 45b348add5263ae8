"""`train --privacy-unit COLUMN --max-rows-per-unit K` on a table whose people hold several
rows: the bound, the statement in every output, synthetic people with fresh keys and 1 … K
rows, a label held by one row never released, and the refusals (exit 2, nothing spent)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from dpsynth.cli import app
from dpsynth.ledger import Ledger
from dpsynth.privacy.mechanisms.randomness import PrivateRandomness
from dpsynth.training.data import load_recorded

runner = CliRunner()
K = 3


def _write_people(path: Path, people: int = 700, seed: int = 0) -> pd.DataFrame:
    """A clinical-like table: integer subject ids repeated over 1–6 visits, a one-row label."""
    rng = np.random.default_rng(seed)
    rows = []
    for subject in range(1, people + 1):
        visits = int(rng.choice([1, 1, 1, 2, 2, 3, 4, 6]))
        sex = rng.choice(["F", "M"])
        age = int(rng.integers(20, 90))
        for _ in range(visits):
            sick = rng.random() < (0.2 if sex == "F" else 0.35)
            rows.append(
                {
                    "subject_id": 10_000 + subject * 7,
                    "sex": sex,
                    "age": age,
                    "ward": rng.choice(["A", "B", "C"]),
                    "outcome": "positive" if sick else "negative",
                }
            )
    rows[5]["outcome"] = "unique-label-of-one-row"
    frame = pd.DataFrame(rows)
    frame.to_csv(path, index=False, quoting=csv.QUOTE_MINIMAL)
    return frame


def _schema(tmp_path: Path, data: Path) -> Path:
    result = runner.invoke(app, ["data", "schema", f"csv:{data}", "--target", "outcome"])
    assert result.exit_code == 0, result.output
    text = result.stdout if hasattr(result, "stdout") else result.output
    start = text.index("{")
    schema = json.loads(text[start : text.rindex("}") + 1])
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(schema))
    return path


def _train(tmp_path: Path, data: Path, schema: Path, *extra: str, out: str = "run"):
    args = ["train", "--method", "mst", "--data", f"csv:{data}", "--schema", str(schema)]
    args += ["--epsilon", "10", "--preset", "tiny", "--out", str(tmp_path / out)]
    args += ["--ledger", str(tmp_path / "ledger.jsonl"), "--device", "cpu", "--json", *extra]
    return runner.invoke(app, args)


def _spends(tmp_path: Path) -> list[dict]:
    path = tmp_path / "ledger.jsonl"
    return [e for e in Ledger(path).entries() if e["kind"] == "spend"] if path.exists() else []


@pytest.fixture(scope="module")
def unit_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp_path = tmp_path_factory.mktemp("unit")
    data = tmp_path / "visits.csv"
    frame = _write_people(data)
    schema = _schema(tmp_path, data)
    result = _train(
        tmp_path, data, schema, "--privacy-unit", "subject_id", "--max-rows-per-unit", str(K)
    )
    assert result.exit_code == 0, result.output
    out = tmp_path / "synth.csv"
    sampled = runner.invoke(
        app,
        [
            "sample",
            str(tmp_path / "run"),
            "--n",
            "3000",
            "--out",
            str(out),
            "--device",
            "cpu",
            "--ledger",
            str(tmp_path / "ledger.jsonl"),
            "--json",
        ],
    )
    assert sampled.exit_code == 0, sampled.output
    return {
        "tmp": tmp_path,
        "real": frame,
        "train": json.loads(result.stdout[result.stdout.index("{") :]),
        "synthetic": pd.read_csv(out, dtype=str, keep_default_na=False),
        "manifest": json.loads(Path(f"{out}.manifest.json").read_text())
        if Path(f"{out}.manifest.json").exists()
        else json.loads((tmp_path / "synth.manifest.json").read_text()),
        "config": json.loads((tmp_path / "run" / "config.json").read_text()),
    }


def test_the_statement_names_the_unit_in_train_ledger_config_and_manifest(unit_run) -> None:
    wanted = {"column": "subject_id", "max_rows_per_unit": K}
    assert {k: unit_run["train"]["privacy_unit"][k] for k in wanted} == wanted
    assert unit_run["config"]["data"]["privacy_unit"] == wanted
    spends = _spends(unit_run["tmp"])
    assert [s["command"] for s in spends] == ["schema-release", "train"]
    assert all(s["privacy_unit"] == wanted for s in spends)
    assert "per subject_id (at most 3 rows each)" in unit_run["manifest"]["privacy"]


def test_training_reads_at_most_k_rows_per_person(unit_run) -> None:
    real = unit_run["real"]
    bounded = int(np.minimum(real.groupby("subject_id").size(), K).sum())
    # the label held by one row is left out too (it did not survive the release)
    assert unit_run["config"]["data"]["n"] in (bounded, bounded - 1)
    assert unit_run["config"]["data"]["n"] < len(real)


def test_synthetic_people_have_fresh_keys_and_one_to_k_rows(unit_run) -> None:
    synthetic, real = unit_run["synthetic"], unit_run["real"]
    real_ids = set(real["subject_id"].astype(str))
    assert not real_ids & set(synthetic["subject_id"])
    sizes = synthetic.groupby("subject_id").size()
    assert sizes.min() >= 1 and sizes.max() <= K
    assert (sizes > 1).mean() > 0.1  # people with several rows, as the real ones
    shares = unit_run["config"]["privacy_unit"]["unit_sizes"]
    assert len(shares) == K and sum(shares) == pytest.approx(1.0)


def test_a_label_held_by_one_row_is_not_released(unit_run) -> None:
    schema = unit_run["config"]["data"]["schema"]
    target = next(c for c in schema["columns"] if c["name"] == "outcome")
    assert "unique-label-of-one-row" not in target["categories"]
    assert target["source"].startswith("released with DP")
    assert "unique-label-of-one-row" not in set(unit_run["synthetic"]["outcome"])
    assert set(unit_run["synthetic"]["outcome"]) <= {"positive", "negative"}


def test_reading_the_run_again_bounds_the_same_rows(unit_run) -> None:
    run = unit_run["tmp"] / "run"
    secret = json.loads((run / "private" / "secret.json").read_text())
    records = load_recorded(
        unit_run["config"]["data"], "run", None, PrivateRandomness.from_json(secret)
    )
    assert records.n == unit_run["config"]["data"]["n"]
    again = load_recorded(
        unit_run["config"]["data"], "run", None, PrivateRandomness.from_json(secret)
    )
    assert again.content_digest == records.content_digest
    assert bool((again.x == records.x).all())


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--privacy-unit", "patient"], "max-rows-per-unit"),
        (["--max-rows-per-unit", "3"], "--privacy-unit"),
        (["--privacy-unit", "subject_id", "--max-rows-per-unit", "0"], "≥ 1"),
        (["--privacy-unit", "nope", "--max-rows-per-unit", "3"], "not a column"),
        (["--privacy-unit", "outcome", "--max-rows-per-unit", "3"], "is the target"),
    ],
)
def test_bad_unit_flags_exit_2_with_nothing_spent(tmp_path: Path, extra, says) -> None:
    data = tmp_path / "visits.csv"
    _write_people(data, people=120)
    schema = _schema(tmp_path, data)
    result = _train(tmp_path, data, schema, *extra)
    assert result.exit_code == 2, result.output
    assert says in result.output
    assert _spends(tmp_path) == []


def test_a_unit_column_with_empty_cells_exits_2(tmp_path: Path) -> None:
    data = tmp_path / "visits.csv"
    frame = _write_people(data, people=120)
    schema = _schema(tmp_path, data)
    frame.loc[3, "subject_id"] = None
    frame.to_csv(data, index=False)
    result = _train(
        tmp_path, data, schema, "--privacy-unit", "subject_id", "--max-rows-per-unit", "2"
    )
    assert result.exit_code == 2, result.output
    assert "empty cell" in result.output and _spends(tmp_path) == []


def test_units_on_a_builtin_table_or_images_exit_2(tmp_path: Path) -> None:
    ledger = ["--ledger", str(tmp_path / "ledger.jsonl"), "--device", "cpu"]
    builtin = runner.invoke(
        app,
        [
            "train",
            "--method",
            "mst",
            "--data",
            "german-credit",
            "--epsilon",
            "5",
            "--out",
            str(tmp_path / "a"),
            "--privacy-unit",
            "id",
            "--max-rows-per-unit",
            "2",
            *ledger,
        ],
    )
    assert builtin.exit_code == 2 and "no unit column" in builtin.output
    images = runner.invoke(
        app,
        [
            "train",
            "--method",
            "dpkernel",
            "--data",
            "digits",
            "--epsilon",
            "5",
            "--out",
            str(tmp_path / "b"),
            "--privacy-unit",
            "id",
            "--max-rows-per-unit",
            "2",
            *ledger,
        ],
    )
    assert images.exit_code == 2 and "holds no person" in images.output
    assert _spends(tmp_path) == []


def test_one_unit_per_data_set_in_the_ledger(tmp_path: Path) -> None:
    data = tmp_path / "visits.csv"
    _write_people(data, people=300)
    schema = _schema(tmp_path, data)
    first = _train(tmp_path, data, schema, out="per-row")
    assert first.exit_code == 0, first.output
    spent = len(_spends(tmp_path))
    second = _train(
        tmp_path, data, schema, "--privacy-unit", "subject_id", "--max-rows-per-unit", "2",
        out="per-unit",
    )  # fmt: skip
    assert second.exit_code == 2 and "would bound neither" in second.output
    assert len(_spends(tmp_path)) == spent


def test_a_partitioned_release_groups_people_within_each_partition(unit_run) -> None:
    from dpsynth.sampling import sample_table

    out = unit_run["tmp"] / "parts"
    result = sample_table(
        unit_run["tmp"] / "run", 1200, out, seed=3, partitions=2, workers=1,
        device="cpu", ledger_path=unit_run["tmp"] / "ledger.jsonl",
    )  # fmt: skip
    assert result["privacy_unit"]["column"] == "subject_id"
    frames = [pd.read_parquet(path) for path in sorted(out.glob("part-*.parquet"))]
    assert len(frames) == 2
    keys = [set(frame["subject_id"]) for frame in frames]
    assert not keys[0] & keys[1]  # a synthetic person never spans two partitions
    sizes = pd.concat(frames).groupby("subject_id").size()
    assert sizes.max() <= K and (sizes > 1).any()
    assert not set(unit_run["real"]["subject_id"].astype(str)) & (keys[0] | keys[1])


@pytest.mark.parametrize("method", ["dpkernel", "rdpgan"])
def test_the_dp_sgd_table_backends_sample_people_and_scale_for_k_rows(
    tmp_path: Path, method: str
) -> None:
    data = tmp_path / "visits.csv"
    _write_people(data, people=300)
    schema = _schema(tmp_path, data)
    args = ["train", "--method", method, "--data", f"csv:{data}", "--schema", str(schema)]
    args += ["--epsilon", "5", "--out", str(tmp_path / "run"), "--preset", "tiny", "--json"]
    args += ["--ledger", str(tmp_path / "ledger.jsonl"), "--device", "cpu"]
    trained = runner.invoke(
        app, [*args, "--privacy-unit", "subject_id", "--max-rows-per-unit", "3"]
    )
    assert trained.exit_code == 0, trained.output
    summary = json.loads(trained.stdout[trained.stdout.index("{") :])
    assert summary["privacy_unit"]["max_rows_per_unit"] == 3
    assert all(s["privacy_unit"]["max_rows_per_unit"] == 3 for s in _spends(tmp_path))


def test_the_per_row_advice_names_an_id_column_that_is_not_a_row_index():
    from dpsynth.data.schema_file import parse_schema
    from dpsynth.training.table_units import id_columns_advice

    schema = parse_schema(
        {"target": "passed", "columns": [
            {"name": "rownames", "type": "id"}, {"name": "School", "type": "id"},
            {"name": "score", "type": "numeric", "min": 0, "max": 1},
            {"name": "passed", "type": "categorical", "categories": ["no", "yes"]}]},
        "test",
    )  # fmt: skip
    advice = id_columns_advice(schema)
    assert "--privacy-unit School " in advice and "rownames, School" in advice
    only_index = parse_schema(
        {"target": "passed", "columns": [
            {"name": "rownames", "type": "id"},
            {"name": "score", "type": "numeric", "min": 0, "max": 1},
            {"name": "passed", "type": "categorical", "categories": ["no", "yes"]}]},
        "test",
    )  # fmt: skip
    assert "--privacy-unit rownames " in id_columns_advice(only_index)
