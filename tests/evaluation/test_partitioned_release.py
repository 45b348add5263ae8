"""`evaluate` on a partitioned release: a folder of Parquet parts, a glob of them or one Parquet
file, read batch by batch. The marginals are exact counts (the same figures as the CSV of the
same rows, in memory), the classifiers train on a seeded row sample that the report states
(every row of a small release: the same scores as in memory), and a folder that is empty,
holds no Parquet or parts that differ is one clear error."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from dpsynth.cli import app
from dpsynth.data.schema_file import parse_schema
from dpsynth.data.table_codec import read_csv_table
from dpsynth.errors import DataError, UsageError
from dpsynth.evaluation.marginals import marginal_fidelity
from dpsynth.evaluation.report import run_evaluation
from dpsynth.evaluation.table_input import open_synthetic
from dpsynth.evaluation.table_pass import RowSample, read_pass
from dpsynth.evaluation.table_report import run_table_evaluation

runner = CliRunner()

SCHEMA = {
    "target": "label",
    "columns": [
        {"name": "x", "type": "numeric", "min": 0, "max": 100, "missing": True},
        {"name": "age", "type": "integer", "min": 18, "max": 90},
        {"name": "c", "type": "categorical", "categories": ["a", "b", "c"]},
        # a boolean the CSV spells 0/1 and a Parquet file holds as Arrow booleans
        {"name": "flag", "type": "boolean", "true": "1", "false": "0"},
        {"name": "label", "type": "categorical", "categories": ["no", "yes"]},
    ],
}


def rows(n: int, seed: int) -> pd.DataFrame:
    """A table with a signal (x and c tell the label), missing and out-of-range numbers and an
    unlisted category."""
    rng = np.random.default_rng(seed)
    label = rng.choice(["no", "yes"], n)
    x = np.round(rng.normal(np.where(label == "yes", 70, 30), 15), 3)
    x[rng.random(n) < 0.05] = np.nan
    x[:3] = [-5.0, 120.5, 100.0]  # outside the bounds (other) and the top edge
    c = np.where(rng.random(n) < 0.7, np.where(label == "yes", "a", "b"), "c")
    c[5] = "zzz"  # not in the schema's list
    age = rng.integers(18, 91, n)
    flag = rng.random(n) < np.where(label == "yes", 0.8, 0.3)
    return pd.DataFrame({"x": x, "age": age, "c": c, "flag": flag, "label": label})


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """Gradient boosting on one OpenMP thread: on a busy machine its pool's threads wait on
    each other for seconds on these few rows."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1):
        yield


@pytest.fixture
def tables(tmp_path: Path) -> dict[str, Path]:
    """The same synthetic rows as a CSV, a folder of 3 Parquet parts and one Parquet file;
    real rows as a CSV and a folder of 2 parts; the schema."""
    synthetic, real = rows(300, 0), rows(120, 1)
    out = {"schema": tmp_path / "schema.json", "csv": tmp_path / "synth.csv"}
    out["schema"].write_text(json.dumps(SCHEMA))
    synthetic.astype({"flag": int}).to_csv(out["csv"], index=False)
    out["parts"] = tmp_path / "synth"
    out["parts"].mkdir()
    for i, (a, b) in enumerate([(0, 90), (90, 200), (200, 300)]):
        part = pa.Table.from_pandas(synthetic.iloc[a:b], preserve_index=False)
        pq.write_table(part, out["parts"] / f"part-{i:05d}.parquet", row_group_size=40)
    out["file"] = tmp_path / "synth.parquet"
    pq.write_table(pa.Table.from_pandas(synthetic, preserve_index=False), out["file"])
    out["real"] = tmp_path / "real.csv"
    real.astype({"flag": int}).to_csv(out["real"], index=False)
    out["real_parts"] = tmp_path / "real"
    out["real_parts"].mkdir()
    for i, (a, b) in enumerate([(0, 50), (50, 120)]):
        part = pa.Table.from_pandas(real.iloc[a:b], preserve_index=False)
        pq.write_table(part, out["real_parts"] / f"part-{i}.parquet")
    return out


def evaluate(synthetic: object, real: str, schema: Path, **options: object) -> dict:
    return run_table_evaluation(
        synthetic=synthetic,  # type: ignore[arg-type]
        real=real,
        metrics=["ml", "marginals"],
        seeds=1,
        schema_path=schema,
        **options,  # type: ignore[arg-type]
    )


