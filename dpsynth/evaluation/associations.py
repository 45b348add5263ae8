"""Pairwise association of a table's columns, real rows against synthetic ones: Cramér's V of
every pair of columns on the public bucket codes of the 2-way TVD
(`dpsynth.evaluation.marginals.discretise`: numbers in equal-width bins over the schema's bounds,
categories as the schema lists them), and the heatmap of |V(real) − V(synthetic)| that a
table's report shows (`dpsynth.evaluation.table_figures`).

V is Bergsma's bias-corrected Cramér's V (a sample's V is biased up by about
√((r−1)(c−1)/n), which would differ between tables of different sizes), from the occupied
cells only (χ² = n (Σ O²/(R C) − 1)), so a column with many categories costs no dense table;
a constant column has V = 0 with every other.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dpsynth.data.schema import Schema
from dpsynth.data.table_codec import RawTable
from dpsynth.evaluation.marginals import discretise
from dpsynth.evaluation.render import figure_png, new_figure

MAX_HEATMAP = 100  # columns in the heatmap (the first ones the marginals cover)
HEATMAP_MAX = 0.5  # the colour scale's top: differences above it share its colour
_DENSE_CELLS = 1 << 22


def _short(text: str, limit: int = 24) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass(frozen=True)
class AssociationDifference:
    """The heatmap's PNG and its matrix: |V(real) − V(synthetic)| per pair, zero diagonal."""

    names: tuple[str, ...]
    matrix: np.ndarray
    png: bytes


def _cramers_v(a: np.ndarray, b: np.ndarray, rows: int, cols: int) -> float:
    """Bias-corrected Cramér's V of two dense codes (every code in [0, rows) and [0, cols)
    occurs): χ² = n (Σ O²/(R C) − 1) over the occupied cells, φ² = max(0, χ²/n −
    (r−1)(c−1)/(n−1)), r̃ = r − (r−1)²/(n−1) (and c̃), V = √(φ² / min(r̃ − 1, c̃ − 1))."""
    n = len(a)
    if n < 2 or min(rows, cols) < 2:
        return 0.0
    joint = a.astype(np.int64) * cols + b
    if rows * cols <= _DENSE_CELLS:
        counts = np.bincount(joint, minlength=rows * cols)
        cells = np.flatnonzero(counts)
        counts = counts[cells]
    else:
        cells, counts = np.unique(joint, return_counts=True)
    row, col = np.bincount(a, minlength=rows), np.bincount(b, minlength=cols)
    ratio = float((counts.astype(np.float64) ** 2 / (row[cells // cols] * col[cells % cols])).sum())
    phi2 = max(ratio - 1.0 - (rows - 1) * (cols - 1) / (n - 1), 0.0)
    scale = min(rows - (rows - 1) ** 2 / (n - 1), cols - (cols - 1) ** 2 / (n - 1)) - 1.0
    return min(math.sqrt(phi2 / scale), 1.0) if scale > 0 else 0.0


def cramers_v_matrix(codes: np.ndarray) -> np.ndarray:
    """Bias-corrected Cramér's V of every pair of columns of int codes [rows, columns]; zero
    diagonal."""
    k = codes.shape[1]
    dense = [np.unique(codes[:, j], return_inverse=True)[1].reshape(-1) for j in range(k)]
    levels = [int(d.max()) + 1 if d.size else 0 for d in dense]
    out = np.zeros((k, k))
    for i, j in itertools.combinations(range(k), 2):
        out[i, j] = out[j, i] = _cramers_v(dense[i], dense[j], levels[i], levels[j])
    return out


def association_difference(
    synthetic: RawTable, real: RawTable, schema: Schema, max_columns: int = MAX_HEATMAP
) -> AssociationDifference:
    """Draw the heatmap of |V(real) − V(synthetic)| over the first `max_columns` columns the
    marginals cover (codes of `marginals.discretise`); its PNG with the matrix it shows."""
    syn, ref = discretise(synthetic, schema), discretise(real, schema)
    k = min(len(syn.names), max_columns)
    names = syn.names[:k]
    matrix = np.abs(cramers_v_matrix(ref.codes[:, :k]) - cramers_v_matrix(syn.codes[:, :k]))
    return AssociationDifference(names, matrix, render_association(names, matrix))


def render_association(names: Sequence[str], matrix: np.ndarray) -> bytes:
    """PNG heatmap of a pairwise difference matrix, column names on both axes."""
    import matplotlib

    k = len(names)
    side = max(5.0, 0.25 * k + 3.0)
    figure = new_figure(side + 1.0, side)
    ax = figure.add_subplot(1, 1, 1)
    cmap = matplotlib.colormaps["Reds"].with_extremes(bad="#e6e6e6")
    shown = np.ma.masked_where(np.eye(k, dtype=bool), matrix)
    image = ax.imshow(shown, cmap=cmap, vmin=0.0, vmax=HEATMAP_MAX, interpolation="nearest")
    extend = "max" if k and float(matrix.max()) > HEATMAP_MAX else "neither"
    bar = figure.colorbar(image, ax=ax, fraction=0.046, pad=0.04, extend=extend)
    bar.set_label("|Cramér's V (real) − Cramér's V (synthetic)|", fontsize=8)
    size = max(6.0, min(9.0, 300.0 / max(k, 1)))
    ax.set_xticks(range(k))
    ax.set_yticks(range(k))
    ax.set_xticklabels([_short(n) for n in names], rotation=90, fontsize=size)
    ax.set_yticklabels([_short(n) for n in names], fontsize=size)
    if k <= 15:
        for i, j in itertools.product(range(k), range(k)):
            if i != j:
                dark = matrix[i, j] > 0.6 * HEATMAP_MAX
                ax.text(j, i, f"{matrix[i, j]:.2f}", ha="center", va="center", fontsize=7,
                        color="white" if dark else "black")  # fmt: skip
    ax.set_title("Pairwise association: real against synthetic (0: the same)", fontsize=10)
    return figure_png(figure)
