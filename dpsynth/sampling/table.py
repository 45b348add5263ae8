"""Sampling a table's run: N rows decoded into a CSV or Parquet file with its manifest beside it,
or (`sampling.dataset`) a partitioned Parquet folder."""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from dpsynth.data.frames import FRAME
from dpsynth.data.limits import check_batch_size
from dpsynth.errors import UsageError
from dpsynth.rundir import RunDir, write_json_atomic
from dpsynth.sampling.labels import AUTO_LABELS
from dpsynth.sampling.options import SampleOptions
from dpsynth.sampling.outputs import record_release, table_manifest_path
from dpsynth.sampling.partitions import DATASET_BATCH, wants_partitions
from dpsynth.sampling.rows_out import RowsFile, table_format
from dpsynth.sampling.table_batches import coded_batches
from dpsynth.sampling.table_release import check_not_protected, table_labels, table_manifest
from dpsynth.sampling.trained_run import load_generator, run_privacy, set_truncation
from dpsynth.sampling.units import units_of
from dpsynth.staging import remove_stale_staging, staging_file

if TYPE_CHECKING:
    from dpsynth.data.coded_rows import CodedRows


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
    `batch_size` (rows generated and decoded at once) defaults to 500 for one file and, for a
    partitioned release, where throughput matters most, to `partitions.dataset_batch` (65,536
    for aim and mst, 10,000 for the others).
    """
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
    batch_size = opts.batch(500)
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
    draw = _TableDraw(run_dir, n, opts, batch_size)
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_staging(out.parent)  # CSVs that killed `sample` runs were writing
    replaced = out.exists()
    temporary = staging_file(out)
    try:
        with RowsFile(temporary, draw.codec, fmt) as written:
            for coded in draw.batches():
                written.write(coded)
        output_sha = written.sha256
        release = record_release(
            draw.run_config, draw.info, privacy["ledger"], output_sha, n, fmt, out
        )
        manifest = draw.manifest(privacy, fmt) | {"output_sha256": output_sha, "ledger": release}
        write_json_atomic(manifest_path, manifest)
        os.replace(temporary, out)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    return {"out": str(out), "manifest": str(manifest_path), "replaced": replaced, **manifest}


def sample_table_frame(
    run_dir: Path | str, n: int, opts: SampleOptions
) -> tuple[pd.DataFrame, dict[str, Any]]:
    """N synthetic rows of a table's run as a pandas DataFrame in memory, typed by the schema
    as a Parquet sample is (numbers, nullable integers, booleans, dates and times), and the
    release's manifest (not written anywhere). The rows are those `write_table` would write
    for the same options; the ledger records the release with the SHA-256 of their CSV text,
    the digest a CSV sample of the same rows would have."""
    import hashlib

    import pyarrow as pa

    from dpsynth.data.coded_rows import coded_frame
    from dpsynth.sampling.arrow_rows import ArrowRows

    batch_size = opts.batch(500)
    check_batch_size("--batch-size", batch_size, 1)
    privacy = run_privacy(run_dir, opts.ledger_path, partial=opts.partial)
    draw = _TableDraw(run_dir, n, opts, batch_size)
    arrow = ArrowRows(draw.codec.schema)
    digest, parts = hashlib.sha256(), []
    for coded in draw.batches():
        frame = coded_frame(draw.codec.schema, coded)
        digest.update(draw.codec.csv_text(frame, header=not parts).encode("utf-8"))
        parts.append(arrow.batch(coded))
    table = arrow.public_table(parts)
    rows = table.to_pandas(types_mapper=_nullable_types)
    for name in (f.name for f in table.schema if pa.types.is_date(f.type)):
        rows[name] = pd.to_datetime(rows[name])  # dates as datetimes, as pandas reads them
    output_sha = digest.hexdigest()
    release = record_release(
        draw.run_config, draw.info, privacy["ledger"], output_sha, n, FRAME, None
    )
    manifest = draw.manifest(privacy, FRAME) | {"output_sha256": output_sha, "ledger": release}
    return rows, manifest


def _nullable_types(kind: Any) -> Any:
    """pandas' nullable dtypes for Arrow integers and booleans (missing stays missing, not a
    float NaN); None keeps pandas' default for the other types."""
    import pyarrow as pa

    if pa.types.is_integer(kind):
        return pd.Int64Dtype()
    if pa.types.is_boolean(kind):
        return pd.BooleanDtype()
    return None


class _TableDraw:
    """One draw of N rows from a run: the generator and its codec loaded, the label counts
    chosen, then the generated batches in a random order (`batches`) from the public seed."""

    def __init__(self, run_dir: Path | str, n: int, opts: SampleOptions, batch_size: int) -> None:
        from dpsynth.data.table_codec import codec_for

        self.run_dir, self.n, self.opts, self.batch_size = run_dir, n, opts, batch_size
        self.generator, self.run_config, self.info = load_generator(run_dir, opts.device)
        check_batch_size("--batch-size", batch_size, math.prod(self.info.shape))
        set_truncation(self.generator, opts.truncation, self.run_config["method"])
        self.codec = codec_for(self.info)
        self.counts, self.label_rule = table_labels(self.generator, opts.labels, n, self.info)

    def batches(self) -> Iterator[CodedRows]:
        """The generated batches: rows in a random order from the seed, not class by class, so
        that the first rows, or any split by row order, are a fair sample (counts exact)."""
        units = units_of(self.run_config, self.info.schema or {})  # synthetic people
        done = 0
        for coded in coded_batches(
            self.generator, self.codec, self.counts, self.batch_size, self.opts.seed, 0, units
        ):
            yield coded
            done += len(coded)
            if self.opts.progress is not None:
                self.opts.progress(done, self.n)

    def manifest(self, privacy: dict[str, Any], fmt: str) -> dict[str, Any]:
        """The release's manifest without its digest and ledger entry."""
        drawn = {
            "n": self.n,
            "format": fmt,
            "modality": "table",
            "classes": list(self.info.classes),
            "label_counts": self.counts,
            "labels": self.label_rule,
            "seed": self.opts.seed,
        }
        return table_manifest(
            self.run_dir, self.run_config, privacy, self.info, self.generator, drawn
        )