def test_a_partitioned_release_scores_as_the_csv_of_its_rows(tables: dict[str, Path]) -> None:
    real = f"csv:{tables['real']}"
    in_memory = evaluate(str(tables["csv"]), real, tables["schema"])
    schema = parse_schema(SCHEMA, "test")
    reference = marginal_fidelity(
        read_csv_table(tables["csv"]), read_csv_table(tables["real"]), schema
    )
    assert in_memory["metrics"]["marginals"] == reference  # the counts give the old figures
    assert reference["other_share"]["synthetic"]["c"] == pytest.approx(1 / 300)
    x = rows(300, 0)["x"]
    outside = int(((x < 0) | (x > 100)).sum())
    assert outside >= 2 and reference["other_share"]["synthetic"]["x"] == outside / 300
    for given, layout in (
        (tables["parts"], "Parquet folder (3 files)"),
        (tables["parts"] / "part-*.parquet", "Parquet glob (3 files)"),
        (tables["file"], "Parquet file"),
    ):
        found = evaluate(str(given), real, tables["schema"])
        assert found["synthetic_layout"] == layout
        assert found["n_synthetic"] == 300 and found["real_n"] == 120
        marginals, expected = found["metrics"]["marginals"], in_memory["metrics"]["marginals"]
        for key in ("one_way", "two_way", "three_way"):
            assert marginals[key]["mean"] == pytest.approx(expected[key]["mean"], abs=1e-12)
            assert marginals[key]["max"] == pytest.approx(expected[key]["max"], abs=1e-12)
        assert marginals["one_way"]["per_column"] == pytest.approx(
            expected["one_way"]["per_column"], abs=1e-12
        )
        assert marginals["other_share"] == expected["other_share"]
        # the sample covers every row: the same rows in the same order, the same scores
        assert (
            found["classifier_rows"]["synthetic"] == 300 == found["classifier_rows"]["synthetic_of"]
        )
        assert found["metrics"]["classifiers"] == in_memory["metrics"]["classifiers"]
    auc = in_memory["metrics"]["classifiers"]["logreg"]["roc_auc"]["mean"]
    assert auc > 0.8  # the rows carry a signal: equal scores are not two failures
    # a real table given as a folder of parts: the same figures as its CSV
    parts_real = evaluate(str(tables["parts"]), f"parquet:{tables['real_parts']}", tables["schema"])
    assert parts_real["real_n"] == 120 and parts_real["real_kind"] == "parquet"
    assert parts_real["metrics"]["classifiers"] == in_memory["metrics"]["classifiers"]
    assert parts_real["metrics"]["marginals"]["two_way"]["mean"] == pytest.approx(
        in_memory["metrics"]["marginals"]["two_way"]["mean"], abs=1e-12
    )


def test_the_classifiers_train_on_a_stated_seeded_sample(tables: dict[str, Path]) -> None:
    real = f"csv:{tables['real']}"
    full = evaluate(str(tables["csv"]), real, tables["schema"])
    csv = evaluate(str(tables["csv"]), real, tables["schema"], ml_rows=80)
    parts = evaluate(str(tables["parts"]), real, tables["schema"], ml_rows=80)
    rows_used = parts["classifier_rows"]
    assert rows_used["synthetic"] == 80 and rows_used["synthetic_of"] == 300
    assert rows_used["real"] == 80 and rows_used["real_of"] == 120
    assert rows_used["max_rows"] == 80 and rows_used["seed"] == 0 and rows_used["rule"]
    # the keys do not depend on the chunks: the CSV and the parts give the same sample
    assert parts["metrics"]["classifiers"] == csv["metrics"]["classifiers"]
    assert parts["metrics"]["classifiers"] != full["metrics"]["classifiers"]
    # the marginals still count every row
    assert parts["metrics"]["marginals"]["two_way"]["mean"] == pytest.approx(
        full["metrics"]["marginals"]["two_way"]["mean"], abs=1e-12
    )


