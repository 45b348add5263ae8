"""bench/tables_peers.py, bench/smartnoise_peer.py and bench/big_table.py plumbing: the time
limit and peak memory of child processes, SmartNoise's public binning and its decoding, the
table's cells, and the large generated table (on a small fake census)."""

from __future__ import annotations

import gzip
import importlib
import json
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dpsynth.data.schema_file import read_schema
from dpsynth.data.sources import read_table
from dpsynth.data.table_codec import RawTable, read_csv_table
from dpsynth.evaluation.marginals import discretise, marginal_columns

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def bench():
    return {
        name: importlib.import_module(f"bench.{name}")
        for name in ("tables_peers", "smartnoise_peer", "big_table", "measure")
    }


def test_child_time_limits_cpu_time_and_peak_memory(bench) -> None:
    run = bench["measure"].run_measured
    sleeper = [sys.executable, "-c", "import time; print('x', flush=True); time.sleep(60)"]
    slow = run(sleeper, 60.0, wall_limit_s=1.0)
    assert slow.killed_by == "wall" and slow.seconds < 30 and slow.stdout == "x\n"
    assert math.isnan(slow.peak_rss_mb)
    busy = run([sys.executable, "-c", "while True: pass"], 1.0, wall_limit_s=120.0)
    assert busy.killed_by == "cpu" and busy.timed_out
    work = "x = 0\nfor i in range(3 * 10**7): x += i"
    counted = run([sys.executable, "-c", work], 120.0)
    assert counted.killed_by is None and counted.cpu_seconds > 0.3
    touch = "b = bytearray(300 * 2**20); b[::4096] = b'1' * len(b[::4096])"
    big = run([sys.executable, "-c", touch], 60)
    assert not big.timed_out and big.returncode == 0 and 300 <= big.peak_rss_mb < 1000
    # The child's own peak: a fork of this process would report this process's high-water mark.
    assert run([sys.executable, "-c", "pass"], 60).peak_rss_mb < 100
    failed = run([sys.executable, "-c", "import sys; sys.exit(3)"], 60)
    assert failed.returncode == 3 and not failed.timed_out


def test_smartnoise_gets_the_public_domain_and_decodes_inside_the_bins(bench) -> None:
    peer = bench["smartnoise_peer"]
    raw, _, schema = read_table("german-credit")
    codes, sizes = peer.public_codes(raw, schema)
    columns = marginal_columns(schema)
    assert sizes == [10 if c.is_numeric else len(c.categories) for c in columns]
    assert (codes >= 0).all() and (codes < np.array(sizes)).all()
    frame = peer.decode_codes(codes, schema, np.random.default_rng(0))
    assert list(frame.columns) == [c.name for c in schema.columns]
    back = RawTable(
        tuple(frame.columns), tuple(frame[c].astype(str).to_numpy() for c in frame.columns), "d"
    )
    assert (discretise(back, schema).codes == codes).all()  # every value back in its bin
    # An integer column's bin draws among the integers inside it, all of them in time.
    age = next(j for j, c in enumerate(columns) if c.name == "age_in_years")
    one_bin = np.zeros_like(codes[:2000])
    one_bin[:, age] = 1  # [24.6, 30.2) on the public [19, 75]
    values = peer.decode_codes(one_bin, schema, np.random.default_rng(1))["age_in_years"]
    assert set(values) == set(range(25, 31))
    # Numbers outside the bounds are clipped (the codec's rule), categories must be listed.
    outside = RawTable(raw.header, tuple(c.copy() for c in raw.columns), "x")
    outside.column("age_in_years")[0] = "99"  # above the public max 75
    assert peer.public_codes(outside, schema)[0][0, age] == 9
    outside.column("purpose")[0] = "A9"
    with pytest.raises(ValueError, match="purpose"):
        peer.public_codes(outside, schema)


def test_cells_ranges_and_time_outs(bench) -> None:
    peers = bench["tables_peers"]
    runs = [
        {"tvd_two_way": 0.30, "logreg_roc_auc_mean": 0.7, "train_seconds": 10.0, "preset": "small"},
        {"tvd_two_way": 0.35, "logreg_roc_auc_mean": 0.7, "train_seconds": 14.0, "preset": "small"},
        {"timed_out": True, "limit": "11 CPU min"},
    ]
    cell = {"data": "german-credit", "epsilon": "1", "tool": "dpkernel"} | peers.combine(runs)
    assert cell["finished"] == 2 and cell["tvd_two_way"]["max"] == 0.35
    aim = {"data": "census", "epsilon": "1", "tool": "smartnoise-aim", "aim_rounds": None}
    aim |= peers.combine([{"timed_out": True, "limit": "11 CPU min", "rounds_done": 3,
                          "budget_used": 0.04}])  # fmt: skip
    failed = {"data": "census", "epsilon": "10", "tool": "smartnoise-mst"}
    failed |= peers.combine([{"error": "mst failed (exit 1): boom\nValueError: bad"}])
    page = peers.markdown({"rows": [cell, aim, failed]})
    assert "| german-credit | 1 | dpsynth dpkernel (small) | 0.300–0.350 |" in page
    assert "| 0.700 |" in page and "| – | 10–14 |" in page and "| 2/3 |" in page
    assert "SmartNoise AIM | did not finish in 11 CPU min (3 rounds done, 4% of ρ)" in page
    assert "SmartNoise MST | failed: ValueError: bad" in page
    weighted = cell | {"labels": "weights"}
    assert peers.tool_label(weighted) == "dpsynth dpkernel (small, --labels weights)"
    assert peers.row_key(weighted) != peers.row_key(cell)


