"""A Parquet source's passes split into parts (runs of a file's row groups), counted in parallel.

A part is read with pyarrow, only the columns the schema uses (an `ignored` column is never
decoded: `chunks.raw_from_batch` gives it an empty placeholder), its text columns with their
Parquet dictionaries (`read_dictionary`: no per-row strings are made, and
`chunks.raw_from_batch` takes the indices as they are), in batches of whole row groups (up to
`BATCH_ROWS`: a bincount's fixed cost is spread over more rows), encoded with the one encoding
(`ChunkEncoder`) and counted into int64 sums (`counting.CountSums`); the result is the
counts, the rows and the digest's sums, never a row.
The sums are exact integers and wrapping uint64 sums, so they add up to the same figures in
any order: the counts and the content digest do not depend on the parts, their order or the
number of processes.

`count_parts` runs the parts in `workers` spawned processes (a fresh interpreter each: nothing
inherited from this one's threads) and adds their results as they come; one worker counts in
this process. `fold_parts` does the same for a `TableCounter.fold` pass (other exact counts of
each batch, summed). The Dask engine runs the same `part_counts` and `part_fold` on a
cluster's workers.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

import numpy as np

from dpsynth.data.csvtable import RawTable
from dpsynth.data.discrete import ChunkEncoder
from dpsynth.data.engines.chunks import TableFiles, raw_from_batch
from dpsynth.data.engines.counting import Clique, CountSums, fold_chunks
from dpsynth.data.schema import Schema
from dpsynth.errors import DataError

# The most rows a part reads at once (a row group, or a slice of a larger one), the fewest it
# asks for, and about the rows of a part (whole row groups).
BATCH_ROWS = 131_072
MIN_BATCH_ROWS = 65_536
PART_ROWS = 1_000_000

# A part's result: its int64 counts per clique, its rows, its digest sums, its rows counted and
# its folded counts (None without a fold: `counting.CountSums.part`).
Result = tuple[list[np.ndarray], int, np.ndarray, int, Any]


@dataclass(frozen=True)
class Part:
    """Some consecutive row groups of one Parquet file, and their rows (from its footer)."""

    path: str
    groups: tuple[int, ...]
    rows: int


def default_workers() -> int:
    """Worker processes by default: the CPUs this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def parquet_parts(files: TableFiles, part_rows: int = PART_ROWS) -> list[Part]:
    """The source's files cut into parts of whole row groups, about `part_rows` rows each."""
    import pyarrow.parquet as pq

    parts = []
    for path in files.paths:
        metadata = pq.read_metadata(path)
        groups: list[int] = []
        rows = 0
        for g in range(metadata.num_row_groups):
            groups.append(g)
            rows += metadata.row_group(g).num_rows
            if rows >= part_rows:
                parts.append(Part(path, tuple(groups), rows))
                groups, rows = [], 0
        if groups or metadata.num_row_groups == 0:
            parts.append(Part(path, tuple(groups), rows))
    return parts


