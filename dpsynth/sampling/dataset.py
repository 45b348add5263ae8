"""Sampling a table's run into a partitioned Parquet release, in parallel and in flat memory.

`--out` is then a folder laid out as Spark, Dask and pyarrow write datasets, which
`pyarrow.dataset`, `pandas.read_parquet`, DuckDB (`read_parquet('OUT/*.parquet')`), Polars and
Spark read as one table:

    OUT/part-00000.parquet … part-NNNNN.parquet   the rows, one Arrow schema (the run's public
                                                   schema, see `sampling.parquet_out`)
    OUT/_manifest.json                             the release's manifest (see below)
    OUT/_SUCCESS                                   empty: the release is complete

Readers skip names that start with `_` or `.`, so the two small files are never read as rows.
The partitions (`sampling.partitions`) are drawn by worker processes
(`sampling.partition_worker`), each from its own public seed, so the release is the same
whatever the number of workers. Everything is written into a hidden staging folder beside
OUT and renamed into place once every partition is written, fsynced and recorded: a killed
run never leaves a folder that looks complete (the next `sample` into the same parent removes
its staging folder). The manifest lists every partition (file, rows, first row, seed, label
counts, SHA-256); `output_sha256`, recorded in the ledger's zero-cost release, is the SHA-256
of each partition's name, a NUL byte and its file's SHA-256, in partition order. Within a
partition the rows come in a random order of their classes, drawn from its seed too (see
`sampling.labels.shuffled_label_chunks`).
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import re
import shutil
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

from dpsynth.data.limits import check_batch_size
from dpsynth.errors import DpsynthError, UsageError
from dpsynth.rundir import RunDir, write_json_atomic
from dpsynth.sampling.options import SampleOptions
from dpsynth.sampling.outputs import check_release_target, record_release
from dpsynth.sampling.partition_worker import start_worker, write_partition
from dpsynth.sampling.partitions import (
    Partition,
    check_workers,
    dataset_batch,
    partition_count,
    plan_partitions,
    row_values,
)
from dpsynth.sampling.table_release import check_not_protected, table_labels, table_manifest
from dpsynth.sampling.trained_run import load_generator, run_privacy, set_truncation
from dpsynth.staging import remove_stale_staging, replace_dir, staging_dir

MANIFEST = "_manifest.json"
SUCCESS = "_SUCCESS"
_PART = re.compile(r"^part-\d{5,}\.parquet$")


def is_parquet_dataset(folder: Path) -> bool:
    """True when `folder` holds only what a partitioned `sample` writes, with its manifest."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(manifest, dict) or not {"run_id", "output_sha256", "partitions"} <= set(
        manifest
    ):
        return False
    for path in folder.iterdir():
        if path.is_symlink() or not path.is_file():
            return False
        if path.name not in (MANIFEST, SUCCESS) and not _PART.match(path.name):
            return False
    return True


