"""The DP release of a drafted schema on the out-of-core engines (`training.engine_release`).

- `train --engine duckdb` on a partitioned Parquet folder with a drafted schema (entries marked
  `"source": "data ..."`) releases the schema with DP (no `--schema-public`), in three passes
  (the first the check pass), and trains; one secret seed gives the schema, the 1-way
  histograms, N and the model that `--engine memory` gives on the same rows, also when the
  release drops a rare label (its rows are left out) and writes a sparse number empty; the
  same on a local Dask cluster.
- A run stopped after a step resumes on DuckDB (its check pass under the released schema names
  the same rows) and ends as the uninterrupted run; the digest and N the release's second pass
  gives a source equal those of a check pass under the released schema, also for a number
  written empty and a label dropped.
- The release's counts summed over parts in spawned processes equal the in-memory counts.
- `--class-weights-epsilon` on an engine is refused in one line before anything is spent.
"""

from __future__ import annotations

import json
import shutil
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from dpsynth.cli import app
from dpsynth.data.engines import table_files
from dpsynth.data.engines.parts import fold_parts, parquet_parts
from dpsynth.data.schema_draft import draft_table
from dpsynth.data.sources import read_table_file
from dpsynth.training import train_run
from dpsynth.training.schema_counting import count_ranges
from dpsynth.training.schema_entries import release_columns
from tests.training.test_messy_tables import messy_frame

runner = CliRunner()
ROWS = 3000
SECRET = 2718


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A hospital table as one typed Parquet file and as a folder of three partitions, with a
    label held by 4 rows and a number present in 12 rows, and its drafted schema."""
    folder = tmp_path_factory.mktemp("engine-release")
    frame = messy_frame(ROWS)
    frame.loc[frame.index[:4], "outcome"] = "rare"
    tip = np.full(ROWS, np.nan)
    rng = np.random.default_rng(3)
    tip[rng.choice(ROWS, 12, replace=False)] = 10.0 ** rng.uniform(-3, 6, 12)
    frame["tip"] = tip
    frame["age"] = pd.to_numeric(frame["age"]).astype("Int64")
    frame["bmi"] = pd.to_numeric(frame["bmi"])
    frame["los_days"] = frame["los_days"].astype(int)
    table = pa.Table.from_pandas(frame, preserve_index=False)
    pq.write_table(table, folder / "whole.parquet")
    (folder / "parts").mkdir()
    for i in range(3):
        part = table.slice(i * 1000, 1000)
        pq.write_table(part, folder / "parts" / f"part-{i}.parquet", row_group_size=300)
    raw = read_table_file(folder / "whole.parquet", "parquet:whole")
    schema = draft_table(raw.header, raw.columns, "outcome")[0]
    assert {c.name for c in schema.columns if c.data_derived} >= {"ward", "bmi", "tip", "outcome"}
    (folder / "schema.json").write_text(json.dumps(schema.to_json()))
    return folder


@pytest.fixture
def one_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    """DuckDB counts a Parquet folder's parts in this process (no spawned interpreters)."""
    monkeypatch.setattr("dpsynth.data.engines.duckdb_engine.default_workers", lambda: 1)


def _train(folder: Path, name: str, data: str, **fields) -> tuple[dict, dict, dict]:
    out = folder / name
    shutil.rmtree(out, ignore_errors=True)
    (folder / f"{name}.jsonl").unlink(missing_ok=True)
    fields = {
        "method": "mst",
        "data": data,
        "schema": folder / "schema.json",
        "epsilon": 2.0,
        "preset": "tiny",
        "ledger_path": folder / f"{name}.jsonl",
        "privacy_seed": SECRET,
        "out": out,
        **fields,
    }
    summary = train_run(**fields)
    return summary, json.loads((out / "config.json").read_text()), _state(out)


def _state(out: Path) -> dict:
    checkpoints = sorted(p for p in out.rglob("*.safetensors") if "private" not in p.parts)
    return load_file(checkpoints[-1])


