"""Where a Dask worker's CPU goes, against the process pool's, for the same parts (issue 71).

Counts the same Parquet parts (`python -m bench.big_table --parquet`: its folder holds
`big.parquet/` and `big.schema.json`) with the same part function, `parts.part_counts`, in
(a) the DuckDB engine's spawned process pool (`parts.count_parts`) and (b) the workers of a
`distributed.LocalCluster` of processes with one thread each (`DaskCounter.count`), for the
check pass (N and the digest) and a counting pass (mst `small`'s 1,226 marginals: the
one-ways and every (pair, target) triple). CPU, not wall time (the machine is shared):

- inside each task, a wrapper of `part_counts` records the task thread's own user and system
  CPU and minor page faults (`getrusage(RUSAGE_THREAD)`), its process's CPU over the task
  (`time.process_time`: every thread of it) and the rows;
- around each pass, the CPU of the pool's children (`RUSAGE_CHILDREN`: spawn and imports
  included) or of each Dask worker process, thread by thread (`psutil`, the threads named by
  `threading`), and of this process (the client, and the local cluster's scheduler).

Each case runs `--repeat` times (a Dask case on a cluster of its own, started afresh); every
case's counts are checked equal to the first's. `--cases` picks them (`CASES`): the engine
as it was (`dask-before`: its tasks run as they are, `dask_engine.ROOMY_HEAP` off) and as it
is (`dask`: under `_with_heap`); a cluster started with `MALLOC_TRIM_THRESHOLD_` left out of
`distributed.nanny.pre-spawn-environ` (`dask-no-trim`), or without the workers' sampling
profiler (`dask-no-profile`); and a pool whose children inherit
`MALLOC_TRIM_THRESHOLD_=65536` (`pool-trim`): these separate glibc's allocator settings from
Dask's own work.

    python -m bench.tables_dask_cpu --table /tmp/dpsynth-daskcpu --json out.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench.machine import describe
from dpsynth.data.discrete import ChunkEncoder, schema_domain
from dpsynth.data.engines import dask_engine, parts, table_files
from dpsynth.data.engines.counting import Clique, CountSums
from dpsynth.data.schema_file import read_schema

LOG_ENV = "DPSYNTH_BENCH_CPU_LOG"
# The function the engines run, kept before they are pointed at the timed one below.
_PART_COUNTS = parts.part_counts
# The pool; Dask as it was (`ROOMY_HEAP` off) and as it is; Dask's workers without the
# variable, or without their profiler; the pool with the variable.
CASES = ("pool", "dask-before", "dask", "dask-no-trim", "dask-no-profile", "pool-trim")
# Each Dask case's cluster, a fresh one (a worker that ran tasks under `_with_heap` keeps
# the larger heap they left: later tasks there fault less than on a fresh worker):
# (MALLOC_TRIM_THRESHOLD_ set, the workers' profiler on).
CLUSTERS = {
    "dask-before": (True, True),
    "dask": (True, True),
    "dask-no-trim": (False, True),
    "dask-no-profile": (True, False),
}
TRIM = "MALLOC_TRIM_THRESHOLD_"


def timed_part_counts(*arguments: Any) -> parts.Result:
    """`parts.part_counts` of the same arguments, its CPU appended to the log (see the
    module) as one JSON line in `$DPSYNTH_BENCH_CPU_LOG/PID.jsonl`."""
    before = resource.getrusage(resource.RUSAGE_THREAD)
    process, wall = time.process_time(), time.perf_counter()
    result = _PART_COUNTS(*arguments)
    after = resource.getrusage(resource.RUSAGE_THREAD)
    line = {
        "pid": os.getpid(),
        "groups": list(arguments[1]),
        "rows": int(result[1]),
        "thread_user_s": after.ru_utime - before.ru_utime,
        "thread_sys_s": after.ru_stime - before.ru_stime,
        "thread_minflt": after.ru_minflt - before.ru_minflt,
        "process_cpu_s": time.process_time() - process,
        "wall_s": time.perf_counter() - wall,
        "malloc_trim_env": os.environ.get(TRIM),
    }
    folder = os.environ.get(LOG_ENV)
    if folder:
        with open(Path(folder) / f"{os.getpid()}.jsonl", "a") as handle:
            handle.write(json.dumps(line) + "\n")
    return result


def mst_cliques(d: int) -> list[Clique]:
    """mst `small`'s first count: the one-ways and every (pair, target) triple (target last)."""
    target = d - 1
    pairs = [(a, b, target) for a in range(target) for b in range(a + 1, target)]
    return [(j,) for j in range(d)] + pairs


def _task_lines(folder: Path) -> list[dict[str, Any]]:
    lines = []
    for log in sorted(folder.glob("*.jsonl")):
        lines += [json.loads(x) for x in log.read_text().splitlines() if x]
        log.unlink()
    return lines


def _children_cpu() -> tuple[float, float]:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime, usage.ru_stime