def test_the_row_sample_is_uniform_ordered_and_independent_of_the_chunks() -> None:
    from dpsynth.data.csvtable import RawTable

    def sample(splits: list[int], capacity: int) -> list[str]:
        kept = RowSample(capacity, stream=0)
        for a, b in zip([0, *splits], [*splits, 1000], strict=True):
            kept.add(RawTable(("i",), (np.arange(a, b).astype(str).astype(object),), "t"))
        return kept.rows().column("i").tolist()

    one = sample([], 100)
    assert one == sample([1, 7, 300, 301, 999], 100) == sample(list(range(10, 1000, 10)), 100)
    numbers = [int(v) for v in one]
    assert len(numbers) == 100 and numbers == sorted(numbers)  # file order
    assert sample([500], 1000) == [str(i) for i in range(1000)]  # every row: the table itself
    # uniform: over many seeds' streams, each decile of the rows gets about a tenth
    counts = np.zeros(10)
    for stream in range(40):
        kept = RowSample(50, stream)
        kept.add(RawTable(("i",), (np.arange(1000).astype(str).astype(object),), "t"))
        counts += np.bincount(np.array(kept.rows().column("i"), dtype=int) // 100, minlength=10)
    assert counts.sum() == 2000 and counts.min() > 130 and counts.max() < 270


def test_a_release_is_read_batch_by_batch(tables: dict[str, Path]) -> None:
    schema = parse_schema(SCHEMA, "test")
    table = open_synthetic(str(tables["parts"]), schema)
    assert table.streamed and table.raw is None and table.n == 300
    seen: list[int] = []
    found = read_pass(
        table, schema, marginals=True, max_rows=10, stream=0, progress=lambda d, _: seen.append(d)
    )
    # one batch per row group (40 rows) of each part: never the whole table at once
    assert seen == [40, 80, 90, 130, 170, 200, 240, 280, 300]
    assert found.rows == 300 and found.sample.n == 10
    assert found.counts is not None and found.counts.rows == 300


def test_a_partitioned_release_manifest_gives_the_schema(tables: dict[str, Path]) -> None:
    manifest = {
        "run_id": "r1",
        "schema": SCHEMA,
        "partitions": [{"file": f"part-{i:05d}.parquet"} for i in range(3)],
    }
    (tables["parts"] / "_manifest.json").write_text(json.dumps(manifest))
    (tables["parts"] / "_SUCCESS").write_text("")
    real = f"csv:{tables['real']}"
    found = run_table_evaluation(synthetic=str(tables["parts"]), real=real, metrics=["marginals"])
    assert found["synthetic_source"] == "sample" and found["provenance"] == {"run_id": "r1"}
    manifest["partitions"] = manifest["partitions"][:2]  # a part the manifest does not list
    (tables["parts"] / "_manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(UsageError, match="schema"):
        run_table_evaluation(synthetic=str(tables["parts"]), real=real, metrics=["marginals"])


def test_bad_releases_are_one_clear_error(tables: dict[str, Path], tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "text").mkdir()
    (tmp_path / "text" / "notes.txt").write_text("no parquet here")
    (tmp_path / "differ").mkdir()
    first = pq.read_table(tables["parts"] / "part-00000.parquet")
    pq.write_table(first, tmp_path / "differ" / "part-0.parquet")
    pq.write_table(first.drop_columns(["c"]), tmp_path / "differ" / "part-1.parquet")
    real = f"csv:{tables['real']}"

    def error(synthetic: str, code: int) -> str:
        done = runner.invoke(
            app,
            ["evaluate", "--synthetic", synthetic, "--real", real, "--schema",
             str(tables["schema"]), "--ledger", str(tmp_path / "ledger.jsonl")],
        )  # fmt: skip
        assert done.exit_code == code, done.output
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in done.output, done.output
        return lines[0]

    assert "the folder is empty" in error(str(tmp_path / "empty"), 2)
    assert "no Parquet file (*.parquet) in this folder" in error(str(tmp_path / "text"), 2)
    line = error(str(tmp_path / "differ"), 4)
    assert "part-1.parquet" in line and "schema differs" in line
    assert "matches no file" in error(str(tmp_path / "none-*.parquet"), 2)
    with pytest.raises(DataError, match="no rows"):
        pq.write_table(first.slice(0, 0), tmp_path / "empty" / "part-0.parquet")
        open_synthetic(str(tmp_path / "empty"), None)
    with pytest.raises(UsageError, match="ml_rows"):
        run_evaluation(synthetic="x", real="digits:test", metrics=["accuracy"], ml_rows=10)


def test_cli_evaluates_a_partitioned_release(tables: dict[str, Path], tmp_path: Path) -> None:
    args = ["evaluate", "--synthetic", str(tables["parts"]), "--real", f"csv:{tables['real']}",
            "--schema", str(tables["schema"]), "--seeds", "1", "--ml-rows", "100",
            "--ledger", str(tmp_path / "ledger.jsonl")]  # fmt: skip
    shown = runner.invoke(app, args)
    assert shown.exit_code == 0, shown.output
    assert "Parquet folder (3 files)" in shown.stdout
    assert "trained on 100 of 300 synthetic rows, tested on 100 of 120 real rows" in shown.stdout
    assert "2-way TVD" in shown.stdout
    as_json = runner.invoke(app, [*args, "--json", "--report", str(tmp_path / "report")])
    assert as_json.exit_code == 0, as_json.output
    result = json.loads(as_json.stdout)
    assert result["classifier_rows"]["synthetic"] == 100
    page = (tmp_path / "report" / "report.md").read_text()
    assert "trained on 100 of 300 synthetic rows" in page
    assert "drawn from the classifiers' row samples: 100 synthetic and 100 real rows" in page
