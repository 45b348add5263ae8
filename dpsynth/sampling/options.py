"""`SampleOptions`: how `sample` writes a release, beside the run, N and where to.

`sample_run` and `sample_table` take them by name (`sample_run(run, n, out, seed=3,
fmt="npz")`); the writers of images, of one table file and of a partitioned table release
(`sampling.dataset`) read them from here. None of them changes what the run released: they
choose the public seed, the labels, the layout and how the work is done.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dpsynth.sampling.outputs import PartitionProgress, SampleProgress


@dataclass(frozen=True)
class SampleOptions:
    """Everything `sample` takes besides the run, N and the output path.

    `fmt`: png or npz for images, csv or parquet for a table (None: png, or the table file's
    ending); `labels`: balanced, per-class counts "a,b,c", auto, or for tables weights / model;
    `batch_size`: records generated at once (None: 500; for a partitioned release 65,536 for
    aim and mst, 10,000 for the others);
    `seed`: the public sampling seed; `device`: auto, cpu or cuda; `force`: replace an earlier
    output of `sample`; `ledger_path`: the ledger the run is anchored to (None: the run's own);
    `progress(done, n)`; `truncation`: the latent scale (None: the run's); `partial`: release
    the checkpoint of an unfinished run; `partitions`, `workers`, `on_partition`: a
    partitioned table release (see `sampling.dataset`).
    """

    fmt: str | None = None
    labels: str = "balanced"
    batch_size: int | None = None
    seed: int = 0
    device: str = "auto"
    force: bool = False
    ledger_path: Path | str | None = None
    progress: SampleProgress | None = None
    truncation: float | None = None
    partial: bool = False
    partitions: int | None = None
    workers: int | None = None
    on_partition: PartitionProgress | None = None

    def batch(self, default: int) -> int:
        """`batch_size`, or `default` when not given."""
        return default if self.batch_size is None else self.batch_size
