"""The Dask engine: the same per-chunk encode and bincount on a cluster's workers, summed here.

Why Dask (`distributed`): it installs from the package registry alone (pure Python, no JVM as
Spark needs), runs the same Python encoding on every worker, and has a local cluster for tests.
`--engine dask://host:port` connects to a running scheduler; the workers must import dpsynth
(the same version) and see the files at the same paths (a shared or network file system).

A Parquet source is split into tasks of a file's row groups (each `parts.part_counts`, as the
single-machine engine's processes run it); a CSV is split by Dask's own
reader into byte blocks (every column as text). Each task reads its part, encodes it with the
one encoding and returns int64 counts (the size of the marginals, never rows); the client
sums them. One `counts` call is one pass; so is one `fold` (a DP schema release's round: each
task returns its part's summed counts, `parts.part_fold`, merged in the same tree).

`workers` (`train --workers`) caps the counting tasks in flight: a new one is submitted as one
finishes, and finished results are merged `_FAN_IN` at a time as they come, so a shared cluster
gives this run at most that many of its threads (None: every task submitted at once; the
cluster's own workers and threads bound them). The sums are exact, so the counts do not depend
on it. `dask+tls://host:port` connects over TLS with the client's credentials (`DaskTLS`, or
Dask's own configuration), refused in one line when there are none.

A counting task runs with roomier allocator thresholds (`_with_heap`). A Dask worker is started
with `MALLOC_TRIM_THRESHOLD_=65536` (Dask's default `distributed.nanny.pre-spawn-environ`),
which also turns off glibc's sliding mmap threshold: every array of 128 KiB or more (each
batch's codes, bincount keys and counts) was mapped afresh and its pages faulted in. Measured
on the same parts (`bench/tables_dask_cpu.py`, 2M rows): 9-28 times the page faults of the
pool's processes and 1.7-1.8 times their CPU; under `_with_heap`, within 12% of it (the rest
is the worker's event loop, its sampling profiler about half). While a task of this engine
runs, a worker started so has glibc's own ceilings as thresholds; the last such task puts the
environment's back and trims the heap (`malloc_trim`), as Dask wants its workers to.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from typing import Any

import numpy as np

from dpsynth.data.csvtable import RawTable
from dpsynth.data.discrete import ChunkEncoder
from dpsynth.data.engines.base import TableCounter
from dpsynth.data.engines.chunks import TableFiles, raw_from_frame
from dpsynth.data.engines.counting import Clique, CountSums
from dpsynth.data.engines.dask_tls import DaskTLS, dask_security, dask_spec
from dpsynth.data.engines.parts import part_counts, part_fold
from dpsynth.errors import DataError, UsageError

# Row groups of one file per task.
_GROUPS_PER_TASK = 4
_CSV_BLOCK = "64MB"
# Task results summed on a worker at once (the tree that keeps the client's traffic to one).
_FAN_IN = 8
CONNECT_TIMEOUT_S = 5
# Counting tasks run under `_with_heap` (see the module; False: as they are, for a bench).
ROOMY_HEAP = True
# glibc's mallopt parameters, its sliding mmap threshold's ceiling on 64-bit (twice it for the
# trim threshold, as glibc slides them) and its fixed defaults, which the environment variables
# below leave in place; any of those variables turns the sliding threshold off.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_ROOMY_MMAP = 32 * 2**20
_DEFAULT_THRESHOLD = 128 * 2**10
_FIXED_BY = (
    "MALLOC_TRIM_THRESHOLD_",
    "MALLOC_MMAP_THRESHOLD_",
    "MALLOC_TOP_PAD_",
    "MALLOC_MMAP_MAX_",
)
# This worker process's counting tasks under way, and glibc's functions (None: not glibc).
_HEAP: dict[str, Any] = {"lock": threading.Lock(), "tasks": 0}


Result = tuple[list[np.ndarray], int, np.ndarray, int, Any]  # as `parts.Result`
# What a task is run as: a function and its arguments (the part's or block's own first).
Call = tuple[Callable[..., Any], tuple[Any, ...]]
# A task not yet submitted (a call that submits it and returns its future), and the rows it
# will read (None: not known before).
Pending = tuple[Callable[[], Any], int | None]


def _glibc() -> Any | None:
    """glibc's `mallopt` and `malloc_trim` in this process (None: another C library)."""
    if "libc" not in _HEAP:
        import ctypes

        try:
            libc = ctypes.CDLL(None)
            _HEAP["libc"] = (
                libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
            )
        except OSError:
            _HEAP["libc"] = None
    return _HEAP["libc"]


