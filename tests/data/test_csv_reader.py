"""The streamed CSV reader: chunked parsing gives the table a whole read gives, distinct values
are shared, and the checks and caps still name the right row when it is in a later chunk."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dpsynth.data import csvtable
from dpsynth.data.csvtable import read_csv_table
from dpsynth.data.limits import MAX_CSV_FIELD_CHARS
from dpsynth.errors import DataError

ROWS = 53


def _write(path: Path, rows: list[str]) -> Path:
    text = "age, city ,note\n" + "\n".join(rows) + "\n"
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return path


def _rows() -> list[str]:
    cities = ["Oslo", " Bergen", "Tromsø ", '"Ski, Akershus"']
    return [f"{20 + i % 7}, {cities[i % 4]},n{i % 11}" for i in range(ROWS)]


@pytest.mark.parametrize("suffix", [".csv", ".csv.gz"])
def test_chunks_give_the_table_a_whole_read_gives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, suffix: str
) -> None:
    path = _write(tmp_path / f"t{suffix}", _rows())
    whole = read_csv_table(path)
    monkeypatch.setattr(csvtable, "_ROWS_PER_CHUNK", 7)  # 8 chunks, the header in the first
    chunked = read_csv_table(path)
    reference = pd.read_csv(path, dtype=str, skipinitialspace=True, keep_default_na=False)
    assert chunked.header == whole.header == ("age", "city", "note")
    assert chunked.n == ROWS
    for i, name in enumerate(chunked.header):
        expected = [v.strip() for v in reference.iloc[:, i].tolist()]
        assert chunked.column(name).tolist() == whole.column(name).tolist() == expected
    assert set(chunked.column("city").tolist()) == {"Oslo", "Bergen", "Tromsø", "Ski, Akershus"}


def test_a_value_is_one_shared_string_across_chunks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(csvtable, "_ROWS_PER_CHUNK", 5)
    table = read_csv_table(_write(tmp_path / "t.csv", _rows()))
    city = table.column("city")
    assert city.dtype == object
    # " Bergen" and "Bergen" strip to one value, held once however many rows and chunks
    assert len({id(v) for v in city.tolist()}) == len(set(city.tolist())) == 4


def test_a_long_field_in_a_later_chunk_is_named_by_its_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = _rows()
    rows[40] = "30,Oslo," + "x" * (MAX_CSV_FIELD_CHARS + 1)
    monkeypatch.setattr(csvtable, "_ROWS_PER_CHUNK", 10)
    with pytest.raises(DataError, match=r"column 'note' row 42 holds a field of 4097 characters"):
        read_csv_table(_write(tmp_path / "t.csv", rows))


def test_the_rows_read_are_checked_against_the_memory_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(csvtable, "_ROWS_PER_CHUNK", 20)
    monkeypatch.setenv("DPSYNTH_MEMORY_BUDGET", "2K")  # 20 rows × 3 fields × 16 B + strings
    with pytest.raises(DataError, match=r"the table's first 19 rows would need about"):
        read_csv_table(_write(tmp_path / "t.csv", _rows()))


def test_bad_text_in_a_later_part_of_a_compressed_file_names_its_line(tmp_path: Path) -> None:
    rows = _rows() * 3000  # about 2 MB of text: the NUL is many stream chunks in
    rows[-5] = "30,Os\0lo,n1"
    with pytest.raises(DataError, match=rf"a NUL byte at line {len(rows) - 3} "):
        read_csv_table(_write(tmp_path / "t.csv.gz", rows))


def test_missing_fields_read_as_before(tmp_path: Path) -> None:
    """A short row's missing fields are empty strings, as the whole read gave them."""
    table = read_csv_table(_write(tmp_path / "t.csv", ["1,Oslo", "2,Ski,n"]))
    assert table.column("note").tolist() == ["", "n"]
    assert np.asarray(table.column("age"), dtype=float).tolist() == [1.0, 2.0]
