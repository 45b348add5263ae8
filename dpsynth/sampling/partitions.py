"""The plan of a partitioned sample: how many rows and which labels each partition holds, and the
public seed it draws from.

A partitioned release is a folder of Parquet files `part-00000.parquet` … (see
`sampling.dataset`). Its content is a function of (run, n, labels, seed, partitions, batch
size) only: partition p holds a fixed slice of the rows (`start`, `rows`), an exact share of
every class's count, and draws its rows, in a random order of their classes, from its own seed
derived from (seed, p). Which worker process writes which partition, and how many there are,
changes nothing in the release.

The seeds are public, like `--seed` itself: sampling is post-processing of what training
released, so the partitions need independent streams (not copies of one another), not secret
ones.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dpsynth.data.images import DataInfo
from dpsynth.errors import UsageError
from dpsynth.threads import usable_cores

# Rows per partition when `--partitions` is not given; a Parquet `--out` of more rows than this
# is written as a partitioned folder. About 20-60 MB of Parquet for 40 columns: large enough
# that readers do not drown in small files, small enough that many workers share the work.
PARTITION_ROWS = 1_000_000
# Rows generated and decoded at once in a partitioned release unless `--batch-size` says
# otherwise: 20× the single file's 500, which spreads the per-batch cost of decoding and of
# the Arrow conversion over more rows, for a few tens of MB per worker (a network generator's
# activations grow with the batch).
DATASET_BATCH = 10_000
# The same for a generator that draws its rows' codes itself (aim, mst: `CodedSampler`): one
# Parquet row group (`parquet_out.ROWS_PER_GROUP`). Its memory per row is a few hundred bytes,
# and its sampler's and the writer's per-call costs are spread over many rows (mst: 12% less
# CPU than batches of 10,000 on a 50-column table).
CODED_BATCH = 65_536

# Far more files than any reader wants; above it a typo is the likely cause.
MAX_PARTITIONS = 100_000


def dataset_batch(generator: object) -> int:
    """The default rows drawn at once in a partitioned release of `generator`'s run."""
    from dpsynth.data.coded_rows import CodedSampler

    return CODED_BATCH if isinstance(generator, CodedSampler) else DATASET_BATCH


def row_values(generator: object, info: DataInfo) -> int:
    """The values a drawn row holds in memory, for `limits.check_batch_size`: its encoded
    width, or for a generator that draws codes (no encoded rows) one per column."""
    from dpsynth.data.coded_rows import CodedSampler

    if isinstance(generator, CodedSampler) and info.schema:
        return len(info.schema.get("columns", ())) or 1
    return math.prod(info.shape)


@dataclass(frozen=True)
class Partition:
    """One file of a partitioned release: its index, first row (of the whole release, for
    surrogate keys), per-class label counts (they sum to its rows) and public seed."""

    index: int
    start: int
    counts: tuple[int, ...]
    seed: int

    @property
    def rows(self) -> int:
        """The partition's number of rows."""
        return sum(self.counts)

    @property
    def name(self) -> str:
        """Its file name in the release's folder."""
        return partition_name(self.index)


def partition_name(index: int) -> str:
    """`part-00000.parquet`: zero-padded so that a name sort is the row order."""
    return f"part-{index:05d}.parquet"


def wants_partitions(out: Path | str, n: int, fmt: str | None, partitions: int | None) -> bool:
    """Whether a table's `--out` is a partitioned Parquet folder: `partitions` given, `out` a
    folder (an existing one, or a name ending in `/`), or Parquet (by `fmt` or a `.parquet`
    name) for more than `PARTITION_ROWS` rows."""
    text = os.fspath(out)
    if partitions is not None or text.endswith(("/", os.sep)) or Path(text).is_dir():
        return True
    parquet = fmt == "parquet" or (fmt is None and Path(text).suffix.lower() == ".parquet")
    return parquet and n > PARTITION_ROWS


def partition_count(n: int, partitions: int | None) -> int:
    """The number of partitions: `partitions` when given (at most n), else one per
    `PARTITION_ROWS` rows."""
    if partitions is None:
        return max(1, math.ceil(n / PARTITION_ROWS))
    if not 1 <= partitions <= MAX_PARTITIONS:
        raise UsageError(
            f"{{partitions}} must be in [1, {MAX_PARTITIONS}], got {partitions}",
            parameter="partitions",
        )
    if partitions > n:
        raise UsageError(
            f"{{partitions}} {partitions} is more than {{n}} {n}: a partition would be empty",
            parameters=("partitions", "n"),
        )
    return partitions


def partition_seed(seed: int, index: int) -> int:
    """The public seed of partition `index`: 63 bits from numpy's SeedSequence of (seed, index),
    so that partitions draw independent streams and none repeats the plain `seed`'s."""
    sequence = np.random.SeedSequence(entropy=int(seed) % 2**128, spawn_key=(index,))
    high, low = (int(v) for v in sequence.generate_state(2, dtype=np.uint32))
    return ((high << 32) | low) >> 1


def split_counts(counts: Sequence[int], sizes: Sequence[int]) -> list[list[int]]:
    """Per-class `counts` split exactly over partitions of `sizes` rows (same total).

    Partition by partition, each takes the largest-remainder share of what is left of every
    class, in integer arithmetic (exact at 10⁹ rows): every partition's counts sum to its size,
    every class's to its count, and each partition's class mix is the whole release's to within
    one row per class."""
    left = [int(c) for c in counts]
    if sum(left) != sum(sizes):
        raise ValueError("the partitions' sizes do not add up to the label counts")
    out: list[list[int]] = []
    for size in sizes:
        remaining = sum(left)
        if size == remaining:  # the last partition: everything left, exactly
            share = list(left)
        else:
            share = [size * c // remaining for c in left]
            over = [size * c % remaining for c in left]
            # the classes with the largest remainders get the rows that flooring left over
            # (never more than a class has left: its share was then below its count)
            for c in sorted(range(len(left)), key=lambda k: (-over[k], k))[: size - sum(share)]:
                share[c] += 1
        left = [a - b for a, b in zip(left, share, strict=True)]
        out.append(share)
    return out


def plan_partitions(
    n: int, counts: Sequence[int], seed: int, partitions: int | None
) -> list[Partition]:
    """The partitions of a release of `n` rows with per-class `counts`: sizes as even as
    possible (the first n mod K one row more), labels split by `split_counts`, seeds by
    `partition_seed`."""
    k = partition_count(n, partitions)
    sizes = [n // k + (1 if p < n % k else 0) for p in range(k)]
    shares = split_counts(counts, sizes)
    plan, start = [], 0
    for index, (size, share) in enumerate(zip(sizes, shares, strict=True)):
        plan.append(Partition(index, start, tuple(share), partition_seed(seed, index)))
        start += size
    return plan


def check_workers(workers: int | None, partitions: int) -> int:
    """The worker processes to start: `workers` (default: the cores this process may run on),
    at most one per partition."""
    if workers is None:
        workers = usable_cores()
    if workers < 1:
        raise UsageError(f"{{workers}} must be at least 1, got {workers}", parameter="workers")
    return min(workers, partitions)
