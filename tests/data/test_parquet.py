"""Parquet in (`parquet:FILE`) and out (`sample --out FILE.parquet`): the reader's canonical
text, the same `RawTable` as a CSV of that text, the schema's time formats, the caps; a tiny
mst run trained on a Parquet file, sampled to Parquet with typed, nullable columns, and
evaluated; bad files end in one line, exit 4, nothing spent."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import shutil
from decimal import Decimal
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from dpsynth.cli import app
from dpsynth.data import parquetfile
from dpsynth.data.parquetfile import read_parquet_table
from dpsynth.data.schema_file import parse_schema
from dpsynth.data.sources import parse_spec, read_table, read_table_file
from dpsynth.data.table_codec import read_csv_table
from dpsynth.errors import DataError
from dpsynth.sampling.parquet_out import arrow_schema, frame_to_arrow

runner = CliRunner()
UTC = dt.UTC


def _write(path: Path, table: pa.Table, **options: object) -> Path:
    pq.write_table(table, path, **options)
    return path


# ----------------------------------------------------------------------------- the reader


def test_each_arrow_type_becomes_its_canonical_text(tmp_path: Path) -> None:
    stamp = dt.datetime(2020, 1, 2, 3, 4, 5)
    table = pa.table({
        "f64": pa.array([1.5, None, float("nan"), 0.1, 1e20], pa.float64()),
        "f32": pa.array([0.1, None, 2.5, 3, 1], pa.float32()),
        "i": pa.array([1, None, -3, 4, 2**62], pa.int64()),
        "u8": pa.array([1, 2, None, 4, 255], pa.uint8()),
        "s": pa.array([" a", "b ", None, "a", ""]),
        "b": pa.array([True, False, None, True, True]),
        "d": pa.array([dt.date(2020, 1, 2), None, dt.date(1999, 12, 31)] * 1 + [None] * 2,
                      pa.date32()),
        "ts": pa.array([stamp, None, stamp.replace(microsecond=500_000), stamp, stamp],
                       pa.timestamp("us")),
        "whole": pa.array([stamp, None, stamp, stamp, stamp], pa.timestamp("ns")),
        "tz": pa.array([dt.datetime(2020, 1, 2, 3, tzinfo=UTC), None,
                        dt.datetime(2020, 7, 2, 3, tzinfo=UTC), None, None],
                       pa.timestamp("ms", tz="Europe/Berlin")),
        "cat": pa.array(["x", "y", "x", None, "y"]).dictionary_encode(),
        "dec": pa.array([Decimal("1.25"), Decimal("2.00"), None, Decimal("-3.5"), None],
                        pa.decimal128(6, 2)),
        "nul": pa.nulls(5),
    })  # fmt: skip
    path = _write(tmp_path / "t.parquet", table, row_group_size=2)
    raw = read_parquet_table(path, "parquet:t.parquet")
    got = {name: raw.column(name).tolist() for name in raw.header}
    assert raw.header == tuple(table.column_names) and raw.n == 5
    assert got["f64"] == ["1.5", "", "", "0.1", "1e+20"]
    assert got["f32"] == ["0.1", "", "2.5", "3.0", "1.0"]  # shortest at float32's precision
    assert got["i"] == ["1", "", "-3", "4", str(2**62)]
    assert got["u8"] == ["1", "2", "", "4", "255"]
    assert got["s"] == ["a", "b", "", "a", ""]
    assert got["b"] == ["true", "false", "", "true", "true"]
    assert got["d"] == ["2020-01-02", "", "1999-12-31", "", ""]
    # one format per column: the finest value has milliseconds, so every value does
    assert got["ts"] == [
        "2020-01-02 03:04:05.000", "", "2020-01-02 03:04:05.500",
        "2020-01-02 03:04:05.000", "2020-01-02 03:04:05.000",
    ]  # fmt: skip
    assert got["whole"] == ["2020-01-02 03:04:05", "", *["2020-01-02 03:04:05"] * 3]
    assert got["tz"] == ["2020-01-02 04:00:00+01:00", "", "2020-07-02 05:00:00+02:00", "", ""]
    assert got["cat"] == ["x", "y", "x", "", "y"]
    assert got["dec"] == ["1.25", "2.0", "", "-3.5", ""]
    assert got["nul"] == [""] * 5


def test_a_parquet_file_reads_as_the_csv_of_its_text(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    n = 1000
    table = pa.table({
        "x": pa.array(rng.normal(size=n).round(3)),
        "k": pa.array(rng.integers(0, 5, n)),
        "c": pa.array(rng.choice(["a", "b", "c"], n)),
    })  # fmt: skip
    path = _write(tmp_path / "t.parquet", table, row_group_size=128)
    raw = read_parquet_table(path)
    lines = ["x,k,c"] + [f"{raw.columns[0][i]},{raw.columns[1][i]},{raw.columns[2][i]}"
                         for i in range(n)]  # fmt: skip
    (tmp_path / "t.csv").write_text("\n".join(lines) + "\n")
    csv = read_csv_table(tmp_path / "t.csv")
    assert csv.header == raw.header
    for ours, theirs in zip(raw.columns, csv.columns, strict=True):
        assert ours.tolist() == theirs.tolist()
    assert [float(v) for v in raw.column("x")] == table["x"].to_pylist()
    # the file reader picks Parquet by the suffix (evaluate --synthetic FILE.parquet)
    assert read_table_file(path, "s").columns[2].tolist() == raw.columns[2].tolist()


def test_a_schema_gives_time_columns_their_formats(tmp_path: Path) -> None:
    table = pa.table({
        "day": pa.array([dt.date(2021, 3, 4), None], pa.date32()),
        "at": pa.array([dt.datetime(2021, 3, 4, 23, 30, tzinfo=UTC), None],
                       pa.timestamp("us", tz="UTC")),
        "y": ["a", "b"],
    })  # fmt: skip
    schema = parse_schema({
        "target": "y",
        "columns": [
            {"name": "day", "type": "date", "min": "2020-01-01", "max": "2022-01-01",
             "format": "%d/%m/%Y", "missing": True},
            {"name": "at", "type": "datetime", "min": "2020-01-01T00:00:00",
             "max": "2022-01-01T00:00:00", "format": "%d.%m.%Y %H:%M%:z",
             "timezone": "+01:00", "missing": True},
            {"name": "y", "type": "categorical", "categories": ["a", "b"]},
        ],
    })  # fmt: skip
    path = _write(tmp_path / "t.parquet", table)
    raw = read_parquet_table(path, schema=schema)
    assert raw.column("day").tolist() == ["04/03/2021", ""]
    assert raw.column("at").tolist() == ["05.03.2021 00:30+01:00", ""]
    assert read_parquet_table(path).column("at").tolist() == ["2021-03-04 23:30:00+00:00", ""]


def test_the_memory_budget_and_the_field_cap_hold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = pa.table({"x": pa.array(range(5000)), "c": pa.array(["a"] * 5000)})
    path = _write(tmp_path / "t.parquet", table, row_group_size=500)
    monkeypatch.setattr(parquetfile, "ROWS_PER_BATCH", 500)
    monkeypatch.setenv("DPSYNTH_MEMORY_BUDGET", "64K")
    # the footer's row count is checked before any row is read ...
    with pytest.raises(DataError, match=r"its 5,000 rows would need about .* 64 KiB budget"):
        read_parquet_table(path, "parquet:t.parquet")
    # ... and the rows read so far after every batch (a footer can understate nothing: the
    # distinct values' text counts too)
    monkeypatch.setenv("DPSYNTH_MEMORY_BUDGET", "170K")
    with pytest.raises(DataError, match=r"the table.s first .* rows would need about"):
        read_parquet_table(path, "parquet:t.parquet")
    monkeypatch.delenv("DPSYNTH_MEMORY_BUDGET")
    assert read_parquet_table(path).n == 5000
    long = _write(tmp_path / "long.parquet", pa.table({"t": ["y" * 5000], "c": ["a"]}))
    with pytest.raises(DataError, match="more than the cap of 4096"):
        read_parquet_table(long, "parquet:long.parquet")


def test_the_spec_kind_and_its_hints(tmp_path: Path) -> None:
    path = _write(tmp_path / "t.parquet", pa.table({"a": [1, 2], "t": ["x", "y"]}))
    parsed = parse_spec(f"parquet:{path}")
    assert parsed.kind == "parquet" and parsed.is_table
    assert parsed.canonical == f"parquet:{path.resolve()}"
    raw, _, bundled = read_table(f"parquet:{path}")
    assert raw.source == f"parquet:{path}" and bundled is None
    hint = runner.invoke(app, ["data", "schema", str(path)])
    assert hint.exit_code == 2 and f"did you mean parquet:{path}" in hint.stderr
    (tmp_path / "parts").mkdir()
    folder = runner.invoke(app, ["data", "schema", f"parquet:{tmp_path / 'parts'}"])
    assert folder.exit_code == 2 and "partitioned Parquet" in folder.stderr


# ----------------------------------------------------------------------------- the writer


def test_the_arrow_schema_comes_from_the_column_types_alone() -> None:
    schema = parse_schema({
        "target": "y",
        "columns": [
            {"name": "n", "type": "numeric", "min": 0, "max": 1, "missing": True},
            {"name": "i", "type": "integer", "min": 0, "max": 9, "missing": True},
            {"name": "at", "type": "datetime", "min": "2020-01-01T00:00:00",
             "max": "2022-01-01T00:00:00", "timezone": "+01:00"},
            {"name": "day", "type": "date", "min": "2020-01-01", "max": "2022-01-01"},
            {"name": "b", "type": "boolean", "true": "yes", "false": "no", "missing": True},
            {"name": "key", "type": "id"},
            {"name": "c", "type": "categorical", "categories": ["p", ""]},
            {"name": "note", "type": "ignored"},
            {"name": "y", "type": "categorical", "categories": ["a", "b"]},
        ],
    })  # fmt: skip
    arrow = arrow_schema(schema)
    assert [str(f.type) for f in arrow] == [
        "double", "int64", "timestamp[us, tz=+01:00]", "date32[day]", "bool", "string",
        "string", "string", "string",
    ]  # fmt: skip
    import pandas as pd

    frame = pd.DataFrame({
        "n": [0.5, np.nan],
        "i": pd.array([3, None], dtype="Int64"),
        "at": pd.Series(pd.to_datetime(["2021-01-01 10:00:00.7", None], utc=True))
        .dt.tz_convert("+01:00"),
        "day": pd.to_datetime(["2021-02-03", None]),
        "b": pd.array([True, None], dtype="boolean"),
        "key": ["syn-1", "syn-2"],
        "c": ["p", ""],
        "note": ["", ""],
        "y": ["a", "b"],
    })  # fmt: skip
    table = frame_to_arrow(frame, schema)
    assert table.schema == arrow
    rows = table.to_pylist()
    assert rows[0]["n"] == 0.5 and rows[1]["n"] is None
    assert rows[0]["i"] == 3 and rows[1]["i"] is None
    assert rows[0]["at"] == dt.datetime(2021, 1, 1, 10, tzinfo=UTC)  # whole seconds: no %f
    assert rows[0]["day"] == dt.date(2021, 2, 3) and rows[1]["day"] is None
    assert rows[0]["b"] is True and rows[1]["b"] is None
    assert [r["c"] for r in rows] == ["p", None]  # the missing token "" is null
    assert [r["note"] for r in rows] == [None, None]
    assert frame_to_arrow(frame.iloc[:0], schema).schema == arrow  # an empty batch too


# ----------------------------------------------------------------------- train → sample


def _patients(n: int = 300) -> pa.Table:
    rng = np.random.default_rng(0)

    def holes(values: list, every: int) -> list:
        return [None if i % every == 0 else v for i, v in enumerate(values)]

    start = dt.datetime(2021, 1, 1)
    return pa.table({
        "height": pa.array(holes(rng.normal(170, 10, n).round(1).tolist(), 7), pa.float64()),
        "age": pa.array(holes(rng.integers(18, 90, n).tolist(), 5), pa.int64()),
        "city": pa.array(rng.choice(["Paris", "Lyon", "Nice"], n).tolist()),
        "ward": pa.array(holes(rng.choice(["A", "B"], n).tolist(), 4)),
        "smoker": pa.array(holes((rng.random(n) < 0.3).tolist(), 11), pa.bool_()),
        "visit": pa.array([dt.date(2020, 1, 1) + dt.timedelta(days=int(d))
                           for d in rng.integers(0, 900, n)], pa.date32()),
        "seen": pa.array([start + dt.timedelta(seconds=int(s))
                          for s in rng.integers(0, 10**7, n)], pa.timestamp("us")),
        "seen_tz": pa.array([start.replace(tzinfo=UTC) + dt.timedelta(seconds=int(s))
                             for s in rng.integers(0, 10**7, n)],
                            pa.timestamp("us", tz="+01:00")),
        "empty": pa.nulls(n, pa.string()),
        "label": pa.array(rng.choice(["no", "yes"], n).tolist()),
    })  # fmt: skip


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Parquet table, its drafted schema and a tiny mst run trained on it, with its ledger."""
    import torch

    base = tmp_path_factory.mktemp("parquet")
    _write(base / "t.parquet", _patients(), row_group_size=100)
    drafted = runner.invoke(app, ["data", "schema", f"parquet:{base / 't.parquet'}",
                                  "--target", "label"])  # fmt: skip
    assert drafted.exit_code == 0, drafted.output
    (base / "s.json").write_text(drafted.stdout)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        result = runner.invoke(app, [
            "train", "--method", "mst", "--data", f"parquet:{base / 't.parquet'}",
            "--schema", str(base / "s.json"), "--schema-public", "--epsilon", "2",
            "--preset", "tiny", "--out", str(base / "run"),
            "--ledger", str(base / "ledger.jsonl"), "--device", "cpu", "--json",
        ])  # fmt: skip
    finally:
        torch.set_num_threads(threads)
    assert result.exit_code == 0, result.output
    return base


