"""Times of day written as HHMM integers (`"clock": "hhmm"`): drafted, encoded as minutes
since midnight, and released only as real times of day."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from dpsynth.cli import app
from dpsynth.data.clock import hhmm_to_minutes, looks_like_clock, minutes_to_hhmm
from dpsynth.data.schema import Column
from dpsynth.data.schema_draft import draft_column
from dpsynth.data.schema_file import parse_schema
from dpsynth.data.table_codec import RawTable, encode_table
from dpsynth.errors import DataError, UsageError

runner = CliRunner()
CLOCK = Column("dep_time", "integer", 0.0, 1440.0, clock="hhmm")


def _every_time_of_day() -> np.ndarray:
    """All 1,441 HHMM values from 0 (00:00) to 2400 (24:00), as floats."""
    hours, minutes = np.divmod(np.arange(1441), 60)
    return (hours * 100 + minutes).astype(float)


def _is_hhmm(values: pd.Series) -> bool:
    hours, minutes = np.divmod(values.to_numpy(int), 100)
    return bool(((hours < 24) & (minutes < 60) | (hours == 24) & (minutes == 0)).all())


def test_every_time_of_day_maps_to_its_minute_and_back() -> None:
    times = _every_time_of_day()
    minutes = hhmm_to_minutes(times, CLOCK, "t")
    assert minutes.tolist() == list(range(1441))
    assert minutes_to_hhmm(minutes).tolist() == times.tolist()
    assert np.isnan(hhmm_to_minutes(np.array([np.nan, 517.0]), CLOCK, "t")[0])
    # what a model decodes between minutes is rounded to a minute, and kept in the day
    assert minutes_to_hhmm(np.array([59.6, -3.0, 1500.0])).tolist() == [100.0, 0.0, 2400.0]


@pytest.mark.parametrize("bad", [1275.0, 2401.0, 2460.0, -5.0, 930.5])
def test_a_cell_that_is_not_a_time_of_day_is_refused_with_its_row(bad: float) -> None:
    with pytest.raises(DataError, match=r"row 3 holds .*not a time of day"):
        hhmm_to_minutes(np.array([517.0, bad]), CLOCK, "t.csv")


def test_only_time_named_hhmm_columns_past_one_oclock_look_like_clocks() -> None:
    times = np.array([517.0, 1359.0, 2400.0, 1.0])
    assert looks_like_clock("dep_time", times)
    assert looks_like_clock("sched_arr_time", times) and looks_like_clock("HHMM", times)
    assert not looks_like_clock("air_time", times)  # a duration in minutes
    assert not looks_like_clock("distance", times)  # not named for a time
    assert not looks_like_clock("dep_time", np.array([517.0, 1275.0]))  # 12:75 is no time
    assert not looks_like_clock("time", np.array([5.0, 30.0, 59.0]))  # counts below 01:00


def test_draft_types_a_clock_with_its_range_in_minutes_and_says_so() -> None:
    # more distinct values than a column of integer codes has
    times = [f"{h * 100 + m}" for h in range(6, 24) for m in (5, 35)]
    values = np.array([*times, "2400", "", "5"], dtype=object)
    drafted = draft_column("dep_time", values, rows=len(values))
    column = drafted.column
    assert (column.type, column.clock, column.missing) == ("integer", "hhmm", True)
    assert (column.min, column.max) == (5.0, 1440.0)
    assert column.data_derived  # the range was read off the data: released or reviewed
    assert drafted.remark is not None and "HHMM" in drafted.remark
    duration = draft_column("air_time", np.array(["20", "695", "130", "45"], object), rows=4)
    assert duration.column.clock is None


def test_schema_file_checks_the_clock_and_writes_it_back() -> None:
    entry = {"name": "t", "type": "integer", "clock": "hhmm", "min": 0, "max": 1440}
    schema = parse_schema({"target": "y", "columns": [entry, _target()]})
    assert schema.columns[0].clock == "hhmm"
    assert schema.columns[0].to_json()["clock"] == "hhmm"
    for wrong, message in (
        ({**entry, "type": "numeric"}, "integer column"),
        ({**entry, "clock": "hh:mm"}, "must be one of hhmm"),
        ({**entry, "max": 2400}, "minutes since midnight"),
    ):
        with pytest.raises(UsageError, match=message):
            parse_schema({"target": "y", "columns": [wrong, _target()]})


def _target() -> dict:
    return {"name": "y", "type": "categorical", "categories": ["a", "b"]}


def test_codec_encodes_minutes_and_decodes_hhmm() -> None:
    entry = {"name": "t", "type": "integer", "clock": "hhmm", "min": 0, "max": 1440}
    schema = parse_schema({"target": "y", "columns": [entry, _target()]})
    raw = RawTable(
        ("t", "y"),
        (np.array(["0", "1159", "2400"], object), np.array(["a", "b", "a"], object)),
        "t.csv",
    )
    table = encode_table(raw, schema, "t", "csv")
    # minutes 0, 719 and 1440 on [0, 1440] scale to -1, about 0, and 1
    assert table.x[:, 0].tolist() == pytest.approx([-1.0, 719 / 720 - 1, 1.0], abs=1e-6)
    frame = table.codec.decode(table.x.numpy(), table.y.numpy(), np.random.default_rng(0))
    assert frame["t"].tolist() == [0, 1159, 2400]


def _flights(rows: int, seed: int = 3) -> pd.DataFrame:
    """A flights-style table: departures as HHMM integers with empty cells (cancellations)."""
    rng = np.random.default_rng(seed)
    scheduled = rng.choice(np.arange(5 * 60, 23 * 60 + 59, 5), rows)
    delay = np.clip(rng.exponential(15, rows) - 5, -10, 300).astype(int)
    departed = (scheduled + delay) % 1440
    as_hhmm = (departed // 60 * 100 + departed % 60).astype(object)
    as_hhmm[rng.random(rows) < 0.03] = ""
    return pd.DataFrame(
        {
            "sched_dep_time": scheduled // 60 * 100 + scheduled % 60,
            "dep_time": as_hhmm,
            "carrier": rng.choice(["AA", "B6", "DL", "UA"], rows),
            "origin": rng.choice(["EWR", "JFK", "LGA"], rows),
        }
    )


def test_the_safe_path_releases_only_real_times_of_day(tmp_path: Path) -> None:
    """A user's flights table through `data schema` → `train` (the DP schema release) →
    `sample`: every released departure is a time of day, the empty cells survive, and the
    hours keep their shape (before, HHMM was an integer and 1275 could come out)."""
    real = _flights(4000)
    path = tmp_path / "flights.csv"
    real.to_csv(path, index=False)
    drafted = runner.invoke(app, ["data", "schema", f"csv:{path}", "--target", "origin"])
    assert drafted.exit_code == 0, drafted.output
    draft = json.loads(drafted.stdout)
    clocks = [c["name"] for c in draft["columns"] if c.get("clock") == "hhmm"]
    assert clocks == ["sched_dep_time", "dep_time"]
    schema = tmp_path / "schema.json"
    schema.write_text(drafted.stdout)
    ledger = tmp_path / "ledger.jsonl"
    trained = runner.invoke(
        app,
        ["train", "--method", "mst", "--data", f"csv:{path}", "--schema", str(schema),
         "--epsilon", "5", "--out", str(tmp_path / "run"), "--ledger", str(ledger), "--json"],
    )  # fmt: skip
    assert trained.exit_code == 0, trained.output
    out = tmp_path / "synth.csv"
    sampled = runner.invoke(
        app, ["sample", str(tmp_path / "run"), "--n", "3000", "--out", str(out),
              "--ledger", str(ledger)],
    )  # fmt: skip
    assert sampled.exit_code == 0, sampled.output
    synthetic = pd.read_csv(out, dtype=str, keep_default_na=False)
    departed = synthetic["dep_time"][synthetic["dep_time"] != ""]
    assert departed.str.fullmatch(r"\d{1,4}").all()
    scheduled = synthetic["sched_dep_time"][synthetic["sched_dep_time"] != ""]
    assert _is_hhmm(departed.astype(int)) and _is_hhmm(scheduled.astype(int))
    assert abs((synthetic["dep_time"] == "").mean() - 0.03) < 0.02
    # No real schedule is empty, but the missing share is a DP release: a few may be.
    assert (synthetic["sched_dep_time"] == "").mean() < 0.02
    # the hour of departure keeps its distribution (10 public bins of the day's hours)
    bins = np.arange(0, 25, 2.4)
    real_hours = real["dep_time"][real["dep_time"] != ""].astype(int) // 100
    shares = [np.histogram(h, bins)[0] / len(h) for h in (real_hours, departed.astype(int) // 100)]
    assert 0.5 * np.abs(shares[0] - shares[1]).sum() < 0.1


def test_a_released_range_is_kept_within_the_day() -> None:
    """The DP range release works on a public grid that does not stop at 24:00: what it finds
    past the day is clipped back (public knowledge), keeping at most a point mass there."""
    from dpsynth.training.schema_entries import _edges_within_day

    edges = (-22.0, 300.0, 300.0, 1400.0, 1448.0, 1600.0, 2048.0)
    assert _edges_within_day(edges) == (0.0, 300.0, 300.0, 1400.0, 1440.0, 1440.0)
