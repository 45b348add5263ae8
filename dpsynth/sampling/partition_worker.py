"""What a worker process of a partitioned sample does: load the run's generator once, then write
whole partitions into the release's staging folder.

Workers are started with `spawn` (a fresh interpreter: no torch state or threads inherited from
the parent) and run one torch thread each, so that W workers use W cores and a partition's
rows are the same whichever worker (and however many) drew them. A worker reads no private
data and touches no ledger: it runs the released generator on its partition's public seed.
Memory per worker is one batch plus one Parquet row group, whatever the partition's size.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpsynth.sampling.partitions import Partition
from dpsynth.sampling.units import UnitSpec, units_of


@dataclass
class _Loaded:
    generator: Any
    codec: Any
    units: UnitSpec | None = None


_LOADED: _Loaded | None = None


def start_worker(run_dir: str, device: str, truncation: float | None) -> None:
    """A worker's initializer: one torch thread, the run's generator and codec loaded once.
    Ctrl-C is left to the parent, which stops the workers and removes the staging folder (a
    worker would otherwise print its own traceback)."""
    global _LOADED
    import signal

    import torch

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from dpsynth.data.table_codec import codec_for
    from dpsynth.sampling.trained_run import load_generator, set_truncation

    torch.set_num_threads(1)
    generator, run_config, info = load_generator(run_dir, device)
    set_truncation(generator, truncation, run_config["method"])
    _LOADED = _Loaded(generator, codec_for(info), units_of(run_config, info.schema or {}))


def write_partition(partition: Partition, folder: str, batch_size: int) -> dict[str, Any]:
    """Write `partition` as `folder/part-NNNNN.parquet`; its file name, rows, seed, first row,
    label counts and SHA-256 (of the file's bytes)."""
    if _LOADED is None:
        raise RuntimeError("write_partition runs in a worker started by start_worker")
    return draw_partition(
        _LOADED.generator, _LOADED.codec, partition, Path(folder), batch_size, _LOADED.units
    )


def draw_partition(
    generator: Any,
    codec: Any,
    partition: Partition,
    folder: Path,
    batch_size: int,
    units: UnitSpec | None = None,
) -> dict[str, Any]:
    """The rows of `partition` drawn from `generator` (their order, latents and categories from
    the partition's seed, surrogate keys numbered from its first row) and written to its file;
    with `units` (a run with a privacy unit), its rows grouped into synthetic people that
    never cross a partition (`sampling.units`)."""
    from dpsynth.sampling.rows_out import RowsFile
    from dpsynth.sampling.table_batches import coded_batches

    done = 0
    with RowsFile(folder / partition.name, codec, "parquet") as written:
        # the partition's rows in its own random order (classes mixed), from its seed
        for coded in coded_batches(
            generator, codec, partition.counts, batch_size, partition.seed, partition.start, units
        ):
            written.write(coded)
            done += len(coded)
    if done != partition.rows:  # a generator that yields fewer rows than asked is a bug
        raise RuntimeError(f"{partition.name}: {done} rows drawn, {partition.rows} planned")
    return {
        "file": partition.name,
        "rows": partition.rows,
        "start": partition.start,
        "seed": partition.seed,
        "label_counts": list(partition.counts),
        "sha256": written.sha256,
    }
