"""Marginal counts accumulated chunk by chunk: exact integers, whatever the chunking.

Every engine encodes its chunks with `dpsynth.data.discrete.codes_from_raw` and adds their
bincounts here; the sums are int64 (exact) and become float64 only at the end, so that the
counts equal the in-memory bincount bit for bit however the rows were split.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterable, Sequence

import numpy as np
import pandas as pd

from dpsynth.data.csvtable import RawTable
from dpsynth.data.discrete import chunk_numbers
from dpsynth.data.schema import Column, Schema

Clique = tuple[int, ...]
Encoder = Callable[[RawTable], np.ndarray]
# Called after each chunk with the rows counted so far in this pass.
ChunkCallback = Callable[[int], None]


def chunk_counts(
    codes: np.ndarray, sizes: Sequence[int], cliques: Sequence[Clique]
) -> list[np.ndarray]:
    """int64 counts of each clique over one chunk's codes [n, d] (C order over the clique, as
    `numpy.ravel_multi_index` flattens it)."""
    columns = [np.ascontiguousarray(codes[:, j], dtype=np.int64) for j in range(codes.shape[1])]
    out = []
    for clique in cliques:
        if not clique:
            out.append(np.array([len(codes)], dtype=np.int64))
            continue
        flat = columns[clique[0]]
        for j in clique[1:]:
            flat = flat * int(sizes[j]) + columns[j]
        cells = math.prod(int(sizes[j]) for j in clique)
        out.append(np.bincount(flat, minlength=cells).astype(np.int64, copy=False))
    return out


def row_hash_sums(raw: RawTable, schema: Schema) -> np.ndarray:
    """Two wrapping uint64 sums (of h and h²) of the used columns' per-row hashes (numbers as
    their parsed values, other cells as text): added over chunks they name the rows whatever
    their order or split, and whichever reader typed them (the scan's content digest)."""
    rows = np.zeros(raw.n, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for column in schema.columns:
            if column.type == "ignored":
                continue
            rows = rows * _MIX + _column_hashes(raw, column)
        return np.array([rows.sum(dtype=np.uint64), (rows * rows).sum(dtype=np.uint64)])


# An odd 64-bit constant folding the column hashes of a row in order.
_MIX = np.uint64(0x9E3779B97F4A7C15)


def _column_hashes(raw: RawTable, column: Column) -> np.ndarray:
    """uint64 hashes of one column's cells (each cell's own: a dictionary-encoded column's
    distinct values hashed once)."""
    if column.is_numeric:
        return pd.util.hash_array(chunk_numbers(raw, column, lenient=True))
    typed = getattr(raw, "categories", {}).get(column.name)
    if typed is not None:
        indices, uniques = typed
        return pd.util.hash_array(uniques)[indices]
    return pd.util.hash_array(np.asarray(raw.column(column.name), dtype=object))


def rows_digest(schema: Schema, rows: int, sums: np.ndarray) -> str:
    """SHA-256 naming a table scanned by an engine (private: the caller keys it)."""
    used = "\x1f".join(f"{c.name}:{c.type}" for c in schema.columns if c.type != "ignored")
    text = f"dpsynth-table-rows-v1|{used}|{rows}|{int(sums[0])}|{int(sums[1])}"
    return hashlib.sha256(text.encode()).hexdigest()


class CountSums:
    """Running int64 sums of several cliques' counts (starting from zeros), and optionally
    the row-hash sums of the content digest."""

    def __init__(
        self, sizes: Sequence[int], cliques: Sequence[Clique], schema: Schema | None = None
    ) -> None:
        self.sizes = tuple(int(s) for s in sizes)
        self.cliques = tuple(tuple(int(j) for j in c) for c in cliques)
        empty = np.zeros((0, len(self.sizes)), np.int64)
        self.totals = chunk_counts(empty, self.sizes, self.cliques)
        self.rows = 0
        self.schema = schema  # given: the digest's sums are kept too
        self.hash_sums = np.zeros(2, dtype=np.uint64)

    def add_codes(self, codes: np.ndarray, raw: RawTable | None = None) -> None:
        """Add one chunk's codes [n, d] (and its raw cells to the digest, when kept)."""
        hashes = None
        if self.schema is not None and raw is not None:
            hashes = row_hash_sums(raw, self.schema)
        self.add(chunk_counts(codes, self.sizes, self.cliques), len(codes), hashes)

    def add(
        self, counts: Sequence[np.ndarray], rows: int, hashes: np.ndarray | None = None
    ) -> None:
        """Add one chunk's (or one worker's) int64 counts and digest sums."""
        for total, part in zip(self.totals, counts, strict=True):
            total += part
        self.rows += int(rows)
        if hashes is not None:
            with np.errstate(over="ignore"):
                self.hash_sums += np.asarray(hashes, dtype=np.uint64)

    def digest(self) -> str:
        """The content digest of the rows added (with a schema only)."""
        assert self.schema is not None
        return rows_digest(self.schema, self.rows, self.hash_sums)

    def result(self) -> list[np.ndarray]:
        """float64 counts, as `privacy.marginals.marginal_counts` gives them."""
        return [t.astype(np.float64) for t in self.totals]


def count_chunks(
    chunks: Iterable[RawTable],
    encode: Encoder,
    sizes: Sequence[int],
    cliques: Sequence[Clique],
    on_chunk: ChunkCallback | None = None,
    schema: Schema | None = None,
) -> CountSums:
    """The int64 counts of every clique over all chunks (one pass); with `schema`, the
    content digest's sums too."""
    sums = CountSums(sizes, cliques, schema)
    for raw in chunks:
        sums.add_codes(encode(raw), raw)
        if on_chunk is not None:
            on_chunk(sums.rows)
    return sums
