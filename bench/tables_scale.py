"""The scale goal of issue 29: `train` and `sample` of a table method on 1M rows × 50 columns,
timed, with each command's peak memory.

    OMP_NUM_THREADS=1 python -m bench.tables_scale --methods dpkernel --epsilon 1
    OMP_NUM_THREADS=1 python -m bench.tables_scale --methods mst --rows 10000000 \
        --format parquet --engine duckdb --n          # issue 47: out of core, no sampling
    python -m bench.tables_scale --rows 20000 --n 2000 20000 --preset tiny     # a smoke run

The table is bench/big_table.py's (census rows resampled with public noise plus 9 extra public
columns; generated once under `--out`, reused while its rows and seed are the same). For each
method (`--methods`, default every table method of the registry) the `dpsynth` CLI trains with
the big table's public schema (`--preset auto` unless `--preset`, δ = `--delta`) in a fresh
ledger under `--timeout` minutes, then samples each `--n` (default 100,000 and 1,000,000 rows):
the same peak memory at both sizes is the "flat memory in sampling" check. Times are wall clock
of the commands (start-up and reading the CSV included); peak memory is each command's maximum
RSS (`wait4`). Writes `bench/results/tables-scale-<date>.json` and `.md` (rows of the same
method, rows and ε are replaced) and prints the table.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import sys
import tempfile
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import big_table, leaderboard, machine
from bench.measure import mb
from bench.tables_peers import cli_json

BENCH = Path(__file__).resolve().parent

RESULTS = BENCH / "results"
# train's line per pass over the data on an engine (`cli/render.py`)
PASS_LINE = re.compile(r"pass (\d+) \(\w+, ([^)]*)\): ([\d,]+) rows in ([\d.]+) s")


def scale_row(
    method: str, data: str, schema: Path, args: argparse.Namespace, folder: Path
) -> dict[str, Any]:
    """Train one method on the big table and sample each --n; times and peak RSS."""
    ledger, run = folder / "ledger.jsonl", folder / "run"
    command = [
        "train", "--method", method, "--data", data, "--schema", str(schema),
        "--epsilon", args.epsilon, "--delta", repr(args.delta), "--out", str(run),
        "--device", "cpu", "--ledger", str(ledger),
    ]  # fmt: skip
    # an engine's run is not --quiet: its one line per pass (on stderr) gives the pass times
    if not args.engine:
        command.append("--quiet")
    if args.preset:
        command += ["--preset", args.preset]
    if args.engine:
        command += ["--engine", args.engine]
    if args.memory_budget:
        command += ["--memory-budget", args.memory_budget]
    for item in args.set or []:
        command += ["--set", item]
    row: dict[str, Any] = {
        "method": method,
        "rows": args.rows,
        "epsilon": args.epsilon,
        "input": data.split(":")[0]
        + (" (partitioned)" if args.format == "parquet" else "")
        + (f", {args.rows // args.repeat:,} rows × {args.repeat}" if args.repeat > 1 else ""),
    }
    limit = (args.timeout * 60, args.timeout * 60 * 3)
    with GroupPeak(str(run)) as group:
        trained, train = cli_json(command, limit)
    row["train_peak_rss_mb"] = mb(train.peak_rss_mb)
    # the engine's worker processes too: the largest sum of the RSS of train's whole
    # process group, sampled every second (`train_peak_rss_mb` is its largest process)
    row["train_peak_rss_all_mb"] = mb(group.peak_mb)
    if train.timed_out:
        return row | {
            "timed_out": f"train did not finish in {args.timeout:g} {train.killed_by} min"
        }
    row |= {
        "preset": trained["preset"],
        "steps": trained["steps"],
        "epsilon_bound": trained["epsilon"],
        "train_seconds": round(train.seconds, 1),
        "train_cpu_seconds": round(train.cpu_seconds, 1),
        "engine": trained.get("engine"),
        "passes": trained.get("passes"),
        "pass_seconds": [
            {"pass": int(m[1]), "what": m[2], "rows": int(m[3].replace(",", "")), "s": float(m[4])}
            for m in PASS_LINE.finditer(train.stderr)
        ],
        "samples": [],
    }
    for n in args.n:
        out = folder / f"synth-{n}.csv"
        _, sampled = cli_json(
            ["sample", str(run), "--n", str(n), "--out", str(out), "--device", "cpu",
             "--ledger", str(ledger), "--quiet"],
            limit,
        )  # fmt: skip
        sample = {"n": n, "peak_rss_mb": mb(sampled.peak_rss_mb)}
        if sampled.timed_out:
            sample["timed_out"] = f"did not finish in {args.timeout:g} {sampled.killed_by} min"
        else:
            sample |= {
                "seconds": round(sampled.seconds, 1),
                "cpu_seconds": round(sampled.cpu_seconds, 1),
                "csv_mb": out.stat().st_size / 2**20,
            }
            out.unlink()
        row["samples"].append(sample)
    return row


class GroupPeak:
    """The peak of the summed RSS of the process group whose command line names `marker`,
    sampled from /proc every `interval` seconds in a thread while the block runs."""

    def __init__(self, marker: str, interval: float = 1.0) -> None:
        self.marker, self.interval = marker, interval
        self.peak_mb = 0.0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> GroupPeak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()

    def _watch(self) -> None:
        group = None
        page = os.sysconf("SC_PAGE_SIZE")
        while not self._done.wait(self.interval):
            stats = {}
            for folder in Path("/proc").glob("[0-9]*"):
                try:
                    text = (folder / "stat").read_text()
                    if group is None and self.marker in (folder / "cmdline").read_text():
                        group = int(text[text.rindex(")") + 2 :].split()[2])
                except (OSError, ValueError):
                    continue
                fields = text[text.rindex(")") + 2 :].split()
                stats[folder.name] = (int(fields[2]), int(fields[21]))  # pgrp, rss pages
            if group is not None:
                total = sum(rss for pgrp, rss in stats.values() if pgrp == group)
                self.peak_mb = max(self.peak_mb, total * page / 2**20)


def markdown(report: dict[str, Any]) -> str:
    """One line per (method, rows, ε): train time and memory, then each sample size's."""
    lines = [
        "| method | preset | rows × columns | input, engine (passes over the data) | ε "
        "| train wall s (CPU s) | train peak MB (largest process, all) "
        "| sample n: wall s, peak MB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in report["rows"]:
        shape = f"{row['rows']:,} × {report['columns']}"
        engine = f"{row.get('input', 'csv')}, {row.get('engine') or 'memory'}"
        engine += f" ({row['passes']})" if row.get("passes") is not None else ""
        if row.get("pass_seconds"):
            engine += ": " + ", ".join(f"{p['what']} {p['s']:.0f} s" for p in row["pass_seconds"])
        head = (
            f"| {row['method']} | {row.get('preset', '–')} | {shape} | {engine} "
            f"| {row['epsilon']} |"
        )
        if "error" in row or "timed_out" in row:
            why = row.get("timed_out") or "failed: " + row["error"].splitlines()[-1][:100]
            lines.append(f"{head} {why} | {row.get('train_peak_rss_mb', '–')} | |")
            continue
        samples = "; ".join(
            f"{s['n']:,}: "
            + (s["timed_out"] if "timed_out" in s else f"{s['seconds']:.0f} s, {s['peak_rss_mb']}")
            for s in row["samples"]
        )
        lines.append(
            f"{head} {row['train_seconds']:.0f} ({row['train_cpu_seconds']:.0f}) "
            f"| {row['train_peak_rss_mb']}, {row.get('train_peak_rss_all_mb', '–')} | {samples} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    """Generate (or reuse) the table, run each method, write and print the results."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", nargs="+", default=None)
    parser.add_argument("--epsilon", default="1")
    parser.add_argument("--delta", type=float, default=1e-6)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--n", type=int, nargs="*", default=[100_000, 1_000_000])
    parser.add_argument("--format", choices=("csv", "parquet"), default="csv")
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="Parquet only: generate --rows / K rows and hard-link their files K times (each "
        "row K times; the throughput of distinct rows at no disk cost)",
    )
    parser.add_argument("--engine", default=None, help="train --engine (default: auto)")
    parser.add_argument("--memory-budget", default=None, help="train --memory-budget")
    parser.add_argument("--preset", default=None)
    parser.add_argument("--set", action="append")
    parser.add_argument(
        "--timeout", type=float, default=60.0, help="CPU minutes per command (wall: 3×)"
    )
    parser.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "dpsynth-scale")
    parser.add_argument("--shared", type=Path, default=BENCH.parents[1] / "shared" / "data")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    command = shlex.join(["python", "-m", "bench.tables_scale", *(argv or sys.argv[1:])])
    if args.format == "parquet" and args.repeat > 1:
        base = args.rows // args.repeat
        once, schema = big_table.make_big_parquet(args.out / str(base), args.shared, base)
        path = big_table.repeat_parquet(once, args.out / f"{base}x{args.repeat}", args.repeat)
    elif args.format == "parquet":
        path, schema = big_table.make_big_parquet(args.out / str(args.rows), args.shared, args.rows)
    else:
        path, schema = big_table.make_big_table(args.out / str(args.rows), args.shared, args.rows)
    data = f"{args.format}:{path}"
    columns = len(json.loads(schema.read_text())["columns"])
    json_path = args.json or RESULTS / f"tables-scale-{datetime.now(UTC):%Y-%m-%d}.json"
    report: dict[str, Any] = {"rows": [], "commands": []}
    if json_path.is_file():
        report = json.loads(json_path.read_text())
    report |= {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine.describe("cpu"),
        "columns": columns,
        "table": big_table.__doc__.splitlines()[0],
        "commands": [*report["commands"], command],
    }
    for method in args.methods or leaderboard.table_methods():
        with tempfile.TemporaryDirectory(prefix=f"scale-{method}-") as tmp:
            try:
                row = scale_row(method, data, schema, args, Path(tmp))
            except RuntimeError as exc:
                row = {"method": method, "rows": args.rows, "epsilon": args.epsilon}
                row["error"] = str(exc)[-2000:]
        print(json.dumps(row), file=sys.stderr, flush=True)

        def key(r: dict[str, Any]) -> tuple:
            return (r["method"], r["rows"], r["epsilon"], r.get("input"), r.get("engine"))

        report["rows"] = [r for r in report["rows"] if key(r) != key(row)] + [row]
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(report, indent=2) + "\n")
        host = report["machine"]
        json_path.with_suffix(".md").write_text(
            f"# Table methods at scale ({report['date'][:10]})\n\n{host['cpu']}, "
            f"{host['cpu_cores']} cores, OMP_NUM_THREADS={host['omp_num_threads']}, load "
            f"{host['load_average_1min']:.1f} at the start · {report['table']}\n\n"
            + "".join(f"`{c}`\n\n" for c in report["commands"])
            + markdown(report)
        )
    print(markdown(report))
    print(f"wrote {json_path} and {json_path.with_suffix('.md')}")


if __name__ == "__main__":
    main()