def test_the_draft_types_every_arrow_column(trained: Path) -> None:
    schema = json.loads((trained / "s.json").read_text())
    types = {c["name"]: c["type"] for c in schema["columns"]}
    assert types == {
        "height": "numeric", "age": "integer", "city": "categorical", "ward": "categorical",
        "smoker": "boolean", "visit": "date", "seen": "datetime", "seen_tz": "datetime",
        "empty": "ignored", "label": "categorical",
    }  # fmt: skip
    columns = {c["name"]: c for c in schema["columns"]}
    assert columns["seen_tz"]["timezone"] == "+01:00"
    assert "" in columns["ward"]["categories"]  # nulls are the missing token ""
    inspected = runner.invoke(app, ["data", "inspect", f"parquet:{trained / 't.parquet'}",
                                    "--schema", str(trained / "s.json"), "--json"])  # fmt: skip
    assert inspected.exit_code == 0, inspected.output
    info = json.loads(inspected.stdout)
    assert info["kind"] == "parquet" and info["n"] == 300


def test_sample_writes_typed_nullable_parquet_and_evaluate_reads_it(
    trained: Path, tmp_path: Path
) -> None:
    ledger = tmp_path / "ledger.jsonl"
    shutil.copy(trained / "ledger.jsonl", ledger)
    shutil.copy(trained / "ledger.jsonl.key", tmp_path / "ledger.jsonl.key")
    out = tmp_path / "synth.parquet"
    result = runner.invoke(app, ["sample", str(trained / "run"), "--n", "400", "--out", str(out),
                                 "--ledger", str(ledger), "--device", "cpu", "--json"])  # fmt: skip
    assert result.exit_code == 0, result.output
    table = pq.read_table(out)
    assert {f.name: str(f.type) for f in table.schema} == {
        "height": "double", "age": "int64", "city": "string", "ward": "string",
        "smoker": "bool", "visit": "date32[day]", "seen": "timestamp[us]",
        "seen_tz": "timestamp[us, tz=+01:00]", "empty": "string", "label": "string",
    }  # fmt: skip
    assert table.num_rows == 400
    nulls = {name: table[name].null_count for name in table.column_names}
    assert nulls["empty"] == 400  # ignored: every cell null
    assert nulls["city"] == nulls["label"] == nulls["visit"] == nulls["seen"] == 0
    assert nulls["height"] > 0 and nulls["age"] > 0 and nulls["smoker"] > 0 and nulls["ward"] > 0
    assert "" not in table["ward"].to_pylist()  # the missing token is written as null
    assert set(table["city"].drop_null().to_pylist()) <= {"Paris", "Lyon", "Nice"}
    seen = [s for s in table["seen"].to_pylist() if s is not None]
    assert all(s.microsecond == 0 for s in seen)  # the format writes whole seconds
    manifest = json.loads((tmp_path / "synth.parquet.manifest.json").read_text())
    assert manifest["format"] == "parquet"
    assert manifest["output_sha256"] == hashlib.sha256(out.read_bytes()).hexdigest()
    entries = [json.loads(line) for line in ledger.read_text().splitlines()]
    assert entries[-1]["command"] == "sample" and entries[-1]["details"]["format"] == "parquet"
    assert entries[-1]["output_sha256"] == manifest["output_sha256"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging left
    evaluated = runner.invoke(app, [
        "evaluate", "--synthetic", str(out), "--real", f"parquet:{trained / 't.parquet'}",
        "--metrics", "ml,marginals", "--seeds", "1", "--ledger", str(ledger), "--json",
    ])  # fmt: skip
    assert evaluated.exit_code == 0, evaluated.output
    report = json.loads(evaluated.stdout)
    assert report["n_synthetic"] == 400 and report["real_kind"] == "parquet"
    assert report["metrics"]["marginals"]["one_way"]["mean"] is not None
    mismatch = runner.invoke(app, ["sample", str(trained / "run"), "--n", "5", "--out",
                                   str(tmp_path / "x.csv"), "--format", "parquet",
                                   "--ledger", str(ledger), "--device", "cpu"])  # fmt: skip
    assert mismatch.exit_code == 2 and "ending in .parquet" in mismatch.stderr


# ----------------------------------------------------------------------------- bad files


def _bad_files(base: Path) -> None:
    good = _write(base / "good.parquet", _patients(60)).read_bytes()
    (base / "trunc.parquet").write_bytes(good[: len(good) // 2])
    (base / "cut.parquet").write_bytes(good[:-9])
    (base / "empty.parquet").write_bytes(b"")
    (base / "text.parquet").write_text("a,b\n1,2\n")
    two = {"label": ["no", "yes"]}
    _write(base / "list.parquet", pa.table({"tags": pa.array([[1], [2, 3]]), **two}))
    _write(base / "struct.parquet", pa.table({"where": pa.array([{"x": 1}, {"x": 2}]), **two}))
    maps = pa.array([[("k", 1)], [("k", 2)]], pa.map_(pa.string(), pa.int64()))
    _write(base / "map.parquet", pa.table({"m": maps, **two}))
    _write(base / "binary.parquet", pa.table({"blob": pa.array([b"a", b"b"]), **two}))
    _write(base / "norows.parquet", _patients(60).slice(0, 0))
    duplicate = pa.Table.from_arrays([pa.array([1, 2]), pa.array([3, 4]), pa.array(["a", "b"])],
                                     names=["a", "a", "label"])  # fmt: skip
    _write(base / "dup.parquet", duplicate)


BAD = [
    ("trunc.parquet", "not a readable Parquet file, truncated or corrupt"),
    ("cut.parquet", "not a readable Parquet file, truncated or corrupt"),
    ("text.parquet", "not a readable Parquet file"),
    ("empty.parquet", "the file is empty (0 bytes)"),
    ("list.parquet", "column 'tags' has the nested type list<element: int64>"),
    ("struct.parquet", "column 'where' has the nested type struct<x: int64>"),
    ("map.parquet", "column 'm' has the nested type map<string, int64"),
    ("binary.parquet", "column 'blob' has the type binary"),
    ("norows.parquet", "the table has no rows"),
    ("dup.parquet", "the column name 'a' appears twice"),
]


@pytest.mark.parametrize(("name", "phrase"), BAD, ids=[b[0] for b in BAD])
def test_a_bad_parquet_file_is_one_line_exit_4_and_spends_nothing(
    trained: Path, tmp_path: Path, name: str, phrase: str
) -> None:
    _bad_files(tmp_path)
    shutil.copy(trained / "ledger.jsonl", tmp_path / "ledger.jsonl")
    shutil.copy(trained / "ledger.jsonl.key", tmp_path / "ledger.jsonl.key")
    before = (tmp_path / "ledger.jsonl").read_bytes()
    spec = f"parquet:{tmp_path / name}"
    commands = [
        ["data", "schema", spec],
        ["data", "inspect", spec, "--schema", str(trained / "s.json")],
        ["train", "--method", "mst", "--data", spec, "--schema", str(trained / "s.json"),
         "--schema-public", "--epsilon", "1", "--preset", "tiny", "--out",
         str(tmp_path / "run"), "--ledger", str(tmp_path / "ledger.jsonl"), "--device", "cpu"],
    ]  # fmt: skip
    for args in commands:
        result = runner.invoke(app, args)
        assert "Traceback" not in result.output
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, result.stderr
        assert lines[0].startswith("error:") and phrase in lines[0], lines[0]
        assert f"parquet:{tmp_path / name}" in lines[0]
        assert result.exit_code == 4, result.output
    assert (tmp_path / "ledger.jsonl").read_bytes() == before
    assert not (tmp_path / "run").exists()
