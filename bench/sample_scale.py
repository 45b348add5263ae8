"""Sampling at scale (issue 47, part 3): a table run sampled to a partitioned Parquet release by
worker processes, with its rows per second and the peak memory of the parent and each worker.

    python -m bench.sample_scale --n 10000000 --workers 2          # 10M rows, 2 workers
    python -m bench.sample_scale --rows 20000 --n 200000 --preset tiny     # a smoke run

The training table is bench/big_table.py's census-like table (`--rows` rows × 50 columns,
generated once under `--out` and reused); `--method` (mst) trains on it through the CLI in a
fresh ledger, then `dpsynth sample RUN --n N --out DIR/ --workers W` writes the release
(`--partitions` default: one per million rows). While `sample` runs, this script reads the
resident memory (RSS) of every process of its process group from /proc every `POLL_S`
seconds: the peaks of the parent, of the largest worker and of the group's sum are recorded
(sampled, so a spike shorter than the interval can be missed), and the peak of the group's
summed PSS (proportional set size: the pages the processes share, such as torch's libraries,
counted once, so it is what the group takes from the machine). rows/s is n over the wall time
of the `sample` command (start-up of the interpreter and the workers included), cells/s n ×
columns over it, and rows per CPU second n over the CPU time of the command and its workers
(the steadier figure on a shared machine). The load average at the start and at the end is
recorded: the machine is shared, and other people's work slows it. Writes
`bench/results/<date>-sample-scale/sample-scale-<date>.json` and `.md` (or `--json PATH`; one
entry per run, appended) and prints the entry.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import big_table, leaderboard, machine
from bench.measure import mb
from bench.tables_peers import cli_json

BENCH = Path(__file__).resolve().parent

RESULTS = BENCH / "results"
POLL_S = 0.5
PAGE_MB = os.sysconf("SC_PAGE_SIZE") / 2**20


def _pss_mb(pid: int) -> float:
    """A process's proportional set size in MB (its private pages, and its share of the pages
    it shares with others, such as torch's libraries mapped by every worker); 0 if gone."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return 0.0
    for line in text.splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _group(pgid: int) -> dict[int, tuple[str, float]]:
    """The live processes of a process group: pid → (role, RSS in MB). The role is `parent`
    (the group leader), `worker` (a spawned multiprocessing child) or `other` (its resource
    tracker)."""
    found: dict[int, tuple[str, float]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
            command = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:  # it ended meanwhile
            continue
        fields = text[text.rindex(")") + 2 :].split()
        if int(fields[2]) != pgid:
            continue
        pid = int(stat.parent.name)
        role = "parent" if pid == pgid else "worker" if b"spawn_main" in command else "other"
        found[pid] = (role, int(fields[21]) * PAGE_MB)  # rss, in pages
    return found


def run_sampled(command: list[str], env: dict[str, str]) -> dict[str, Any]:
    """Run `command` in its own process group; wall and CPU seconds, exit code, output and the
    peak RSS (MB) of the parent, the largest worker and the group's sum, and the peak of the
    group's summed PSS (`pss_total`: shared pages counted once)."""
    peaks = {"parent": 0.0, "worker": 0.0, "total": 0.0, "pss_total": 0.0}
    workers: set[int] = set()
    done = threading.Event()
    before = os.times()
    start = time.perf_counter()
    child = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, start_new_session=True
    )

    def poll() -> None:
        while not done.is_set():
            group = _group(child.pid)
            for pid, (role, rss) in group.items():
                if role in peaks:
                    peaks[role] = max(peaks[role], rss)
                if role == "worker":
                    workers.add(pid)
            peaks["total"] = max(peaks["total"], sum(rss for _, rss in group.values()))
            peaks["pss_total"] = max(peaks["pss_total"], sum(_pss_mb(pid) for pid in group))
            done.wait(POLL_S)

    watcher = threading.Thread(target=poll, daemon=True)
    watcher.start()
    try:
        stdout, stderr = child.communicate()
    except BaseException:
        os.killpg(child.pid, signal.SIGKILL)
        raise
    finally:
        done.set()
        watcher.join()
    seconds = time.perf_counter() - start
    times = os.times()  # the command's and its workers' CPU, counted once they are waited for
    return {
        "returncode": child.returncode,
        "stdout": stdout.decode(errors="replace"),
        "stderr": stderr.decode(errors="replace"),
        "seconds": seconds,
        "cpu_seconds": times.children_user
        + times.children_system
        - before.children_user
        - before.children_system,
        "peak_rss_mb": {key: round(value) for key, value in peaks.items()},
        "worker_processes": len(workers),
    }


