"""What every engine's counter shares: the public domain, N, the pass count and progress.

A counter is the `privacy.marginals.MarginalCounter` of a table source: `counts(cliques)` is
one pass over the data, reading it chunk by chunk, encoding each chunk with the one encoding
(`dpsynth.data.discrete.codes_from_raw`) and summing exact int64 bincounts. `fold(count)` is
one pass too, for other exact counts (a DP schema release's rounds,
`dpsynth.training.engine_release`): `count` of every chunk as read, summed by its `.add`,
on the same workers (picklable: it goes to spawned processes or a cluster). A counter reports
each pass to an optional callback (`PassProgress`: rows read out of N, then done) and counts
its passes, which a run states. Only the privacy layer reads the counts it returns.

The check pass (`scan`) may count more than it checks. Other exact counts of every chunk as
read (`fold`: a DP schema release's first round) are summed and held for `take_folded`. And
given the encoder and the cliques a trainer's first `counts` will ask for (`Ahead`, from public
facts only: the method, its preset and the public schema), the one pass checks every row,
counts N and the digest, and counts those cliques, which the counter holds until that request
(exact int64 sums, the same integers a pass of their own gives). A request for cliques it does
not hold, or under another encoder, is a pass as before. Nothing is spent and no noise drawn
by a pass: the counts reach the privacy layer only through `counts` (or the release's round),
after the reservation.
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


@dataclass(frozen=True)
class Ahead:
    """What a check pass may count besides (public facts only): the cliques a trainer's first
    count will ask for, under the encoder it will count with (the same schema, its binning)."""

    encoder: ChunkEncoder
    cliques: tuple[Clique, ...]


class TableCounter(ABC):
    """Counts marginals of a table source in passes; subclasses give the chunks."""

    engine = "?"

    def __init__(self, encoder: ChunkEncoder, record_count: int | None) -> None:
        self.encoder = encoder
        self.record_count = -1 if record_count is None else int(record_count)
        # the rows counted: all that are read, unless the encoder leaves some out
        self.kept_count = self.record_count
        self.passes = 0
        self.pass_names: list[str] = []  # what each pass did, in order (public facts)
        self.on_pass: PassCallback | None = None
        # counts made ahead by the check pass, under their encoder, until asked for
        self._held: tuple[ChunkEncoder, dict[Clique, np.ndarray]] | None = None
        self._folded: tuple[str, Any] | None = None  # the check pass's fold: (what, sum)

    @property
    def sizes(self) -> tuple[int, ...]:
        """The public domain's sizes (of the encoder's domain)."""
        return tuple(int(s) for s in self.encoder.domain.sizes)

    def use_domain(self, encoder: ChunkEncoder) -> None:
        """Count over another binning of the same schema from now on (the trainer's)."""
        self.encoder = encoder

    def scan(
        self,
        ahead: Ahead | None = None,
        fold: tuple[str, Callable[[RawTable], Any]] | None = None,
    ) -> str:
        """The check pass, before anything is spent: every row encoded (a DataError names the
        first bad cell), N counted (kept as `record_count`) and the content digest returned
        (private: for the ledger's keyed fingerprint only). With `ahead` (the same schema),
        the same pass encodes under its encoder (a bad cell fails whatever the bins) and
        counts its cliques, held for the `counts` that asks for them; with `fold` (what it
        counts, and a picklable `count` of a chunk, as `fold` takes), it sums that too, held
        for `take_folded` (see the module)."""
        count = fold[1] if fold is not None else None
        names = ["check", *(() if fold is None else (fold[0],))]
        if ahead is None or not ahead.cliques:
            sums = self._pass((), digest=True, what=", ".join(names), fold=count)
        else:
            if ahead.encoder.schema != self.encoder.schema:
                raise ValueError("a check pass counts ahead under its own schema only")
            checking = self.encoder
            self.use_domain(ahead.encoder)
            try:
                what = ", ".join([*names, f"{len(ahead.cliques):,} marginals"])
                sums = self._pass(ahead.cliques, digest=True, what=what, fold=count)
            finally:
                self.use_domain(checking)
            self._held = (ahead.encoder, dict(zip(sums.cliques, sums.totals, strict=True)))
        if fold is not None:
            self._folded = (fold[0], sums.folded)
        self.record_count, self.kept_count = sums.rows, sums.kept
        return sums.digest()

    def take_folded(self, what: str) -> tuple[bool, Any]:
        """(True, the sum) of the check pass's fold named `what` (None for no row), once;
        (False, None) when the check pass made none."""
        if self._folded is None or self._folded[0] != what:
            return False, None
        folded, self._folded = self._folded[1], None
        return True, folded

    def counts(self, cliques: Sequence[Clique]) -> list[np.ndarray]:
        """Exact float64 counts of each clique: those the check pass counted ahead under this
        encoder as they are, the others in one pass (DataError when the source no longer
        holds the N rows the check pass counted)."""
        wanted = [tuple(int(j) for j in c) for c in cliques]
        found: dict[Clique, np.ndarray] = {}
        if self._held is not None and self._held[0] == self.encoder:
            held = self._held[1]
            found = {c: held.pop(c) for c in dict.fromkeys(wanted) if c in held}
        missing = list(dict.fromkeys(c for c in wanted if c not in found))
        if missing:
            sums = self._pass(missing, digest=False)
            self._check_rows(sums.rows)
            found.update(zip(missing, sums.totals, strict=True))
        return [found[c].astype(np.float64) for c in wanted]

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

    def _pass(
        self,
        cliques: Sequence[Clique],
        digest: bool,
        what: str = "",
        fold: Callable[[RawTable], Any] | None = None,
    ) -> CountSums:
        out: list[CountSums] = []

        def run(report: ChunkCallback) -> int:
            out.append(self.count([tuple(c) for c in cliques], report, digest, fold))
            return out[0].rows

        self._report(run, len(cliques), what)
        return out[0]

    def _report(self, run: Callable[[ChunkCallback], int], cliques: int, what: str) -> int:
        """Run one pass, counted and reported to `on_pass`; the rows it read."""
        self.passes += 1
        self.pass_names.append(what or (f"{cliques:,} marginals" if cliques else "check"))
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
        self,
        cliques: Sequence[Clique],
        report: Callable[[int], None],
        digest: bool,
        fold: Callable[[RawTable], Any] | None = None,
    ) -> CountSums:
        """One pass: the chunks encoded and counted, and `fold` of each summed (engines that
        split the work override it)."""
        schema = self.encoder.schema if digest else None
        chunks, encoder = self.chunks(), self.encoder
        return count_chunks(chunks, encoder, self.sizes, cliques, report, schema, fold)

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
