"""Tables at scale: the one encoding, the counting engines and mst / aim on them.

- `codes_from_raw` (the encoding every engine uses) equals `codes_from_rows` of the encoded rows
  on german-credit and on a messy table (empty cells, dates, times, booleans), as CSV and as
  typed Parquet.
- The engines count the same: memory, DuckDB (small batches, so several) and a local Dask
  cluster give identical counts, N and content digest, on a CSV, a partitioned folder and a
  glob; a Parquet folder's parts counted in one process or two give them too; the blocked
  bincounts equal one bincount per clique.
- One secret seed gives the same mst release whichever engine counted (memory, DuckDB, the
  local Dask cluster), in one pass (the check pass counts the marginals too); `--engine auto`
  under a small memory budget goes out of core and releases the same; a run resumed on DuckDB
  finishes as an uninterrupted one.
- Bad input fails in one line, with its exit code, before anything is spent: a nested Parquet
  column, a partition whose schema differs, an unreachable cluster, a method that needs rows.
"""

from __future__ import annotations

import json
import math
import shutil
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
from dpsynth.data.builtin_tables import TABLE_BUILTINS, load_builtin_table
from dpsynth.data.discrete import ChunkEncoder, codes_from_raw, schema_domain
from dpsynth.data.engines import parse_engine, table_files
from dpsynth.data.engines.counting import chunk_counts
from dpsynth.data.engines.duckdb_engine import DuckDBCounter
from dpsynth.data.engines.memory import MemoryCounter
from dpsynth.data.engines.parts import count_parts, parquet_parts
from dpsynth.data.schema_draft import draft_table
from dpsynth.data.sources import read_table_file
from dpsynth.data.table_codec import encode_table
from dpsynth.errors import UsageError
from dpsynth.methods.marginal.domain import codes_from_rows, table_domain
from dpsynth.privacy.mechanisms.marginal_measure import MarginalQueries
from dpsynth.training import train_run
from tests.training.test_messy_tables import messy_frame

runner = CliRunner()
GERMAN = Path(__file__).resolve().parents[2] / "dpsynth" / "data" / "tables"
BINNINGS = ((8, True), (16, False), (3, True))


