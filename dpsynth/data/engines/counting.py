"""Marginal counts accumulated chunk by chunk: exact integers, whatever the chunking.

Every engine encodes its chunks with `dpsynth.data.discrete.codes_from_raw` and adds their
bincounts here; the sums are int64 (exact) and become float64 only at the end, so that the
counts equal the in-memory bincount bit for bit however the rows were split.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from dpsynth.data.csvtable import RawTable
from dpsynth.data.discrete import chunk_numbers
from dpsynth.data.schema import Column, Schema

Clique = tuple[int, ...]
Encoder = Callable[[RawTable], np.ndarray]
# Called after each chunk with the rows counted so far in this pass.
ChunkCallback = Callable[[int], None]


# Consecutive attributes whose joint has at most this many cells form a block, and a
# bincount is kept to at most this many bins (see `chunk_counts`).
BLOCK_CELLS = 1024
MAX_BINS = 1 << 18


def attribute_blocks(sizes: Sequence[int], limit: int = BLOCK_CELLS) -> list[tuple[int, ...]]:
    """Runs of consecutive attributes whose joint has at most `limit` cells (one at least)."""
    blocks: list[tuple[int, ...]] = []
    current: list[int] = []
    cells = 1
    for j, size in enumerate(sizes):
        if current and cells * int(size) > limit:
            blocks.append(tuple(current))
            current, cells = [], 1
        current.append(j)
        cells *= int(size)
    if current:
        blocks.append(tuple(current))
    return blocks


def chunk_counts(
    codes: np.ndarray, sizes: Sequence[int], cliques: Sequence[Clique]
) -> list[np.ndarray]:
    """int64 counts of each clique over one chunk's codes [n, d] (C order over the clique, as
    `numpy.ravel_multi_index` flattens it).

    The cost is one bincount over the rows per counted joint, so cliques that differ only in
    their first attribute share one: the attributes are cut into blocks of consecutive ones
    (`attribute_blocks`), and the cliques (a, *rest) whose first attribute a lies in the same
    block are counted together as the joint (block, *rest), each then summed out of it (exact
    integers: the same counts as one bincount per clique). mst's (a, b, target) triples and
    aim's pairs share their rest across a block of two to four attributes, which halves the
    work of a counting pass or better.
    """
    sizes = tuple(int(s) for s in sizes)
    n = len(codes)
    # one contiguous int64 array per attribute (a view when the codes are column-major)
    matrix = np.asfortranarray(codes, dtype=np.int64)
    column = [matrix[:, j] for j in range(matrix.shape[1])]
    out: list[np.ndarray | None] = [None] * len(cliques)
    by_rest: dict[Clique, list[tuple[int, int]]] = {}
    for i, clique in enumerate(cliques):
        if clique:
            by_rest.setdefault(tuple(clique[1:]), []).append((int(clique[0]), i))
        else:
            out[i] = np.array([n], dtype=np.int64)
    blocks = attribute_blocks(sizes)
    block_of = {j: b for b, block in enumerate(blocks) for j in block}
    block_keys: dict[int, np.ndarray] = {}
    for rest, firsts in by_rest.items():
        rest_cells = math.prod(sizes[j] for j in rest)
        suffix = _flat(column, sizes, rest)
        grouped: dict[int, list[tuple[int, int]]] = {}
        for first, i in firsts:
            grouped.setdefault(block_of[first], []).append((first, i))
        for b, members in grouped.items():
            block = blocks[b]
            block_cells = math.prod(sizes[j] for j in block)
            if len(members) == 1 or block_cells * rest_cells > MAX_BINS:
                for first, i in members:
                    key = column[first] if suffix is None else column[first] * rest_cells + suffix
                    out[i] = np.bincount(key, minlength=sizes[first] * rest_cells)
                continue
            if b not in block_keys:
                block_keys[b] = _flat(column, sizes, block)  # type: ignore[assignment]
            key = block_keys[b] if suffix is None else block_keys[b] * rest_cells + suffix
            joint = np.bincount(key, minlength=block_cells * rest_cells)
            joint = joint.reshape([sizes[j] for j in block] + [rest_cells])
            for first, i in members:
                axis = block.index(first)
                others = tuple(k for k in range(len(block)) if k != axis)
                out[i] = joint.sum(axis=others).reshape(-1)
    return [np.asarray(c, dtype=np.int64) for c in out]


def _flat(column: list[np.ndarray], sizes: tuple[int, ...], clique: Clique) -> np.ndarray | None:
    """The C-order cell index of each row in a clique's joint (None for the empty clique)."""
    if not clique:
        return None
    flat = column[clique[0]]
    for j in clique[1:]:
        flat = flat * sizes[j] + column[j]
    return flat