def part_chunks(
    path: str, groups: Sequence[int], name: str, schema: Schema | None, text: Sequence[str] = ()
) -> Iterator[RawTable]:
    """One part's rows in batches (`chunks.raw_from_batch`; DataError, one line, for a file
    that cannot be read): the columns `schema` uses (all without one), a batch a row group."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
        header = tuple(parquet.schema_arrow.names)
        used = set(header) if schema is None else _used_columns(schema, text)
        read = [n for n in header if n in used]
        strings = [
            f.name
            for f in parquet.schema_arrow
            if f.name in used and (pa.types.is_string(f.type) or pa.types.is_large_string(f.type))
        ]
        metadata = parquet.metadata
        largest = max((metadata.row_group(g).num_rows for g in groups), default=0)
        batch_rows = min(max(largest, MIN_BATCH_ROWS), BATCH_ROWS)
        parquet.close()
        parquet = pq.ParquetFile(path, read_dictionary=strings)
        try:
            batches = parquet.iter_batches(
                batch_rows, row_groups=list(groups), columns=read, use_threads=False
            )
            for batch in batches:
                yield raw_from_batch(batch, name, schema, text, header)
        finally:
            parquet.close()
    except (pa.ArrowException, OSError) as exc:
        line = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        raise DataError(f"{path}: could not read it ({line})") from None


def _used_columns(schema: Schema, text: Sequence[str]) -> set[str]:
    """The columns a pass under `schema` reads: every one it uses (not `ignored`), and those
    whose text is asked for."""
    return {c.name for c in schema.columns if c.type != "ignored"} | set(text)


def part_counts(
    path: str,
    groups: Sequence[int],
    encoder: ChunkEncoder,
    cliques: list[Clique],
    name: str,
    digest: bool,
    fold: Callable[[RawTable], Any] | None = None,
) -> Result:
    """One part's counts, rows, digest sums, rows counted and `fold` of its batches, summed
    (DataError, one line, for a bad cell or file)."""
    schema = encoder.schema if digest else None
    sums = CountSums(encoder.domain.sizes, cliques, schema, fold)
    for raw in part_chunks(path, groups, name, encoder.schema):
        sums.add_codes(encoder(raw), raw)
    return sums.part()


def part_fold(
    path: str,
    groups: Sequence[int],
    count: Callable[[RawTable], Any],
    name: str,
    schema: Schema,
    text: Sequence[str],
) -> tuple[Any, int]:
    """One part's `count` of each batch, summed (`TableCounter.fold`), and its rows."""
    return fold_chunks(part_chunks(path, groups, name, schema, text), count, lambda _: None)


def _each_part(
    parts: Sequence[Part],
    call: Callable[[Part], tuple[Callable[..., Any], tuple[Any, ...]]],
    add: Callable[[Any], None],
    name: str,
    workers: int,
    report: Callable[[int], None],
) -> None:
    """Run `call(part)`'s function on its arguments for every part (in `workers` spawned
    processes) and `add` each result as it comes: one pass. A part's DataError stops the pass
    and is raised here as it was raised there."""
    done = 0
    if workers <= 1 or len(parts) <= 1:
        for part in parts:
            function, arguments = call(part)
            add(function(*arguments))
            done += part.rows
            report(done)
        return
    context = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(max_workers=min(workers, len(parts)), mp_context=context)
    try:
        pending = {pool.submit(*_flat(call(p))): p for p in parts}
        while pending:
            finished, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in finished:
                part = pending.pop(future)
                add(future.result())  # a part's DataError is raised here
                done += part.rows
                report(done)
    except BrokenProcessPool:
        raise DataError(
            f"{name}: a worker process counting it died (out of memory?); lower the memory "
            "use or count on one process"
        ) from None
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _flat(call: tuple[Callable[..., Any], tuple[Any, ...]]) -> tuple[Any, ...]:
    return (call[0], *call[1])


def count_parts(
    parts: Sequence[Part],
    encoder: ChunkEncoder,
    cliques: Sequence[Clique],
    digest: bool,
    name: str,
    workers: int,
    report: Callable[[int], None],
    fold: Callable[[RawTable], Any] | None = None,
) -> CountSums:
    """Every part counted (in `workers` processes) and summed, with `fold` of every batch
    (None: none): one pass."""
    wanted = [tuple(c) for c in cliques]
    sums = CountSums(encoder.domain.sizes, wanted, encoder.schema if digest else None, fold)

    def add(result: Result) -> None:
        counts, rows, hashes, kept, folded = result
        sums.add(counts, rows, hashes if digest else None, kept, folded)

    def call(part: Part) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        return part_counts, (part.path, part.groups, encoder, wanted, name, digest, fold)

    _each_part(parts, call, add, name, workers, report)
    return sums


def fold_parts(
    parts: Sequence[Part],
    count: Callable[[RawTable], Any],
    schema: Schema,
    text: Sequence[str],
    name: str,
    workers: int,
    report: Callable[[int], None],
) -> tuple[Any, int]:
    """Every part's `count` (in `workers` processes), summed: one `TableCounter.fold` pass."""
    out: list[Any] = [None, 0]

    def add(result: tuple[Any, int]) -> None:
        total, rows = result
        if total is not None:
            out[0] = total if out[0] is None else out[0].add(total)
        out[1] += rows

    def call(part: Part) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        return part_fold, (part.path, part.groups, count, name, schema, tuple(text))

    _each_part(parts, call, add, name, workers, report)
    return out[0], out[1]
