"""Sampling a table's run: N rows decoded into a CSV or Parquet file with its manifest beside it,
or (`sampling.dataset`) a partitioned Parquet folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from dpsynth.data.limits import check_batch_size
from dpsynth.errors import UsageError
from dpsynth.rundir import RunDir, write_json_atomic
from dpsynth.sampling.labels import AUTO_LABELS, labelled_batches
from dpsynth.sampling.options import SampleOptions
from dpsynth.sampling.outputs import record_release, table_manifest_path
from dpsynth.sampling.partitions import DATASET_BATCH, wants_partitions
from dpsynth.sampling.rows_out import RowsFile, table_format
from dpsynth.sampling.table_release import check_not_protected, table_labels, table_manifest
from dpsynth.sampling.trained_run import load_generator, run_privacy, set_truncation
from dpsynth.sampling.units import units_of
from dpsynth.staging import remove_stale_staging, staging_file


def sample_table(run_dir: Path | str, n: int, out: Path | str, **options: Any) -> dict[str, Any]:
    """`write_table` with `options` the fields of `SampleOptions` by name (`labels` defaults
    to auto here: the model's own class proportions for aim and mst, else balanced)."""
    return write_table(run_dir, n, out, SampleOptions(**{"labels": AUTO_LABELS, **options}))


def write_table(
    run_dir: Path | str, n: int, out: Path | str, opts: SampleOptions
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

    if wants_partitions(out, n, opts.fmt, opts.partitions):
        if opts.fmt not in (None, "parquet"):
            raise UsageError(
                f"{{fmt}} {opts.fmt}: a partitioned release ({{out}} a folder, {{partitions}}, "
                "or Parquet above a million rows) is written as Parquet",
                parameters=("fmt", "out", "partitions"),
            )
        from dpsynth.sampling.dataset import sample_dataset

        check_batch_size("--batch-size", opts.batch(DATASET_BATCH), 1)
        return sample_dataset(run_dir, n, Path(out), opts)
    batch_size, seed = opts.batch(500), opts.seed
    check_batch_size("--batch-size", batch_size, 1)
    out = Path(out)
    fmt = table_format(out, opts.fmt)
    run = RunDir(run_dir)
    privacy = run_privacy(run_dir, opts.ledger_path, partial=opts.partial)
    manifest_path = table_manifest_path(out)
    check_not_protected(out, run, privacy["ledger"])
    if out.exists():
        if not opts.force:
            raise UsageError(f"--out {out} exists; pass --force to replace it")
        if not manifest_path.is_file():
            raise UsageError(
                f"--out {out} was not written by `sample` (no {manifest_path.name}); "
                "--force replaces only an earlier sample"
            )
    generator, run_config, info = load_generator(run_dir, opts.device)
    check_batch_size("--batch-size", batch_size, math.prod(info.shape))
    set_truncation(generator, opts.truncation, run_config["method"])
    codec = codec_for(info)
    counts, label_rule = table_labels(generator, opts.labels, n, info)
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
                if opts.progress is not None:
                    opts.progress(done, n)
        output_sha = written.sha256
        release = record_release(run_config, info, privacy["ledger"], output_sha, n, fmt, out)
        drawn = {
            "n": n,
            "format": fmt,
            "modality": "table",
            "classes": list(info.classes),
            "label_counts": counts,
            "labels": label_rule,
            "seed": seed,
        }
        manifest = table_manifest(run_dir, run_config, privacy, info, generator, drawn)
        manifest |= {"output_sha256": output_sha, "ledger": release}
        write_json_atomic(manifest_path, manifest)
        os.replace(temporary, out)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    return {"out": str(out), "manifest": str(manifest_path), "replaced": replaced, **manifest}