def row_hash_sums(raw: RawTable, schema: Schema) -> np.ndarray:
    """Two wrapping uint64 sums (of h and h²) of the used columns' per-row hashes (numbers as
    their parsed values, other cells as text): added over chunks they name the rows whatever
    their order or split, and whichever reader typed them (the scan's content digest)."""
    rows = np.zeros(raw.n, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for column in schema.columns:
            if column.type == "ignored":
                continue
            rows *= _MIX  # in place: the same wrapping sums, no array allocated per column
            rows += _column_hashes(raw, column)
        return np.array([rows.sum(dtype=np.uint64), (rows * rows).sum(dtype=np.uint64)])


# An odd 64-bit constant folding the column hashes of a row in order.
_MIX = np.uint64(0x9E3779B97F4A7C15)
# The hashes of a dictionary-encoded column's distinct values, by those values (the same
# dictionary comes back batch after batch): at most this many lists of at most this many values.
_HASHED: dict[tuple[str, ...], np.ndarray] = {}
_HASHED_LISTS, _HASHED_VALUES = 512, 4096


def _column_hashes(raw: RawTable, column: Column) -> np.ndarray:
    """uint64 hashes of one column's cells (each cell's own: a dictionary-encoded column's
    distinct values hashed once)."""
    if column.is_numeric:
        return pd.util.hash_array(chunk_numbers(raw, column, lenient=True))
    typed = getattr(raw, "categories", {}).get(column.name)
    if typed is not None:
        indices, uniques = typed
        return _distinct_hashes(uniques)[indices]
    return pd.util.hash_array(np.asarray(raw.column(column.name), dtype=object))


def _distinct_hashes(uniques: np.ndarray) -> np.ndarray:
    """`pd.util.hash_array` of a column's distinct values, remembered for a short list (a
    hash depends on its value only: the same hashes as hashing them again)."""
    if len(uniques) > _HASHED_VALUES:
        return pd.util.hash_array(uniques)
    key = tuple(uniques.tolist())
    hashes = _HASHED.get(key)
    if hashes is None:
        if len(_HASHED) >= _HASHED_LISTS:
            _HASHED.clear()
        hashes = _HASHED[key] = pd.util.hash_array(uniques)
    return hashes


def rows_digest(schema: Schema, rows: int, sums: np.ndarray) -> str:
    """SHA-256 naming a table scanned by an engine (private: the caller keys it)."""
    used = "\x1f".join(f"{c.name}:{c.type}" for c in schema.columns if c.type != "ignored")
    text = f"dpsynth-table-rows-v1|{used}|{rows}|{int(sums[0])}|{int(sums[1])}"
    return hashlib.sha256(text.encode()).hexdigest()


class CountSums:
    """Running int64 sums of several cliques' counts (starting from zeros), and optionally
    the row-hash sums of the content digest and the sum of a `fold` of every chunk as read
    (other exact counts: a DP schema release's first round, summed by their `.add`; None for
    no row). `rows` are the rows read (the digest names them all); `kept` the rows counted,
    fewer when the encoder leaves rows out (a DP-released label set:
    `source.LabelledEncoder`)."""

    def __init__(
        self,
        sizes: Sequence[int],
        cliques: Sequence[Clique],
        schema: Schema | None = None,
        fold: Callable[[RawTable], Any] | None = None,
    ) -> None:
        self.sizes = tuple(int(s) for s in sizes)
        self.cliques = tuple(tuple(int(j) for j in c) for c in cliques)
        empty = np.zeros((0, len(self.sizes)), np.int64)
        self.totals = chunk_counts(empty, self.sizes, self.cliques)
        self.rows = 0
        self.kept = 0
        self.schema = schema  # given: the digest's sums are kept too
        self.hash_sums = np.zeros(2, dtype=np.uint64)
        self.fold = fold
        self.folded: Any = None

    def add_codes(self, codes: np.ndarray, raw: RawTable | None = None) -> None:
        """Add one chunk's codes [n, d] (of the rows its encoder kept of `raw`: all but for a
        `LabelledEncoder`), and its raw cells to the digest and the fold, when kept."""
        hashes = None
        if self.schema is not None and raw is not None:
            hashes = row_hash_sums(raw, self.schema)
        folded = self.fold(raw) if self.fold is not None and raw is not None else None
        rows = raw.n if raw is not None else len(codes)
        counts = chunk_counts(codes, self.sizes, self.cliques)
        self.add(counts, rows, hashes, len(codes), folded)

    def add(
        self,
        counts: Sequence[np.ndarray],
        rows: int,
        hashes: np.ndarray | None = None,
        kept: int | None = None,
        folded: Any = None,
    ) -> None:
        """Add one chunk's (or one worker's) int64 counts, rows read (and counted: `kept`,
        all of them unless given), digest sums and folded counts."""
        for total, part in zip(self.totals, counts, strict=True):
            total += part
        self.rows += int(rows)
        self.kept += int(rows if kept is None else kept)
        if hashes is not None:
            with np.errstate(over="ignore"):
                self.hash_sums += np.asarray(hashes, dtype=np.uint64)
        if folded is not None:
            self.folded = folded if self.folded is None else self.folded.add(folded)

    def part(self) -> tuple[list[np.ndarray], int, np.ndarray, int, Any]:
        """What a worker sends back for these sums: counts, rows, digest sums, rows counted
        and folded counts (`add` takes them in that order)."""
        return self.totals, self.rows, self.hash_sums, self.kept, self.folded

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
    fold: Callable[[RawTable], Any] | None = None,
) -> CountSums:
    """The int64 counts of every clique over all chunks (one pass); with `schema`, the
    content digest's sums too, and with `fold`, its sum over the chunks."""
    sums = CountSums(sizes, cliques, schema, fold)
    for raw in chunks:
        sums.add_codes(encode(raw), raw)
        if on_chunk is not None:
            on_chunk(sums.rows)
    return sums


def fold_chunks(
    chunks: Iterable[RawTable], count: Callable[[RawTable], Any], on_chunk: ChunkCallback
) -> tuple[Any, int]:
    """`count` of every chunk summed with its `.add` (None for no chunk), and the rows read."""
    total, rows = None, 0
    for raw in chunks:
        part = count(raw)
        total = part if total is None else total.add(part)
        rows += raw.n
        on_chunk(rows)
    return total, rows
