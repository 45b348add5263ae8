"""Sampling a table's run: N rows decoded into a CSV or Parquet file with its manifest beside it,
or (`sampling.dataset`) a partitioned Parquet folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from dpsynth.data.limits import check_batch_size
from dpsynth.errors import UsageError
from dpsynth.outdir import remove_stale_staging, staging_file
from dpsynth.rundir import RunDir, write_json_atomic
from dpsynth.sampling.labels import AUTO_LABELS, labelled_batches
from dpsynth.sampling.outputs import (
    PartitionProgress,
    SampleProgress,
    record_release,
    table_manifest_path,
)
from dpsynth.sampling.partitions import DATASET_BATCH, wants_partitions
from dpsynth.sampling.rows_out import RowsFile, table_format
from dpsynth.sampling.table_release import check_not_protected, table_labels
from dpsynth.sampling.trained_run import load_generator, run_privacy, set_truncation
from dpsynth.sampling.units import units_of


def sample_table(
    run_dir: Path | str,
    n: int,
    out: Path | str,
    labels: str = AUTO_LABELS,
    batch_size: int | None = None,
    seed: int = 0,
    device: str = "auto",
    force: bool = False,
    ledger_path: Path | str | None = None,
    progress: SampleProgress | None = None,
    truncation: float | None = None,
    partial: bool = False,
    fmt: str | None = None,
    partitions: int | None = None,
    workers: int | None = None,
    on_partition: PartitionProgress | None = None,
) -> dict[str, Any]:
    """Write N synthetic rows of a table's run to the CSV file `out` and record the release.

    The CSV has the original header, column order and category strings (see
    `dpsynth.data.table_codec`); it is streamed batch by batch into a temporary name beside
    `out` and renamed into place, with `OUT.manifest.json` (provenance, privacy statement,
    SHA-256 of the CSV). `force` replaces only an earlier CSV of `sample` (one with its
    manifest). The rows come in a random order (classes mixed, surrogate keys 1..N in file
    order) and categorical blocks are sampled, all from the public `seed`. An `out` ending in
    `.parquet` (or `fmt` "parquet") is written as Parquet instead, typed by the schema (see
    `dpsynth.sampling.parquet_out`), with the same staging, manifest and SHA-256 (of the file).

    A folder `out` (an existing one or a name ending in `/`), `partitions`, or Parquet of more
    than `PARTITION_ROWS` rows is a partitioned Parquet release written by `workers` processes
    (see `dpsynth.sampling.dataset.sample_dataset`; `on_partition` reports each partition).
    `batch_size` (rows generated and decoded at once) defaults to 500 for one file and to
    `DATASET_BATCH` for a partitioned release, where throughput matters most.
    """
    import math
    import os

    from dpsynth.data.table_codec import codec_for

    if wants_partitions(out, n, fmt, partitions):
        if fmt not in (None, "parquet"):
            raise UsageError(
                f"{{fmt}} {fmt}: a partitioned release ({{out}} a folder, {{partitions}}, or "
                "Parquet above a million rows) is written as Parquet",
                parameters=("fmt", "out", "partitions"),
            )
        from dpsynth.sampling.dataset import sample_dataset

        batch_size = DATASET_BATCH if batch_size is None else batch_size
        check_batch_size("--batch-size", batch_size, 1)
        return sample_dataset(
            run_dir, n, Path(out), labels, batch_size, seed, device, force, ledger_path,
            progress, truncation, partial, partitions, workers, on_partition,
        )  # fmt: skip
    batch_size = 500 if batch_size is None else batch_size
    check_batch_size("--batch-size", batch_size, 1)
    out = Path(out)
    fmt = table_format(out, fmt)
    run = RunDir(run_dir)
    privacy = run_privacy(run_dir, ledger_path, partial=partial)
    manifest_path = table_manifest_path(out)
    check_not_protected(out, run, privacy["ledger"])
    if out.exists():
        if not force:
            raise UsageError(f"--out {out} exists; pass --force to replace it")
        if not manifest_path.is_file():
            raise UsageError(
                f"--out {out} was not written by `sample` (no {manifest_path.name}); "
                "--force replaces only an earlier sample"
            )
    generator, run_config, info = load_generator(run_dir, device)
    check_batch_size("--batch-size", batch_size, math.prod(info.shape))
    set_truncation(generator, truncation, run_config["method"])
    codec = codec_for(info)
    counts, label_rule = table_labels(generator, labels, n, info)
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_staging(out.parent)  # CSVs that killed `sample` runs were writing
    replaced = out.exists()
    temporary = staging_file(out)
    rng = np.random.default_rng(seed)
    units = units_of(run_config, info.schema or {})  # synthetic people (a privacy unit)
    keys = units.keys(seed) if units is not None else None
    done = 0
    try:
        with RowsFile(temporary, codec, fmt) as written:
            # Rows in a random order from the seed, not class by class: the first rows of the
            # file, or any split by row order, are a fair sample (the counts stay exact).
            batches = labelled_batches(generator, counts, batch_size, seed, shuffle=True)
            for rows, chunk in batches:
                frame = codec.decode(rows.cpu().numpy(), chunk.numpy(), rng, start=done)
                if keys is not None and units is not None:
                    frame[units.column] = keys.next(len(frame))
                written.write(frame)
                done += len(frame)
                if progress is not None:
                    progress(done, n)
        output_sha = written.sha256
        release = record_release(run_config, info, privacy["ledger"], output_sha, n, fmt, out)
        manifest = {
            "run_id": run_config["run_id"],
            "run": str(Path(run_dir).resolve()),
            "method": run_config["method"],
            "private": privacy["private"],
            "privacy": privacy["statement"],
            "privacy_source": {
                key: privacy[key]
                for key in ("ledger", "ledger_seq", "ledger_hash", "status", "epsilon", "delta")
            },
            "n": n,
            "format": fmt,
            "modality": "table",
            "classes": list(info.classes),
            "label_counts": counts,
            "labels": label_rule,
            "seed": seed,
            "truncation": generator.truncation,
            "columns": [c.name for c in codec.schema.columns],
            "schema": info.schema,
            **({"privacy_unit": units.to_json()} if units is not None else {}),
            "dataset_id": info.dataset_id,
            "fingerprint": info.fingerprint,
            "output_sha256": output_sha,
            "ledger": release,
        }
        write_json_atomic(manifest_path, manifest)
        os.replace(temporary, out)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    return {"out": str(out), "manifest": str(manifest_path), "replaced": replaced, **manifest}
