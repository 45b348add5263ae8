"""The in-memory engine: the whole table read once, its codes kept, a bincount per clique.

This is today's path (`train` encodes the rows and `methods.marginal` maps them back to codes);
as a counter it reads the source with the package's own readers and encodes it with the one
encoding, which gives the same codes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from dpsynth.data.csvtable import RawTable
from dpsynth.data.discrete import ChunkEncoder
from dpsynth.data.engines.base import TableCounter
from dpsynth.data.engines.counting import Clique, CountSums


class MemoryCounter(TableCounter):
    """Codes [N, d] in memory (from a `RawTable` already read)."""

    engine = "memory"

    def __init__(self, raw: RawTable, encoder: ChunkEncoder) -> None:
        super().__init__(encoder, raw.n)
        self._raw = raw
        self._codes = encoder(raw)
        self.kept_count = len(self._codes)

    def chunks(self, text: Sequence[str] = ()) -> Iterator[RawTable]:
        """The table held, as one chunk."""
        return iter((self._raw,))

    def use_domain(self, encoder: ChunkEncoder) -> None:
        """Re-encode the rows under another binning (kept in memory, so re-read them)."""
        super().use_domain(encoder)
        self._codes = encoder(self._raw)

    def count(
        self,
        cliques: Sequence[Clique],
        report: Callable[[int], None],
        digest: bool,
        fold: Callable[[RawTable], Any] | None = None,
    ) -> CountSums:
        """The bincounts of the codes held."""
        sums = CountSums(self.sizes, cliques, self.encoder.schema if digest else None, fold)
        sums.add_codes(self._codes, self._raw)
        return sums
