"""What every engine's counter shares: the public domain, N, the pass count and progress.

A counter is the `privacy.marginals.MarginalCounter` of a table source: `counts(cliques)` is
one pass over the data, reading it chunk by chunk, encoding each chunk with the one encoding
(`dpsynth.data.discrete.codes_from_raw`) and summing exact int64 bincounts. `fold(count)` is
one pass too, for other exact counts (a DP schema release's rounds,
`dpsynth.training.engine_release`): `count` of every chunk as read, summed by its `.add`,
on the same workers (picklable: it goes to spawned processes or a cluster). A counter reports
each pass to an optional callback (`PassProgress`: rows read out of N, then done) and counts
its passes, which a run states. Only the privacy layer reads the counts it returns.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dpsynth.data.csvtable import RawTable
from dpsynth.data.discrete import ChunkEncoder
from dpsynth.data.engines.counting import (
    ChunkCallback,
    Clique,
    CountSums,
    count_chunks,
    fold_chunks,
)
from dpsynth.errors import DataError


@dataclass(frozen=True)
class PassProgress:
    """One report of a pass over the data: rows read so far out of N (public facts only)."""

    engine: str
    index: int  # the pass's number in the run, from 1
    rows: int
    total_rows: int
    cliques: int
    done: bool
    seconds: float
    what: str = ""  # a pass that counts no marginals: what it counts ("" for the check pass)


PassCallback = Callable[[PassProgress], None]


class TableCounter(ABC):
    """Counts marginals of a table source in passes; subclasses give the chunks."""

    engine = "?"

    def __init__(self, encoder: ChunkEncoder, record_count: int | None) -> None:
        self.encoder = encoder
        self.record_count = -1 if record_count is None else int(record_count)
        # the rows counted: all that are read, unless the encoder leaves some out
        self.kept_count = self.record_count
        self.passes = 0
        self.on_pass: PassCallback | None = None

    @property
    def sizes(self) -> tuple[int, ...]:
        """The public domain's sizes (of the encoder's domain)."""
        return tuple(int(s) for s in self.encoder.domain.sizes)

    def use_domain(self, encoder: ChunkEncoder) -> None:
        """Count over another binning of the same schema from now on (the trainer's)."""
        self.encoder = encoder

    def scan(self) -> str:
        """The check pass, before anything is spent: every row encoded (a DataError names the
        first bad cell), N counted (kept as `record_count`) and the content digest returned
        (private: for the ledger's keyed fingerprint only)."""
        sums = self._pass((), digest=True)
        self.record_count, self.kept_count = sums.rows, sums.kept
        return sums.digest()

    def counts(self, cliques: Sequence[Clique]) -> list[np.ndarray]:
        """Exact float64 counts of each clique in one pass (DataError when the source no longer
        holds the N rows the check pass counted)."""
        sums = self._pass(cliques, digest=False)
        self._check_rows(sums.rows)
        return sums.result()

    def fold(self, count: Callable[[RawTable], Any], what: str, text: Sequence[str] = ()) -> Any:
        """One pass: `count` (picklable) of every chunk as read, the rows the encoder would
        leave out included, summed by the results' `.add` (None for no row); `text`: numeric
        columns whose canonical text to keep beside their values (`chunks.raw_from_batch`).
        DataError when the source no longer holds the N rows the check pass counted."""
        total: list[Any] = []

        def run(report: ChunkCallback) -> int:
            result, rows = self.fold_chunks(count, tuple(text), report)
            total.append(result)
            return rows

        self._check_rows(self._report(run, 0, what))
        return total[0]

    def _check_rows(self, rows: int) -> None:
        if rows != self.record_count:
            raise DataError(
                f"the table changed while it was read: {rows:,} rows in this pass, "
                f"{self.record_count:,} when the run began"
            )

    def _pass(self, cliques: Sequence[Clique], digest: bool) -> CountSums:
        out: list[CountSums] = []

        def run(report: ChunkCallback) -> int:
            out.append(self.count([tuple(c) for c in cliques], report, digest))
            return out[0].rows

        self._report(run, len(cliques), "")
        return out[0]

    def _report(self, run: Callable[[ChunkCallback], int], cliques: int, what: str) -> int:
        """Run one pass, counted and reported to `on_pass`; the rows it read."""
        self.passes += 1
        started = time.monotonic()
        index, total = self.passes, self.record_count

        def report(rows: int, done: bool = False) -> None:
            if self.on_pass is not None:
                seconds = time.monotonic() - started
                self.on_pass(
                    PassProgress(self.engine, index, rows, total, cliques, done, seconds, what)
                )

        rows = run(report)
        report(rows, done=True)
        return rows

    def count(
        self, cliques: Sequence[Clique], report: Callable[[int], None], digest: bool
    ) -> CountSums:
        """One pass: the chunks encoded and counted (engines that split the work override it)."""
        schema = self.encoder.schema if digest else None
        return count_chunks(self.chunks(), self.encoder, self.sizes, cliques, report, schema)

    def fold_chunks(
        self, count: Callable[[RawTable], Any], text: tuple[str, ...], report: ChunkCallback
    ) -> tuple[Any, int]:
        """One fold pass: the summed results and the rows read (engines that split the work
        override it)."""
        return fold_chunks(self.chunks(text), count, report)

    @abstractmethod
    def chunks(self, text: Sequence[str] = ()) -> Iterator[RawTable]:
        """The table's rows as raw chunks, in bounded memory (`text`: see `fold`)."""

    def close(self) -> None:  # noqa: B027 - most engines hold nothing between passes
        """Release what the engine holds (a connection, a cluster client)."""