def _assert_same_run(config: dict, state: dict, expected: tuple[dict, dict]) -> None:
    want_config, want_state = expected
    assert config["schema_release"] == want_config["schema_release"]
    assert config["data"]["schema"] == want_config["data"]["schema"]
    assert config["data"]["n"] == want_config["data"]["n"]
    assert config["config"] == want_config["config"]  # the release's 1-way histograms too
    assert sorted(state) == sorted(want_state)
    for key in state:
        assert torch.equal(state[key], want_state[key]), key


@pytest.fixture(scope="module")
def in_memory(folder: Path) -> tuple[dict, dict]:
    """The in-memory run of record: its config and final state."""
    _, config, state = _train(folder, "memory", f"parquet:{folder / 'whole.parquet'}")
    release = config["schema_release"]
    assert release["default_share"] == 0.7 and release["ledger_seq"] == 0
    schema = {c["name"]: c for c in config["data"]["schema"]["columns"]}
    assert "rare" not in schema["outcome"]["categories"]  # 4 rows: below the threshold
    assert config["data"]["n"] == ROWS - 4  # the rare label's rows are left out
    return config, state


def test_duckdb_releases_the_schema_memory_releases(
    folder: Path, in_memory: tuple[dict, dict], one_worker: None
) -> None:
    data = f"parquet:{folder / 'parts'}"
    summary, config, state = _train(folder, "duckdb", data, engine="duckdb")
    assert summary["engine"] == "duckdb" and summary["schema_release"]["columns"]
    _assert_same_run(config, state, in_memory)
    ledger = [json.loads(line) for line in (folder / "duckdb.jsonl").read_text().splitlines()]
    assert [e["command"] for e in ledger if e.get("status") == "reserved"] == [
        "schema-release",
        "train",
    ]


def test_dask_releases_the_schema_memory_releases(
    folder: Path, in_memory: tuple[dict, dict]
) -> None:
    pytest.importorskip("distributed")
    from distributed import LocalCluster

    with LocalCluster(
        n_workers=2,
        threads_per_worker=1,
        processes=False,
        protocol="tcp",
        host="127.0.0.1",
        dashboard_address=None,
    ) as cluster:
        engine = f"dask://{cluster.scheduler_address.removeprefix('tcp://')}"
        _, config, state = _train(folder, "dask", f"parquet:{folder / 'parts'}", engine=engine)
    _assert_same_run(config, state, in_memory)


def test_a_run_with_a_release_resumes_on_duckdb(
    folder: Path, in_memory: tuple[dict, dict], one_worker: None
) -> None:
    data = f"parquet:{folder / 'parts'}"
    _train(folder, "resumed", data, engine="duckdb", stop_after_steps=1)
    resumed = train_run(out=folder / "resumed", resume=True, method=None, data=None,
                        epsilon=None, ledger_path=None)  # fmt: skip
    assert resumed["engine"] == "duckdb"
    state = _state(folder / "resumed")
    for key, value in in_memory[1].items():
        assert torch.equal(state[key], value), key