def main(argv: list[str] | None = None) -> None:
    """Make (or reuse) the table, train, sample, write and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", default="mst")
    parser.add_argument("--epsilon", default="1")
    parser.add_argument("--delta", type=float, default=1e-6)
    parser.add_argument("--preset", default=None)
    parser.add_argument("--rows", type=int, default=100_000, help="training rows")
    parser.add_argument("--n", type=int, default=10_000_000, help="rows sampled")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--partitions", type=int, default=None)
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--keep", action="store_true", help="keep the release under --out")
    parser.add_argument(
        "--out", type=Path, default=Path(tempfile.gettempdir()) / "dpsynth-sample-scale"
    )
    parser.add_argument("--shared", type=Path, default=BENCH.parents[1] / "shared" / "data")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    command = shlex.join(["python", "-m", "bench.sample_scale", *(argv or sys.argv[1:])])
    host = machine.describe("cpu")
    csv, schema = big_table.make_big_table(args.out / f"table-{args.rows}", args.shared, args.rows)
    columns = len(json.loads(schema.read_text())["columns"])
    env = os.environ | {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    with tempfile.TemporaryDirectory(prefix="sample-scale-", dir=args.out) as tmp:
        folder = Path(tmp)
        ledger, run = folder / "ledger.jsonl", folder / "run"
        train = [
            "train", "--method", args.method, "--data", f"csv:{csv}", "--schema", str(schema),
            "--epsilon", args.epsilon, "--delta", repr(args.delta), "--out", str(run),
            "--device", "cpu", "--ledger", str(ledger), "--quiet",
        ]  # fmt: skip
        if args.preset:
            train += ["--preset", args.preset]
        trained, trained_run = cli_json(train, (3600.0, 3 * 3600.0))
        release = folder / "synth" if not args.keep else args.out / "synth"
        sample = [
            *leaderboard.CLI, "sample", str(run), "--n", str(args.n), "--out", f"{release}/",
            "--workers", str(args.workers), "--device", "cpu", "--ledger", str(ledger),
            "--json", "--force",
        ]  # fmt: skip
        if args.partitions:
            sample += ["--partitions", str(args.partitions)]
        if args.batch_size:
            sample += ["--batch-size", str(args.batch_size)]
        sampled = run_sampled(sample, env)
        if sampled["returncode"] != 0:
            raise SystemExit(f"sample failed: {sampled['stderr'][-2000:]}")
        summary = json.loads(sampled["stdout"])
        size = sum(p.stat().st_size for p in release.glob("part-*.parquet"))
    entry = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": command,
        "machine": host,
        "commit": host["commit"],
        "load_average_1min_at_start": host["load_average_1min"],
        "load_average_1min_at_end": os.getloadavg()[0],
        "table": f"{args.rows:,} rows × {columns} columns: {big_table.__doc__.splitlines()[0]}",
        "method": args.method,
        "preset": trained.get("preset"),
        "epsilon_bound": trained.get("epsilon"),
        "train_seconds": round(trained_run.seconds, 1),
        "train_peak_rss_mb": mb(trained_run.peak_rss_mb),
        "n": args.n,
        "partitions": len(summary["partitions"]),
        "workers": summary["workers"],
        "worker_processes_seen": sampled["worker_processes"],
        "batch_size": summary.get("batch_size", args.batch_size),
        "sample_seconds": round(sampled["seconds"], 1),
        "sample_cpu_seconds": round(sampled["cpu_seconds"], 1),
        "rows_per_second": round(args.n / sampled["seconds"]),
        "cells_per_second": round(args.n * columns / sampled["seconds"]),
        "rows_per_cpu_second": round(args.n / max(sampled["cpu_seconds"], 1e-9)),
        "peak_rss_mb": sampled["peak_rss_mb"],
        "parquet_mb": round(size / 2**20, 1),
    }
    day = f"{datetime.now(UTC):%Y-%m-%d}"
    json_path = args.json or RESULTS / f"{day}-sample-scale" / f"sample-scale-{day}.json"
    entries = json.loads(json_path.read_text()) if json_path.is_file() else []
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps([*entries, entry], indent=2) + "\n")
    json_path.with_suffix(".md").write_text(markdown([*entries, entry]))
    print(json.dumps(entry, indent=2))
    print(f"wrote {json_path} and {json_path.with_suffix('.md')}")


def markdown(entries: list[dict[str, Any]]) -> str:
    """One line per run: rows, partitions, workers, time, rows/s, peak RSS, load."""
    lines = [
        "# Sampling to partitioned Parquet\n",
        "| date | method | n | partitions × workers | batch | wall s (CPU s) | rows/s "
        "(per CPU s) | cells/s | peak RSS MB: parent, largest worker, all (PSS of all) "
        "| Parquet MB "
        "| load at start → end |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for e in entries:
        rss = e["peak_rss_mb"]
        per_cpu = e.get("rows_per_cpu_second")
        cells = e.get("cells_per_second")
        lines.append(
            f"| {e['date'][:16]} | {e['method']} | {e['n']:,} | {e['partitions']} × "
            f"{e['workers']} | {e['batch_size']:,} | {e['sample_seconds']:.0f} "
            f"({e['sample_cpu_seconds']:.0f}) | {e['rows_per_second']:,}"
            f"{f' ({per_cpu:,})' if per_cpu else ''} | {f'{cells:,}' if cells else ''} "
            f"| {rss['parent']}, {rss['worker']}, {rss['total']}"
            f"{f' ({pss})' if (pss := rss.get('pss_total')) else ''} | {e['parquet_mb']} "
            f"| {e['load_average_1min_at_start']:.1f} → {e['load_average_1min_at_end']:.1f} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
