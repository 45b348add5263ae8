"""The discrete public domain of a table for marginal-based synthesizers, and the codecs to it.

Every used column (the features in file order, then the target) becomes an attribute with a
finite public domain, from the schema and the preset only, never from the data:
- a categorical or boolean column: its levels (the one-hot block's argmax);
- a numeric, integer, date or time column with `edges` (declared, or released with DP by
  `dpsynth.training.table_schema`): one bin per pair of consecutive edges, left-closed (the last one
  closed); an edge repeated twice is a point mass (a bin holding that value alone, e.g. 0);
- one without `edges`: bins over its public [min, max]. An integer column with at most `bins`
  values gets one bin per value (exact). Otherwise, with `bound_bins`, the bounds themselves
  are bins of their own (a point mass at min or max, common in real tables: zero incomes, top
  codes) and `bins − 2` equal-width bins cover the open interval between them; without it,
  `bins` equal-width bins cover [min, max];
- a column with `missing` cells gets one more value, the last: missing;
- the target: its classes.

`codes_from_rows` maps the encoded rows the training loop hands a trainer (one-hot blocks,
numbers scaled to [-1, 1], missing flags; `dpsynth.data.table_codec`) to integer codes [N, d], a
per-record deterministic map; `rows_from_codes` maps sampled codes back to encoded rows,
drawing a number uniformly inside its bin (integers among the bin's integers) with the
sampler's public generator, so that `TableCodec.decode` writes the original columns.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import torch

from dpsynth.data.discrete import (
    EDGE,
    Attribute,
    TableDomain,
    number_codes,
    table_domain,
)
from dpsynth.methods.marginal.tails import EndTail, tail_positions

__all__ = [
    "Attribute",
    "TableDomain",
    "bin_values",
    "codes_from_rows",
    "rows_from_codes",
    "scaled_numbers",
    "table_domain",
]

# Encoded rows converted per chunk (bounds the temporary memory on a million rows).
_CHUNK = 65_536


def codes_from_rows(rows: torch.Tensor, labels: torch.Tensor, domain: TableDomain) -> np.ndarray:
    """Integer codes [N, d] (uint16 or int32) of encoded rows [N, D] and their labels [N]."""
    n = int(rows.shape[0])
    dtype = np.uint16 if max(domain.sizes) < 2**16 else np.int32
    out = np.empty((n, len(domain.attributes)), dtype=dtype)
    for begin in range(0, n, _CHUNK):
        part = rows[begin : begin + _CHUNK].detach().cpu().numpy()
        for j, attribute in enumerate(domain.attributes):
            if attribute.kind == "target":
                out[begin : begin + len(part), j] = labels[begin : begin + _CHUNK].cpu().numpy()
            elif attribute.kind == "categorical":
                block = part[:, attribute.start : attribute.start + attribute.size]
                out[begin : begin + len(part), j] = block.argmax(1)
            else:
                codes = number_codes(part[:, attribute.start], attribute)
                if attribute.missing:
                    flags = part[:, attribute.flag_start : attribute.flag_start + 2]
                    codes = np.where(flags.argmax(1) == 1, attribute.size - 1, codes)
                out[begin : begin + len(part), j] = codes
    return out


def bin_values(codes: np.ndarray, attribute: Attribute, uniform: np.ndarray) -> np.ndarray:
    """Numbers in [low, high] for bin codes: uniform inside the bin (integers: among its
    integers), the bounds themselves for bound bins, the value itself for a point mass."""
    if attribute.kind == "edges":
        return _edge_values(codes, attribute, uniform)
    low, high, size = attribute.low, attribute.high, attribute.present_size
    if size == 1:
        return np.full(len(codes), low)
    if attribute.kind == "exact":
        return math.ceil(low) + codes.astype(np.float64)
    codes = codes.astype(np.float64)
    if attribute.bound_bins:
        inner = size - 2
        left = low + (codes - 1) / inner * (high - low)
        right = low + codes / inner * (high - low)
    else:
        left = low + codes / size * (high - low)
        right = low + (codes + 1) / size * (high - low)
    if attribute.integer:
        # The bin's integers: ceil(left) … the last integer below right (the last bin's own).
        first = np.ceil(left)
        last = np.where(np.floor(right) < right, np.floor(right), right - 1)
        if not attribute.bound_bins:
            last = np.where(codes == size - 1, np.floor(high), last)
        else:
            first = np.maximum(first, math.ceil(low) + 1)
            last = np.minimum(last, math.floor(high) - 1)
        last = np.maximum(last, first)
        values = first + np.floor(uniform * (last - first + 1))
        values = np.minimum(values, last)
    else:
        # Kept clear of the edges by the coding tolerance, so the value codes to its bin.
        width = right - left
        values = left + 2 * EDGE * width + uniform * (1 - 4 * EDGE) * width
    if attribute.bound_bins:
        values = np.where(codes == 0, low, np.where(codes == size - 1, high, values))
    return np.clip(values, low, high)


def _edge_values(codes: np.ndarray, attribute: Attribute, uniform: np.ndarray) -> np.ndarray:
    """Numbers for bin codes under edges: a point mass's own value; otherwise uniform in
    [left, right) (the last bin closed), integers among the bin's integers, an interval that
    follows a point mass at its left edge open there."""
    edges = np.asarray(attribute.edges, dtype=np.float64)
    bins = len(edges) - 1
    codes = np.clip(codes, 0, bins - 1)
    left, right = edges[codes], edges[codes + 1]
    atom = left == right
    after_atom = np.zeros(bins, dtype=bool)
    after_atom[1:] = edges[:-2] == edges[1:-1]
    if attribute.integer:
        first = np.ceil(left) + np.where(after_atom[codes] & (np.ceil(left) == left), 1, 0)
        last_bin = codes == bins - 1
        last = np.where(last_bin, np.floor(right), np.ceil(right) - 1)
        last = np.maximum(last, first)
        values = np.minimum(first + np.floor(uniform * (last - first + 1)), last)
    else:
        width = right - left
        # clear of both edges by the coding tolerance: the value codes back to its bin
        values = left + 2 * EDGE * width + uniform * (1 - 4 * EDGE) * width
    values = np.where(atom, left, values)
    return np.clip(values, attribute.low, attribute.high)


def scaled_numbers(
    codes: np.ndarray,
    attribute: Attribute,
    uniform: np.ndarray,
    tails: tuple[EndTail, ...] = (),
) -> tuple[np.ndarray, np.ndarray | None]:
    """A numeric attribute's codes [b] as numbers on the encoding's scale, float32 as
    an encoded row holds them (drawn inside their bins by `uniform`, in its end bins by their
    `tails`), and the rows where the value is missing (None for a column without missing
    cells)."""
    absent = codes >= attribute.present_size if attribute.missing else None
    present = codes if absent is None else np.where(absent, 0, codes)
    values = bin_values(present, attribute, tail_positions(present, uniform, attribute, tails))
    span = attribute.high - attribute.low
    scaled = np.zeros(len(codes)) if span == 0 else 2.0 * (values - attribute.low) / span - 1.0
    if absent is not None:
        scaled = np.where(absent, 0.0, scaled)
    return scaled.astype(np.float32), absent


def rows_from_codes(
    codes: np.ndarray,
    domain: TableDomain,
    uniform: np.ndarray,
    tails: Mapping[int, tuple[EndTail, ...]] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Encoded rows float32 [b, D] and labels int64 [b] for codes [b, d].

    `uniform` [b, d] holds public U(0, 1) draws for the positions inside numeric bins;
    `tails` (by attribute index) how the end bins of each attribute are drawn.
    """
    b = len(codes)
    rows = np.zeros((b, domain.width), dtype=np.float32)
    for j, attribute in enumerate(domain.attributes):
        column = codes[:, j].astype(np.int64)
        if attribute.kind == "target":
            continue
        if attribute.kind == "categorical":
            rows[np.arange(b), attribute.start + column] = 1.0
            continue
        scaled, absent = scaled_numbers(column, attribute, uniform[:, j], (tails or {}).get(j, ()))
        rows[:, attribute.start] = scaled
        if absent is not None:
            rows[np.arange(b), attribute.flag_start + absent.astype(np.int64)] = 1.0
    labels = torch.from_numpy(codes[:, domain.target].astype(np.int64))
    return torch.from_numpy(rows), labels