def test_the_release_pass_names_the_rows_a_check_pass_names(
    folder: Path, monkeypatch: pytest.MonkeyPatch, one_worker: None
) -> None:
    from dpsynth.data.column_values import RELEASED_PREFIX
    from dpsynth.data.engines import parse_engine
    from dpsynth.data.schema import Column
    from dpsynth.data.schema_file import read_schema
    from dpsynth.training import engine_release
    from dpsynth.training.schema_entries import AppliedRelease
    from dpsynth.training.table_source import open_table_source

    drafted = read_schema(folder / "schema.json")
    columns = release_columns(drafted)
    released = drafted.replace_column(Column("tip", "ignored", source=RELEASED_PREFIX))
    target = released.target_column
    labels = tuple(c for c in target.categories if c != "rare")
    released = released.replace_column(
        Column(target.name, "categorical", categories=labels, source=RELEASED_PREFIX)
    )

    def rounds(schema, columns, plan, generator, source, ranges, shapes, spans) -> AppliedRelease:
        ranges()  # the three passes, over every released number's grid but tip's (no range)
        grids = {c.name: np.array([0.0, 1.0]) for c in columns.numbers if c.name != "tip"}
        spans(grids)
        shapes(grids)
        return AppliedRelease(released, [], {}, {}, {}, {})

    monkeypatch.setattr(engine_release, "apply_release", rounds)
    spec, engine = f"parquet:{folder / 'parts'}", parse_engine("duckdb")
    source = open_table_source(spec, drafted, engine, None, None, pending=drafted.data_derived())
    run = engine_release.EngineRun(source.counter)
    run(drafted, columns, None, None, RELEASED_PREFIX)  # type: ignore[arg-type]
    after = run.released_source(source, released)
    checked = open_table_source(spec, released, engine, None, None)
    assert after.content_digest == checked.content_digest != source.content_digest
    assert after.n == checked.n == ROWS - 4
    # the check pass (round 1 with it) and the release's two other rounds: no other pass
    assert source.counter.passes == 3


def test_release_counts_summed_over_spawned_parts(folder: Path) -> None:
    from dpsynth.data.schema_file import read_schema

    schema = read_schema(folder / "schema.json")
    columns = release_columns(schema)
    files = table_files(f"parquet:{folder / 'parts'}")
    parts = parquet_parts(files, part_rows=1)
    assert len(parts) == 12  # 3 files × 4 row groups
    count = partial(count_ranges, columns=columns)
    seen: list[int] = []
    total, rows = fold_parts(parts, count, schema, (), files.name, 2, seen.append)
    assert rows == ROWS and seen[-1] == ROWS
    whole = count_ranges(read_table_file(folder / "whole.parquet", "parquet:whole"), columns)
    assert total.categories == whole.categories
    assert sorted(total.numbers) == sorted(whole.numbers)
    for name, counts in whole.numbers.items():
        np.testing.assert_array_equal(total.numbers[name], counts)


def test_the_cli_releases_a_drafted_schema_on_duckdb(folder: Path, one_worker: None) -> None:
    out, ledger = folder / "cli", folder / "cli.jsonl"
    result = runner.invoke(app, [
        "train", "--method", "mst", "--engine", "duckdb", "--data",
        f"parquet:{folder / 'parts'}", "--schema", str(folder / "schema.json"),
        "--epsilon", "2", "--preset", "tiny", "--out", str(out), "--ledger", str(ledger),
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    passes = [line for line in result.stderr.splitlines() if line.startswith("pass ")]
    names = [p.split(":")[0] for p in passes]
    assert names[:3] == [
        "pass 1 (duckdb, check, schema release round 1)",  # round 1 counted by the check pass
        "pass 2 (duckdb, schema release round 2)",
        "pass 3 (duckdb, schema release round 3)",
    ]
    # The check pass is made again only when the release kept other columns than round 1
    # said, which the release's noise decides (engine_release's docstring): then one more.
    recheck = int(names[3] == "pass 4 (duckdb, check)")
    assert len(passes) == 4 + recheck and "marginals" in passes[-1]
    assert "schema release:" in result.stdout and "(ledger seq 0;" in result.stdout
    assert f"passes over the data: {4 + recheck} (duckdb): check, schema release round 1; " in (
        result.stdout
    )


def test_class_weights_release_is_refused_on_an_engine(folder: Path) -> None:
    out, ledger = folder / "weights", folder / "weights.jsonl"
    result = runner.invoke(app, [
        "train", "--method", "mst", "--engine", "duckdb", "--data",
        f"parquet:{folder / 'parts'}", "--schema", str(folder / "schema.json"),
        "--epsilon", "2", "--class-weights-epsilon", "0.1", "--out", str(out),
        "--ledger", str(ledger),
    ])  # fmt: skip
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "made in memory only" in lines[0]
    assert not ledger.exists() or not ledger.read_text().strip()
    assert not out.exists()