def test_a_dpsynth_run_killed_by_the_wall_clock_says_so(bench, monkeypatch, tmp_path) -> None:
    peers, measure = bench["tables_peers"], bench["measure"]
    args = peers.parse_args(["--timeout", "20", "--wall-timeout", "12"])
    for killed_by, text in (("wall", "12 wall min"), ("cpu", "20 CPU min")):
        killed = measure.Finished(-9, "", "", 720.0, 300.0, 900.0, killed_by)
        monkeypatch.setattr(peers, "cli_json", lambda *_a, done=killed: ({}, done))
        table = peers.tables(tmp_path)["german-credit"]
        record = peers.one_run("dpkernel", table, "1", args, 0)
        assert record == {"timed_out": True, "limit": text}


def test_options(bench) -> None:
    peers = bench["tables_peers"]
    quick = peers.parse_args(["--quick"])
    assert quick.data == ["german-credit"] and quick.runs == 1 and quick.preset == "tiny"
    assert quick.methods[-1] == "smartnoise-mst" and quick.epsilon == ["10"]
    full = peers.parse_args([])
    assert full.data == ["german-credit", "census"] and full.runs == 2 and full.methods is None
    with pytest.raises(SystemExit):
        peers.parse_args(["--methods", "nosuchmethod"])
    assert peers.limits(peers.parse_args(["--timeout", "20"])) == (1200, 3600)
    capped = peers.parse_args(["--timeout", "20", "--wall-timeout", "30"])
    assert peers.limits(capped) == (1200, 1800)
    assert peers.limit_text("wall", capped) == "30 wall min"
    assert peers.limit_text("cpu", capped) == "20 CPU min"


def test_big_table_from_a_fake_census(bench, tmp_path: Path) -> None:
    big = bench["big_table"]
    census = read_schema(big.CENSUS_SCHEMA)
    rng = np.random.default_rng(0)
    fake = {}
    for column in census.columns:
        if column.type == "ignored":
            fake[column.name] = rng.uniform(0, 10, 300).round(2)
        elif column.is_numeric:
            fake[column.name] = rng.integers(column.min, column.max + 1, 300)
        else:
            fake[column.name] = rng.choice(column.categories, 300)
    shared = tmp_path / "shared"
    shared.mkdir()
    with gzip.open(shared / "census_income_kdd_train.csv.gz", "wt") as handle:
        pd.DataFrame(fake).to_csv(handle, index=False)
    csv, schema_path = big.make_big_table(tmp_path / "out", shared, rows=2500, seed=1)
    schema = read_schema(schema_path)
    assert len(schema.columns) == 50 and schema.target == "income"
    raw = read_csv_table(csv)
    assert raw.n == 2500 and raw.header == tuple(c.name for c in schema.columns)
    assert discretise(raw, schema).other_share == {}  # every value inside its public domain
    assert raw.column("x0")[0].isdigit()  # integer columns written as integers
    stamp = json.loads((tmp_path / "out" / "big.json").read_text())
    assert stamp["rows"] == 2500
    before = csv.stat().st_mtime_ns
    big.make_big_table(tmp_path / "out", shared, rows=2500, seed=1)
    assert csv.stat().st_mtime_ns == before  # reused, not regenerated


def test_results_from_two_bench_processes_merge(bench, tmp_path: Path) -> None:
    peers = bench["tables_peers"]
    path = tmp_path / "tables-peers.json"

    def meta(command: str, name: str) -> dict:
        host = {"cpu": "CPU", "cpu_cores": 2, "omp_num_threads": "1", "load_average_1min": 3.0}
        return {
            "date": "2026-11-25T07:00:00+00:00", "machine": host, "synthetic_n": 20000,
            "seeds": 1, "order": ["dpkernel", "smartnoise-mst"], "commands": [command],
            "tables": {name: {"delta": 1e-4}},
        }  # fmt: skip

    def row(data: str, tool: str, tvd: float) -> dict:
        return {"data": data, "epsilon": "1", "tool": tool} | peers.combine([{"tvd_two_way": tvd}])

    peers.write(meta("a", "german-credit"), [row("german-credit", "smartnoise-mst", 0.2)], path)
    peers.write(meta("b", "census"), [row("census", "dpkernel", 0.3)], path)
    merged = peers.write(
        meta("a", "german-credit"),
        [row("german-credit", "smartnoise-mst", 0.2), row("german-credit", "dpkernel", 0.4)],
        path,
    )
    assert [(r["data"], r["tool"]) for r in merged["rows"]] == [
        ("census", "dpkernel"), ("german-credit", "dpkernel"), ("german-credit", "smartnoise-mst")
    ]  # fmt: skip
    assert merged["commands"] == ["a", "b"] and set(merged["tables"]) == {"census", "german-credit"}
    again = peers.write(meta("c", "census"), [row("census", "dpkernel", 0.25)], path)
    assert [r["tvd_two_way"]["mean"] for r in again["rows"]] == [0.25, 0.4, 0.2]
    page = path.with_suffix(".md").read_text()
    assert "`a`" in page and "| census | 1 | dpsynth dpkernel | 0.250 |" in page