def _heap_settings(roomy: bool) -> None:
    """glibc's thresholds for counting (`roomy`), or those the environment gave the process."""
    libc = _glibc()
    if libc is None:
        return
    if roomy:
        libc.mallopt(_M_MMAP_THRESHOLD, _ROOMY_MMAP)
        libc.mallopt(_M_TRIM_THRESHOLD, 2 * _ROOMY_MMAP)
        return
    for parameter, variable in (
        (_M_MMAP_THRESHOLD, _FIXED_BY[1]),
        (_M_TRIM_THRESHOLD, _FIXED_BY[0]),
    ):
        given = os.environ.get(variable, "")
        libc.mallopt(parameter, int(given) if given.isdigit() else _DEFAULT_THRESHOLD)
    libc.malloc_trim(0)


def _with_heap(function: Callable[..., Any], *arguments: Any) -> Any:
    """`function(*arguments)` on a worker, under roomy allocator thresholds when the process's
    environment fixed glibc's (see the module): set by the first of this process's counting
    tasks under way, put back by the last. Only the allocator changes: never a count."""
    if not any(v in os.environ for v in _FIXED_BY):
        return function(*arguments)  # glibc slides its own thresholds (as in the pool's)
    with _HEAP["lock"]:
        _HEAP["tasks"] += 1
        if _HEAP["tasks"] == 1:
            _heap_settings(roomy=True)
    try:
        return function(*arguments)
    finally:
        with _HEAP["lock"]:
            _HEAP["tasks"] -= 1
            if _HEAP["tasks"] == 0:
                _heap_settings(roomy=False)


def _submitted(function: Callable[..., Any], *arguments: Any) -> tuple[Any, ...]:
    """A counting task's function and arguments as submitted: under `_with_heap` (unless
    `ROOMY_HEAP` is off)."""
    return (_with_heap, function, *arguments) if ROOMY_HEAP else (function, *arguments)


def _frame_task(
    frame: Any,
    encoder: ChunkEncoder,
    cliques: list[Clique],
    name: str,
    digest: bool,
    fold: Callable[[RawTable], Any] | None = None,
) -> Result:
    sums = CountSums(encoder.domain.sizes, cliques, encoder.schema if digest else None, fold)
    raw = raw_from_frame(frame, name)
    sums.add_codes(encoder(raw), raw)
    return sums.part()


def _merge(*parts: Result) -> Result:
    """The sum of several tasks' counts, row counts, digest sums and folded counts (on a
    worker)."""
    counts = [np.sum(column, axis=0) for column in zip(*(p[0] for p in parts), strict=True)]
    with np.errstate(over="ignore"):
        hashes = np.sum([p[2] for p in parts], axis=0, dtype=np.uint64)
    folded, _ = _fold_merge(*((p[4], 0) for p in parts))
    return counts, sum(p[1] for p in parts), hashes, sum(p[3] for p in parts), folded


def _frame_fold(frame: Any, count: Callable[[RawTable], Any], name: str) -> tuple[Any, int]:
    raw = raw_from_frame(frame, name)
    return count(raw), raw.n


def _fold_merge(*parts: tuple[Any, int]) -> tuple[Any, int]:
    """The sum of several fold tasks' results and rows (on a worker)."""
    total = None
    for part, _ in parts:
        if part is not None:
            total = part if total is None else total.add(part)
    return total, sum(rows for _, rows in parts)


def connect(address: str, tls: DaskTLS | None = None) -> Any:
    """A client of the scheduler at `address` (`HOST:PORT`, or `tls://HOST:PORT` with the
    client's credentials `tls`: `dask_security`); UsageError, one line, when none answers."""
    from distributed import Client

    spec = dask_spec(address)
    security = dask_security(tls) if address.startswith("tls://") else None
    try:
        return Client(address, timeout=CONNECT_TIMEOUT_S, set_as_default=False, security=security)
    except (OSError, TimeoutError, ValueError) as exc:
        reason = type(exc).__name__
        over = " over TLS (or it does not trust the client's certificate)" if security else ""
        raise UsageError(
            f"{{engine}} {spec}: no Dask scheduler answered{over} within {CONNECT_TIMEOUT_S} s "
            f"({reason}); start one (`dask scheduler`) or check the address"
            + ("" if security else " (a scheduler over TLS is dask+tls://HOST:PORT)"),
            parameter="engine",
        ) from None