def pool_pass(
    files: Any, encoder: ChunkEncoder, cliques: list[Clique], digest: bool, part_rows: int
) -> tuple[CountSums, dict[str, Any]]:
    """One pass in the process pool (two workers), and its CPU."""
    chosen = parts.parquet_parts(files, part_rows)
    user, system = _children_cpu()
    mine, wall = time.process_time(), time.perf_counter()
    sums = parts.count_parts(chosen, encoder, cliques, digest, files.name, 2, lambda _: None)
    user2, system2 = _children_cpu()
    cpu = {
        "wall_s": time.perf_counter() - wall,
        "client_cpu_s": time.process_time() - mine,
        "workers_user_s": user2 - user,
        "workers_sys_s": system2 - system,
    }
    return sums, cpu


def _thread_cpu(pids: Sequence[int]) -> dict[int, dict[int, tuple[float, float]]]:
    import psutil

    return {
        pid: {t.id: (t.user_time, t.system_time) for t in psutil.Process(pid).threads()}
        for pid in pids
    }


def _thread_names() -> dict[int, str]:
    """This process's threads by native id (run on each worker)."""
    return {t.native_id or 0: t.name for t in threading.enumerate()}


def _name(name: str) -> str:
    """A thread's kind: its name without the pid or index Dask puts in it."""
    if "Dask-Default-Threads" in name:
        return "task thread (Dask-Default-Threads)"
    return name


def dask_pass(
    client: Any, files: Any, encoder: ChunkEncoder, cliques: list[Clique], digest: bool
) -> tuple[CountSums, dict[str, Any]]:
    """One pass on the cluster's workers (`DaskCounter.count`), and its CPU, thread by thread
    (the nannies of a local cluster run in this process: in `client_cpu_s`)."""
    pids = client.run(os.getpid)
    names = client.run(_thread_names)
    before = _thread_cpu(list(pids.values()))
    mine, wall = time.process_time(), time.perf_counter()
    counter = dask_engine.DaskCounter(client, files, encoder, None)
    sums = counter.count(cliques, lambda _: None, digest)
    elapsed, client_cpu = time.perf_counter() - wall, time.process_time() - mine
    after = _thread_cpu(list(pids.values()))
    for address, named in client.run(_thread_names).items():  # a thread started meanwhile
        names[address].update(named)
    threads: dict[str, list[float]] = {}
    user = system = 0.0
    for address, pid in pids.items():
        for tid, (u, s) in after[pid].items():
            u0, s0 = before[pid].get(tid, (0.0, 0.0))
            kind = _name(names[address].get(tid, "other (not a Python thread)"))
            threads.setdefault(kind, [0.0, 0.0])
            threads[kind][0] += u - u0
            threads[kind][1] += s - s0
            user, system = user + u - u0, system + s - s0
    cpu = {
        "wall_s": elapsed,
        "client_cpu_s": client_cpu,
        "workers_user_s": user,
        "workers_sys_s": system,
        "worker_threads_user_sys_s": {k: [round(x, 3) for x in v] for k, v in threads.items()},
    }
    return sums, cpu


@contextlib.contextmanager
def cluster(trim: bool, profile: bool) -> Iterator[Any]:
    """A client of a local cluster of two worker processes × one thread, with Dask's
    `MALLOC_TRIM_THRESHOLD_` for its workers or without it, and with its workers' sampling
    profiler or without it. Its nannies set their `pre-spawn-environ` in this process's
    environment: it is put back once they have started their workers."""
    import dask
    from distributed import Client, LocalCluster

    environ = dict(dask.config.get("distributed.nanny.pre-spawn-environ"))
    if not trim:
        environ.pop(TRIM, None)
    settings = {
        "distributed.nanny.pre-spawn-environ": environ,
        "distributed.worker.profile.enabled": profile,
    }
    with dask.config.set(settings), _environ(TRIM, None):
        local = LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
        )
        client = Client(local)
    try:
        client.submit(int, 1, pure=False).result()  # the workers imported and ready
        yield client
    finally:
        client.close()
        local.close()


def _same(a: CountSums, b: CountSums) -> bool:
    return (
        a.rows == b.rows
        and all(np.array_equal(x, y) for x, y in zip(a.totals, b.totals, strict=True))
        and np.array_equal(a.hash_sums, b.hash_sums)
    )