def sample_dataset(run_dir: Path | str, n: int, out: Path, opts: SampleOptions) -> dict[str, Any]:
    """Write N rows of a table's run as a partitioned Parquet folder `out` and record the
    release (the arguments as for `sample_table`; see the module docstring).

    `partitions` (default: one per `PARTITION_ROWS` rows) fixes the release's content with the
    seed; `workers` (default: the CPUs) only how fast it is written. `progress(done, n)` and
    `on_partition(partitions done, partitions, rows done, n)` are called as each partition is
    finished (in the parent process)."""
    count = partition_count(n, opts.partitions)  # the options first: nothing read yet
    workers = check_workers(opts.workers, count)
    seed = opts.seed
    run = RunDir(run_dir)
    privacy = run_privacy(run_dir, opts.ledger_path, partial=opts.partial)
    check_not_protected(out, run, privacy["ledger"])
    if out.is_file():
        raise UsageError(
            f"{{out}} {out} is a file; a partitioned release is a folder: choose another name",
            parameter="out",
        )
    check_release_target(out, run, privacy["ledger"], opts.force, is_parquet_dataset)
    # The parent loads the generator on the CPU for the label counts and the checks only; the
    # workers load it on `device` and draw the rows.
    generator, run_config, info = load_generator(run_dir, "cpu")
    batch_size = opts.batch(dataset_batch(generator))
    check_batch_size("--batch-size", batch_size, row_values(generator, info))
    set_truncation(generator, opts.truncation, run_config["method"])
    counts, label_rule = table_labels(generator, opts.labels, n, info)
    plan = plan_partitions(n, counts, seed, count)
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_staging(out.parent)  # folders that killed `sample` runs were writing
    staging = staging_dir(out)
    try:
        loader = (str(run.path), opts.device, opts.truncation)
        written = _write_partitions(plan, staging, loader, batch_size, workers, opts)
        output_sha = _release_digest(written)
        ledger = record_release(
            run_config, info, privacy["ledger"], output_sha, n, "parquet", out,
            extra={"partitions": len(plan)},
        )  # fmt: skip
        drawn = {
            "n": n,
            "format": "parquet",
            "layout": "partitioned",
            "modality": "table",
            "classes": list(info.classes),
            "seed": seed,
            "batch_size": batch_size,  # rows drawn at once: a partition's rows depend on it
        }
        manifest = table_manifest(run_dir, run_config, privacy, info, generator, drawn)
        manifest |= {"label_counts": counts, "labels": label_rule, "partitions": written}
        manifest |= {"output_sha256": output_sha, "ledger": ledger}
        write_json_atomic(staging / MANIFEST, manifest)
        _write_success(staging)
        replaced = out.exists()
        replace_dir(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return {
        "out": str(out),
        "manifest": str(out / MANIFEST),
        "replaced": replaced,
        "workers": workers,
        **manifest,
    }


def _write_partitions(
    plan: Sequence[Partition],
    staging: Path,
    loader: tuple[str, str, float | None],
    batch_size: int,
    workers: int,
    opts: SampleOptions,
) -> list[dict[str, Any]]:
    """Every partition of `plan` written into `staging` by `workers` spawned processes; their
    records in partition order (`opts.progress`, `opts.on_partition` told as each finishes).
    On any error or interrupt the workers are stopped at once."""
    progress, on_partition = opts.progress, opts.on_partition
    total = sum(p.rows for p in plan)
    results: list[dict[str, Any] | None] = [None] * len(plan)
    rows_done = 0
    pool = ProcessPoolExecutor(
        max_workers=workers,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=start_worker,
        initargs=loader,
    )
    try:
        pending: set[Future] = {
            pool.submit(write_partition, p, str(staging), batch_size) for p in plan
        }
        while pending:
            finished, pending = wait(pending, return_when=FIRST_COMPLETED)
            for future in finished:
                result = future.result()
                index = int(result["file"][5:-8])  # part-NNNNN.parquet
                results[index] = result
                rows_done += result["rows"]
                done = sum(r is not None for r in results)
                if progress is not None:
                    progress(rows_done, total)
                if on_partition is not None:
                    on_partition(done, len(plan), rows_done, total)
    except BrokenProcessPool:
        _stop(pool)
        raise DpsynthError(
            "a sampling worker process died (out of memory, or killed); nothing was released"
        ) from None
    except BaseException:
        _stop(pool)
        raise
    pool.shutdown(wait=True)
    return [r for r in results if r is not None]


def _stop(pool: ProcessPoolExecutor) -> None:
    """Stop the workers now: a partition in progress is not waited for (its staging folder is
    removed next)."""
    processes = list((getattr(pool, "_processes", None) or {}).values())  # 3.11: no public way
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        if process.is_alive():
            process.terminate()
    for process in processes:
        process.join(timeout=10)


def _release_digest(written: Sequence[dict[str, Any]]) -> str:
    digest = hashlib.sha256()
    for part in written:
        digest.update(part["file"].encode() + b"\0" + bytes.fromhex(part["sha256"]))
    return digest.hexdigest()


def _write_success(staging: Path) -> None:
    """The empty `_SUCCESS` marker, then the folder's entries fsynced before the rename."""
    with (staging / SUCCESS).open("wb") as handle:
        os.fsync(handle.fileno())
    descriptor = os.open(staging, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