@pytest.fixture(scope="module")
def tables(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """german-credit as a CSV with its schema, and a messy table as a CSV, a typed Parquet
    file, and the same split into a partitioned folder of three files."""
    folder = tmp_path_factory.mktemp("engines")
    shutil.copy(GERMAN / "german_credit.csv", folder / "german.csv")
    shutil.copy(GERMAN / "german_credit.schema.json", folder / "german.schema.json")
    frame = messy_frame(1500)
    frame.to_csv(folder / "messy.csv", index=False)
    typed = frame.copy()
    typed["age"] = pd.to_numeric(typed["age"]).astype("Int64")
    typed["bmi"] = pd.to_numeric(typed["bmi"])
    typed["smoker"] = typed["smoker"].map({"yes": True, "no": False, "": None}).astype("boolean")
    typed["los_days"] = typed["los_days"].astype(int)
    table = pa.Table.from_pandas(typed, preserve_index=False)
    pq.write_table(table, folder / "messy.parquet")
    (folder / "parts").mkdir()
    for i in range(3):
        part = table.slice(i * 500, 500)
        pq.write_table(part, folder / "parts" / f"part-{i}.parquet", row_group_size=200)
    return {"folder": folder}


def _draft(raw):
    return draft_table(raw.header, raw.columns, "outcome")[0]


def _assert_same_codes(raw, schema) -> None:
    data = encode_table(raw, schema, "t", "csv")
    for bins, bound_bins in BINNINGS:
        domain = table_domain(data.info(), {"bins": bins, "bound_bins": bound_bins})
        expected = codes_from_rows(data.x, data.y, domain).astype(np.int64)
        np.testing.assert_array_equal(codes_from_raw(raw, schema, domain), expected)


def test_one_encoding_equals_the_encoded_rows_codes(tables: dict) -> None:
    folder = tables["folder"]
    _assert_same_codes(
        load_builtin_table("german-credit", "train"), TABLE_BUILTINS["german-credit"].schema()
    )
    raw = read_table_file(folder / "messy.csv", "csv:messy")
    schema = _draft(raw)
    kinds = {c.type for c in schema.columns}
    assert {"date", "datetime", "boolean", "integer", "numeric"} <= kinds
    assert any(c.missing for c in schema.columns if c.is_numeric)  # empty cells: missing bins
    _assert_same_codes(raw, schema)
    raw = read_table_file(folder / "messy.parquet", "parquet:messy")
    _assert_same_codes(raw, _draft(raw))


def _counters(spec: str, raw, schema, dask_address: str | None = None):
    encoder = ChunkEncoder(schema, schema_domain(schema, 8, True))
    counters = [
        MemoryCounter(raw, encoder),
        DuckDBCounter(table_files(spec), encoder, None, 128 * 2**20, batch_rows=256),
    ]
    if dask_address is not None:
        from dpsynth.data.engines.dask_engine import DaskCounter, connect

        counters.append(DaskCounter(connect(dask_address), table_files(spec), encoder, None))
    return counters


@pytest.fixture(scope="module")
def cluster():
    """A local Dask cluster (two workers in this process, over TCP), stopped afterwards."""
    from distributed import LocalCluster

    local = LocalCluster(
        n_workers=2,
        threads_per_worker=1,
        processes=False,
        protocol="tcp",
        host="127.0.0.1",
        dashboard_address=None,
    )
    try:
        yield local.scheduler_address.removeprefix("tcp://")
    finally:
        local.close()


@pytest.mark.parametrize("layout", ["csv", "folder", "glob"])
def test_engines_count_the_same(tables: dict, cluster: str, layout: str) -> None:
    folder = tables["folder"]
    if layout == "csv":
        raw = read_table_file(folder / "messy.csv", "csv:messy")
        spec = f"csv:{folder / 'messy.csv'}"
    else:
        raw = read_table_file(folder / "messy.parquet", "parquet:messy")
        target = "parts" if layout == "folder" else "parts/part-*.parquet"
        spec = f"parquet:{folder / target}"
    counters = _counters(spec, raw, _draft(raw), cluster)
    digests = {c.scan() for c in counters}
    assert len(digests) == 1  # the content digest names the rows whatever read them
    assert [c.record_count for c in counters] == [1500] * len(counters)
    cliques = [(0,), (1, 2), (0, 3, 7), ()]
    first = counters[0].counts(cliques)
    for counter in counters[1:]:
        for a, b in zip(first, counter.counts(cliques), strict=True):
            np.testing.assert_array_equal(a, b)
        assert counter.passes == 2  # the check pass, then one pass for all four cliques
        counter.close()


@pytest.mark.parametrize("workers", [1, 2])
def test_parquet_parts_count_the_same_in_any_split(tables: dict, workers: int) -> None:
    # the single-machine engine's passes over a Parquet folder: parts of one row group each
    # (with their dictionaries) in one process or two give the in-memory counts and digest
    folder = tables["folder"]
    raw = read_table_file(folder / "messy.parquet", "parquet:messy")
    schema = _draft(raw)
    encoder = ChunkEncoder(schema, schema_domain(schema, 8, True))
    memory = MemoryCounter(raw, encoder)
    files = table_files(f"parquet:{folder / 'parts'}")
    parts = parquet_parts(files, part_rows=1)
    assert len(parts) == 9 and sum(p.rows for p in parts) == 1500  # 3 files × 3 row groups
    cliques = [(0,), (1, 2), (0, 3, 7), (2, 0), ()]
    seen: list[int] = []
    sums = count_parts(parts, encoder, cliques, True, files.name, workers, seen.append)
    assert sums.digest() == memory.scan() and sums.rows == 1500
    assert seen[-1] == 1500 and len(seen) == 9  # one report per part
    for a, b in zip(memory.counts(cliques), sums.result(), strict=True):
        np.testing.assert_array_equal(a, b)


def test_blocked_counts_equal_one_bincount_per_clique() -> None:
    # cliques sharing all but their first attribute are counted as one joint and summed out
    rng = np.random.default_rng(7)
    for _ in range(20):
        sizes = tuple(int(s) for s in rng.integers(1, 60, int(rng.integers(1, 9))))
        n = int(rng.integers(0, 400))
        codes = np.stack([rng.integers(0, s, n) for s in sizes], 1).reshape(n, len(sizes))
        cliques = [()] + [
            tuple(int(j) for j in rng.permutation(len(sizes))[: rng.integers(1, 5)])
            for _ in range(30)
        ]
        for clique, counts in zip(cliques, chunk_counts(codes, sizes, cliques), strict=True):
            shape = tuple(sizes[j] for j in clique)
            flat = np.ravel_multi_index(tuple(codes[:, j] for j in clique), shape) if clique else 0
            expected = np.bincount(np.broadcast_to(flat, n), minlength=math.prod(shape))
            assert counts.dtype == np.int64
            np.testing.assert_array_equal(counts, expected if clique else [n])


def test_queries_count_a_round_in_one_pass(tables: dict) -> None:
    raw = read_table_file(tables["folder"] / "messy.csv", "csv:messy")
    counter = _counters(f"csv:{tables['folder'] / 'messy.csv'}", raw, _draft(raw))[1]
    counter.scan()
    queries = MarginalQueries(counter)
    queries.prefetch([(0,), (1,), (0, 1), (2, 3)])
    assert (queries.passes, counter.passes) == (1, 2)
    queries.measure([(0, 1), (1,)], 1.0, torch.Generator().manual_seed(0))  # cached: no pass
    assert (queries.passes, counter.passes) == (1, 2)


def _release(folder: Path, name: str, **fields) -> tuple[dict, dict]:
    out = folder / name
    shutil.rmtree(out, ignore_errors=True)
    fields = {
        "method": "mst",
        "data": f"csv:{folder / 'german.csv'}",
        "schema": folder / "german.schema.json",
        "epsilon": 2.0,
        "ledger_path": folder / f"{name}.ledger.jsonl",
        "privacy_seed": 4321,
        "out": out,
        **fields,
    }
    summary = train_run(**fields)
    checkpoints = sorted(p for p in out.rglob("*.safetensors") if "private" not in p.parts)
    return summary, load_file(checkpoints[-1])


def _assert_same_state(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_one_seed_one_release_whatever_counted(tables: dict, cluster: str) -> None:
    folder = tables["folder"]
    summary, expected = _release(folder, "memory", engine="memory")
    assert (summary["engine"], summary["passes"]) == ("memory", 1)
    for engine in ("duckdb", f"dask://{cluster}"):
        summary, state = _release(folder, engine.split(":")[0], engine=engine)
        assert summary["engine"] == engine
        # mst counts every marginal it may need in one pass, the check pass itself
        assert summary["passes"] == 1
        _assert_same_state(state, expected)
        config = json.loads((folder / engine.split(":")[0] / "config.json").read_text())
        assert config["data"]["engine"] == engine and config["data"]["n"] == 1000


def test_out_of_core_under_a_small_budget_and_resumed(tables: dict) -> None:
    folder = tables["folder"]
    _, expected = _release(folder, "budget-memory", engine="memory")
    summary, state = _release(folder, "budget-auto", memory_budget=2**18)
    assert summary["engine"] == "duckdb"  # auto: the table's estimate is over 256 KiB
    _assert_same_state(state, expected)
    # stopped after the first round, then resumed: the check pass again, the same release
    _release(folder, "budget-resumed", engine="duckdb", stop_after_steps=1)
    resumed = train_run(out=folder / "budget-resumed", resume=True, method=None, data=None,
                        epsilon=None, ledger_path=None)  # fmt: skip
    assert resumed["engine"] == "duckdb"
    checkpoints = sorted(
        p for p in (folder / "budget-resumed").rglob("*.safetensors") if "private" not in p.parts
    )
    _assert_same_state(load_file(checkpoints[-1]), expected)


def test_passes_are_one_line_each_when_piped(tables: dict) -> None:
    folder = tables["folder"]
    result = runner.invoke(app, [
        "train", "--method", "mst", "--data", f"csv:{folder / 'german.csv'}",
        "--schema", str(folder / "german.schema.json"), "--epsilon", "2", "--engine", "duckdb",
        "--out", str(folder / "piped"), "--ledger", str(folder / "piped.ledger.jsonl"),
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    lines = [line for line in result.stderr.splitlines() if line.startswith("pass ")]
    # under a public schema the check pass counts the marginals too: one pass in all
    assert lines[0].startswith("pass 1 (duckdb, check, ") and "marginals): 1,000 rows" in lines[0]
    assert len(lines) == 1
    assert "passes over the data: 1 (duckdb): check, " in result.stdout


def _refused(folder: Path, data: str, code: int, phrase: str, *extra: str) -> None:
    ledger = folder / "refused.ledger.jsonl"
    ledger.unlink(missing_ok=True)
    out = folder / "refused"
    shutil.rmtree(out, ignore_errors=True)
    result = runner.invoke(app, [
        "train", "--method", "mst", "--data", data, "--epsilon", "2", "--out", str(out),
        "--ledger", str(ledger), "--schema-public", *extra,
    ])  # fmt: skip
    assert result.exit_code == code, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and phrase in lines[0], result.stderr
    assert not ledger.exists() or not ledger.read_text().strip()  # nothing spent
    assert not out.exists()


def test_bad_inputs_fail_in_one_line_before_any_spend(tables: dict) -> None:
    folder = tables["folder"]
    schema = folder / "messy.schema.json"
    raw = read_table_file(folder / "messy.parquet", "parquet:messy")
    schema.write_text(json.dumps(_draft(raw).to_json()))
    nested = folder / "nested"
    nested.mkdir(exist_ok=True)
    table = pa.table({"a": [1, 2], "tags": [[1, 2], [3]], "outcome": ["x", "y"]})
    pq.write_table(table, nested / "part-0.parquet")
    _refused(folder, f"parquet:{nested}", 4, "nested type", "--schema", str(schema))
    drifted = folder / "drifted"
    shutil.copytree(folder / "parts", drifted, dirs_exist_ok=True)
    part = pq.read_table(drifted / "part-2.parquet")
    part = part.set_column(part.schema.get_field_index("age"), "age", part["age"].cast(pa.string()))
    pq.write_table(part, drifted / "part-2.parquet")
    differs = "part-2.parquet: its schema differs"
    _refused(folder, f"parquet:{drifted}", 4, differs, "--schema", str(schema))
    _refused(folder, f"parquet:{folder / 'parts'}", 2, "no Dask scheduler answered",
             "--schema", str(schema), "--engine", "dask://127.0.0.1:9")  # fmt: skip
    german = ("--schema", str(folder / "german.schema.json"), "--engine", "duckdb")
    _refused(folder, f"csv:{folder / 'german.csv'}", 2, "trains on the rows in memory",
             *german, "--method", "dpkernel")  # fmt: skip
    _refused(folder, "german-credit", 2, "is built in", "--engine", "duckdb")
    with pytest.raises(UsageError):
        parse_engine("spark://host:7077")


def test_schema_draft_of_a_partitioned_folder_reads_a_sample(tables: dict) -> None:
    folder = tables["folder"]
    spec = f"parquet:{folder / 'parts'}"
    result = runner.invoke(app, ["data", "schema", spec, "--target", "outcome"])
    assert result.exit_code == 0, result.output
    assert "drafted from a uniform sample of 1,500 of 1,500 rows" in result.stderr
    drafted = json.loads(result.stdout)
    whole = _draft(read_table_file(folder / "messy.parquet", "parquet:messy")).to_json()
    assert [c["name"] for c in drafted["columns"]] == [c["name"] for c in whole["columns"]]
    ward = next(c for c in drafted["columns"] if c["name"] == "ward")
    assert ward["source"].startswith("data")  # read off the data: not public


def test_the_memory_cap_does_not_count_rows_an_engine_holds(tables: dict) -> None:
    """mst's refusal estimate counts the codes of the rows held in memory; an engine holds
    none, so a cap between the two estimates refuses the in-memory run and trains on DuckDB
    (at 100M rows the codes alone were 19 GB, which refused every engine run)."""
    from dataclasses import replace

    from dpsynth.data.sources import load_table
    from dpsynth.errors import UsageError
    from dpsynth.methods.marginal.domain import table_domain
    from dpsynth.methods.registry import get_method

    folder = tables["folder"]
    method = get_method("mst")
    info = replace(load_table("german-credit").info(""), n=1000)  # the CSV's 1,000 rows
    config = method.config("small", {}, info)
    domain = table_domain(info, config)
    held, counted = method.memory_mb(domain, config, info.n), method.memory_mb(domain, config, 0)
    assert held > counted
    cap = {"max_memory_mb": (held + counted) / 2}
    with pytest.raises(UsageError, match="max_memory_mb"):
        method.validate_config({**config, **cap}, info)
    method.validate_config({**config, **cap}, info, rows_in_memory=False)
    with pytest.raises(UsageError, match="max_memory_mb"):
        _release(folder, "cap-memory", engine="memory", overrides=cap)
    summary, _ = _release(folder, "cap-duckdb", engine="duckdb", overrides=cap)
    assert summary["engine"] == "duckdb"