def _summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the repeats, per task and per pass."""
    tasks = [t for r in runs for t in r["tasks"]]
    rows = sum(t["rows"] for t in tasks) / len(runs)

    def median(key: str) -> float:
        return round(statistics.median(r["cpu"][key] for r in runs), 3)

    def per_million(key: str) -> float:
        total = sum(t[key] for t in tasks) / len(runs)
        return round(total / rows * 1e6, 3)

    workers = statistics.median(
        r["cpu"]["workers_user_s"] + r["cpu"]["workers_sys_s"] for r in runs
    )
    full = [t for t in tasks if len(t["groups"]) == max(len(u["groups"]) for u in tasks)]
    return {
        "tasks_per_pass": len(tasks) // len(runs),
        "full_part_rows": full[0]["rows"],
        "full_part_process_cpu_s_median": round(
            statistics.median(t["process_cpu_s"] for t in full), 3
        ),
        "rows_per_pass": int(rows),
        "task_thread_user_s_per_1m_rows": per_million("thread_user_s"),
        "task_thread_sys_s_per_1m_rows": per_million("thread_sys_s"),
        "task_thread_minflt_per_1m_rows": round(per_million("thread_minflt")),
        "task_process_cpu_s_per_1m_rows": per_million("process_cpu_s"),
        "workers_cpu_s_per_1m_rows_median": round(workers / rows * 1e6, 3),
        "workers_user_s_median": median("workers_user_s"),
        "workers_sys_s_median": median("workers_sys_s"),
        "client_cpu_s_median": median("client_cpu_s"),
        "wall_s_median": median("wall_s"),
        "load_1min": [r["load_1min"] for r in runs],
    }


def run_case(
    case: str, client: Any, files: Any, encoder: ChunkEncoder, pass_: str, log: Path, rows: int
) -> tuple[CountSums, dict[str, Any]]:
    """One pass of one case; its sums and record (CPU, the tasks' lines, the load)."""
    cliques = [] if pass_ == "check" else mst_cliques(len(encoder.domain.sizes))
    digest = pass_ == "check"
    _task_lines(log)
    if case.startswith("pool"):
        part_rows = dask_engine._GROUPS_PER_TASK * rows  # the Dask tasks' parts
        with _environ(TRIM, "65536" if case == "pool-trim" else None):
            sums, cpu = pool_pass(files, encoder, cliques, digest, part_rows)
    else:
        dask_engine.ROOMY_HEAP = case != "dask-before"
        try:
            sums, cpu = dask_pass(client, files, encoder, cliques, digest)
        finally:
            dask_engine.ROOMY_HEAP = True
    record = {"case": case, "pass": pass_, "cpu": cpu, "tasks": _task_lines(log)}
    record["load_1min"] = round(os.getloadavg()[0], 2)
    return sums, record


@contextlib.contextmanager
def _environ(key: str, value: str | None) -> Iterator[None]:
    old = os.environ.pop(key, None)
    if value is not None:
        os.environ[key] = value
    try:
        yield
    finally:
        os.environ.pop(key, None)
        if old is not None:
            os.environ[key] = old


def measure(
    table: Path, cases: Sequence[str], repeat: int, log: Path, show: Callable[[str], None]
) -> dict[str, Any]:
    """Every case's check and counting passes, `repeat` times; the counts of every case
    checked equal to the first's."""
    import pyarrow.parquet as pq

    schema = read_schema(table / "big.schema.json")
    encoder = ChunkEncoder(schema, schema_domain(schema, 12, True))
    files = table_files(f"parquet:{table / 'big.parquet'}")
    group_rows = pq.read_metadata(files.paths[0]).row_group(0).num_rows
    runs: dict[str, list[dict[str, Any]]] = {}
    first: dict[str, CountSums] = {}
    parts.part_counts = dask_engine.part_counts = timed_part_counts  # type: ignore[assignment]
    try:
        for case in cases:  # a fresh cluster per Dask case (one at a time: modest memory)
            settings = CLUSTERS.get(case)
            with cluster(*settings) if settings else contextlib.nullcontext() as client:
                for _ in range(repeat):
                    for pass_ in ("check", "counting"):
                        sums, record = run_case(
                            case, client, files, encoder, pass_, log, group_rows
                        )
                        if not _same(first.setdefault(pass_, sums), sums):
                            raise SystemExit(f"{case} {pass_}: counts differ from the first's")
                        runs.setdefault(f"{case} {pass_}", []).append(record)
                        show(f"{case} {pass_}: {json.dumps(record['cpu'])}")
    finally:
        parts.part_counts = dask_engine.part_counts = _PART_COUNTS
    return {
        "summary": {key: _summary(value) for key, value in runs.items()},
        "runs": runs,
    }


def _table_stamp(table: Path) -> dict[str, Any] | None:
    """What `bench.big_table --parquet` recorded of the table (rows, seed, rows per file)."""
    stamp = table / "bigpq.json"
    return json.loads(stamp.read_text()) if stamp.is_file() else None


def main() -> None:
    """Run the measurement and write its JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table", type=Path, required=True, help="folder of big_table.py")
    parser.add_argument("--cases", default=",".join(CASES), help=f"of {', '.join(CASES)}")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", type=Path, required=True)
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    cases = [c for c in args.cases.split(",") if c]
    log = args.json.parent / f".{args.json.stem}-tasks"
    log.mkdir(parents=True, exist_ok=True)
    os.environ[LOG_ENV] = str(log.resolve())
    machine = describe("cpu")
    started = time.time()
    out = measure(args.table, cases, args.repeat, log, lambda line: print(line, flush=True))
    log.rmdir()
    record = {
        "machine": machine,
        "command": "python -m bench.tables_dask_cpu " + " ".join(sys.argv[1:]),
        "table": _table_stamp(args.table),
        "cases": cases,
        "repeat": args.repeat,
        "wall_s": round(time.time() - started, 1),
        "load_1min_after": round(os.getloadavg()[0], 2),
        **out,
    }
    args.json.write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record["summary"], indent=1))


if __name__ == "__main__":  # run as the importable module (its functions go to workers by name)
    from bench.tables_dask_cpu import main as run

    run()