class DaskCounter(TableCounter):
    """Marginal counts of a file source summed over a Dask cluster's tasks."""

    engine = "dask"

    def __init__(
        self,
        client: Any,
        files: TableFiles,
        encoder: ChunkEncoder,
        record_count: int | None,
        workers: int | None = None,
    ) -> None:
        super().__init__(encoder, record_count)
        self.client, self.files = client, files
        self.workers = None if workers is None else max(1, int(workers))

    def chunks(self, text: Sequence[str] = ()) -> Iterator[RawTable]:  # pragma: no cover
        """Unused: the workers read the chunks."""
        return iter(())

    def _tasks(self, part: Callable[[str, list[int]], Call], block: Call) -> list[Pending]:
        """The pass's tasks, not yet submitted, each with the rows it will read: `part` of a
        Parquet file's row groups, or `block`'s function of each CSV block (its frame
        first)."""
        submit = self.client.submit
        if self.files.kind == "parquet":
            import pyarrow.parquet as pq

            tasks: list[Pending] = []
            for path in self.files.paths:
                metadata = pq.read_metadata(path)
                groups = metadata.num_row_groups
                for start in range(0, max(groups, 1), _GROUPS_PER_TASK):
                    chosen = list(range(start, min(start + _GROUPS_PER_TASK, groups)))
                    rows = sum(metadata.row_group(g).num_rows for g in chosen)
                    function, arguments = part(path, chosen)
                    call = _submitted(function, *arguments)
                    tasks.append((partial(submit, *call, pure=False), rows))
            return tasks
        import dask.dataframe as dd

        frame = dd.read_csv(
            self.files.paths[0],
            dtype=str,
            keep_default_na=False,
            na_filter=False,
            skipinitialspace=True,
            blocksize=_CSV_BLOCK,
        )
        function, arguments = block

        def counted(piece: Any) -> Any:  # the block read, then counted, when submitted
            call = _submitted(function, self.client.compute(piece), *arguments)
            return submit(*call, pure=False)

        return [(partial(counted, piece), None) for piece in frame.to_delayed()]

    def _reduce(
        self,
        tasks: Callable[[], list[Pending]],
        merge: Callable[..., Any],
        report: Callable[[int], None],
    ) -> Any:
        """Every task's result, summed on the workers: at most `workers` tasks in flight (see
        the module), finished results merged `_FAN_IN` at a time as they come, so that this
        process receives one result however many tasks there are (None: no task)."""
        from distributed import as_completed

        try:
            waiting = iter(tasks())
            running = as_completed(loop=self.client.loop)
            planned: dict[str, int | None] = {}

            def submit_next() -> bool:
                task = next(waiting, None)
                if task is not None:
                    future = task[0]()
                    planned[future.key] = task[1]
                    running.add(future)
                return task is not None

            while (self.workers is None or len(planned) < self.workers) and submit_next():
                pass
            ready: list[Any] = []
            done = 0
            for future in running:
                if future.status == "error":
                    future.result()  # a task's DataError is raised here
                if future.key in planned:  # a counting task (not a merge): one more may start
                    rows = planned.pop(future.key)
                    if rows is not None:  # a Parquet task's rows come from its footer
                        done += rows
                        report(done)
                    submit_next()
                ready.append(future)
                if len(ready) == _FAN_IN:
                    running.add(self.client.submit(merge, *ready, pure=False))
                    ready = []
            if len(ready) > 1:
                ready = [self.client.submit(merge, *ready, pure=False)]
            return ready[0].result() if ready else None
        except DataError:
            raise
        except (OSError, TimeoutError) as exc:
            raise DataError(f"{self.files.name}: the Dask cluster failed ({exc})") from None

    def count(
        self,
        cliques: Sequence[Clique],
        report: Callable[[int], None],
        digest: bool,
        fold: Callable[[RawTable], Any] | None = None,
    ) -> CountSums:
        """One pass: every task's counts (and `fold` of its rows), summed on the workers."""
        wanted = [tuple(c) for c in cliques]
        sums = CountSums(self.sizes, wanted, self.encoder.schema if digest else None, fold)
        encoder, name = self.encoder, self.files.name

        def part(path: str, groups: list[int]) -> Call:
            return part_counts, (path, groups, encoder, wanted, name, digest, fold)

        block = (_frame_task, (encoder, wanted, name, digest, fold))
        result = self._reduce(lambda: self._tasks(part, block), _merge, report)
        if result is not None:
            counts, rows, hashes, kept, folded = result
            sums.add(counts, rows, hashes if digest else None, kept, folded)
        return sums

    def fold_chunks(
        self, count: Callable[[RawTable], Any], text: tuple[str, ...], report: Callable[[int], None]
    ) -> tuple[Any, int]:
        """One fold pass: every task's `count` results, summed on the workers."""
        schema, name = self.encoder.schema, self.files.name

        def part(path: str, groups: list[int]) -> Call:
            return part_fold, (path, groups, count, name, schema, text)

        block = (_frame_fold, (count, name))
        result = self._reduce(lambda: self._tasks(part, block), _fold_merge, report)
        return (None, 0) if result is None else result

    def close(self) -> None:
        """Close the client (the cluster keeps running)."""
        self.client.close()
