"""A pandas DataFrame as a table: read in memory exactly as a Parquet file of it reads, typed
errors for what Arrow cannot type, and paths given as `Path` read by their kind."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dpsynth.data.engines import EngineChoice
from dpsynth.data.frames import FRAME
from dpsynth.data.sources import is_table_spec, parse_spec, read_table, spec_of_path
from dpsynth.errors import DataError, UsageError
from dpsynth.training.table_source import table_engine


def _frame() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "age": [31, 45, 27, 60],
            "income": [1200.5, np.nan, 0.1, 1e-5],
            "city": ["Lyon", None, " Nice ", "Lyon"],
            "member": [True, False, True, True],
            "grade": pd.Categorical(["a", "b", "a", "c"]),
            "seen": pd.to_datetime(
                ["2024-01-02 00:00", "2024-02-03 10:30", None, "2023-12-31 00:00"]
            ),
        }
    )


def test_a_frame_reads_as_the_parquet_file_of_it(tmp_path: Path) -> None:
    frame = _frame()
    frame.to_parquet(tmp_path / "t.parquet", index=False)
    in_memory, parsed, bundled = read_table(frame)
    on_disk, _, _ = read_table(f"parquet:{tmp_path / 't.parquet'}")
    assert parsed.kind == "frame" and parsed.canonical == FRAME and bundled is None
    assert in_memory.header == on_disk.header
    for mine, theirs in zip(in_memory.columns, on_disk.columns, strict=True):
        assert list(mine) == list(theirs)
    # missing cells are empty, text stripped, numbers their exact shortest text
    assert list(in_memory.column("income")) == ["1200.5", "", "0.1", "1e-05"]
    assert list(in_memory.column("city")) == ["Lyon", "", "Nice", "Lyon"]
    assert list(in_memory.column("member")) == ["true", "false", "true", "true"]
    assert (
        in_memory.column("seen")[2] == "" and in_memory.column("seen")[1] == "2024-02-03 10:30:00"
    )
    assert is_table_spec(frame)


def test_what_arrow_cannot_type_is_a_data_error_naming_the_column() -> None:
    frame = pd.DataFrame({"ok": [1, 2], "mixed": [1, "two"]})
    with pytest.raises(DataError, match="'mixed'"):
        read_table(frame)


def test_the_spec_a_frames_run_records_is_not_read_as_a_path() -> None:
    with pytest.raises(UsageError, match="DataFrame in memory"):
        parse_spec(FRAME)


def test_a_frame_is_counted_in_memory_only() -> None:
    frame = _frame()
    assert table_engine(frame, EngineChoice("auto"), None, None) == "memory"
    with pytest.raises(UsageError) as refused:
        table_engine(frame, EngineChoice("duckdb"), None, None)
    assert refused.value.parameter == "engine" and "DataFrame" in str(refused.value)


def test_paths_are_read_by_their_kind(tmp_path: Path) -> None:
    (tmp_path / "t.parquet").write_bytes(b"")
    (tmp_path / "x.npz").write_bytes(b"")
    (tmp_path / "rows.csv.gz").write_bytes(b"")
    parts = tmp_path / "parts" / "year=2024"
    parts.mkdir(parents=True)
    (parts / "p0.parquet").write_bytes(b"")
    idx = tmp_path / "mnist"
    idx.mkdir()
    (idx / "train-images-idx3-ubyte").write_bytes(b"")
    images = tmp_path / "images"
    images.mkdir()
    assert spec_of_path(tmp_path / "t.parquet").startswith("parquet:")
    assert spec_of_path(tmp_path / "x.npz").startswith("npz:")
    assert spec_of_path(tmp_path / "rows.csv.gz").startswith("csv:")
    assert spec_of_path(tmp_path / "parts").startswith("parquet:")
    assert spec_of_path(idx).startswith("mnist:")
    assert spec_of_path(images).startswith("folder:")
    parsed = parse_spec(tmp_path / "rows.csv.gz")
    assert parsed.kind == "csv" and parsed.target == str(tmp_path / "rows.csv.gz")
    assert is_table_spec(tmp_path / "t.parquet") and not is_table_spec(images)
