"""The figures of a table's report (`evaluate --report DIR`), in the manner of SDMetrics'
quality report:

- `columns-1.png`, `columns-2.png`, …: a small plot per column the marginals cover (the
  features and the target), the real held-out rows against the synthetic ones, both as shares
  of the column's non-missing cells, at most `PANELS` (4 across, 5 down) to a PNG. Numbers,
  dates and times: a histogram over bins read off the real rows (`BINS` equal-width bins over
  their [min, max]; one bin per value for whole numbers spanning fewer than `BINS` + 10; the
  real rows' quantiles when one equal-width bin would hold over half of them), the real rows
  filled, the synthetic ones outlined. Categories and booleans: bars of the `TOP_CATEGORIES`
  commonest real values and "other values". Each title gives both tables' missing rate and
  the share of synthetic values outside the real rows' bins.
- `association.png`: for every pair of columns |V(real) − V(synthetic)|, V the pair's
  Cramér's V on the bucket codes of the 2-way TVD (`dpsynth.evaluation.associations`).

The figures are statistics of the real held-out rows computed without DP: the report is the
data owner's. matplotlib is imported when a figure is drawn (an Agg canvas, deterministic).
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dpsynth.data.column_values import missing_mask
from dpsynth.data.schema import Column, Schema
from dpsynth.data.table_codec import RawTable
from dpsynth.evaluation.associations import association_difference
from dpsynth.evaluation.marginals import lenient_numbers, marginal_columns
from dpsynth.evaluation.release import REPORT_FILES
from dpsynth.evaluation.render import figure_png, new_figure
from dpsynth.rundir import write_bytes_atomic
from dpsynth.staging import check_target

BINS = 20
TOP_CATEGORIES = 20
ACROSS, DOWN = 4, 5
PANELS = ACROSS * DOWN
MAX_COLUMNS = 200  # columns drawn (the first ones of the schema); the report names the rest
ASSOCIATION_FILE = "association.png"
PAGE_NAME = re.compile(r"columns-\d+\.png")
_SKEWED = 0.5
_LABEL_CHARS = 18
_REAL, _SYNTHETIC = "C0", "C1"


@dataclass(frozen=True)
class Panel:
    """One column's plot: real and synthetic shares over shared bins or categories."""

    column: Column
    kind: str  # "linear", "quantile", "categories" or "empty"
    labels: tuple[str, ...]  # the bars of a categorical column
    edges: np.ndarray | None  # the bins of a number
    real: np.ndarray
    synthetic: np.ndarray
    missing: tuple[float, float]  # real, synthetic
    outside: float  # synthetic non-missing cells outside the real rows' bins or unreadable


def _rate(mask: np.ndarray) -> float:
    return float(np.count_nonzero(mask)) / len(mask) if len(mask) else 0.0


def number_edges(values: np.ndarray, column: Column, bins: int = BINS) -> tuple[np.ndarray, str]:
    """Bin edges read off the real rows' finite `values` and their kind: "linear" (equal
    widths, or one bin per whole number) or "quantile" (when one equal-width bin would hold
    over half of the values and the quantiles give at least two bins)."""
    low, high = float(values.min()), float(values.max())
    if column.type == "integer" and column.clock is None:
        # whole numbers: bins of a whole width, centred on the values (no aliasing)
        width = 1.0 if high - low < bins + 10 else float(math.ceil((high - low + 1) / bins))
        edges = np.arange(low - 0.5, high + 0.5 + width, width)
        edges = edges[: int(np.searchsorted(edges, high + 0.5)) + 1]
    elif high <= low:
        return np.array([low - 0.5, high + 0.5]), "linear"
    else:
        edges = np.linspace(low, high, bins + 1)
    if np.histogram(values, edges)[0].max() > _SKEWED * len(values):
        quantiles = np.unique(np.quantile(values, np.linspace(0.0, 1.0, bins + 1)))
        if len(quantiles) >= 3:
            return quantiles, "quantile"
    return edges, "linear"


def number_panel(real: np.ndarray, synthetic: np.ndarray, column: Column) -> Panel:
    """The histogram of a numeric, integer, date or time column (see the module docstring)."""
    r, r_missing = lenient_numbers(real, column)
    s, s_missing = lenient_numbers(synthetic, column)
    missing = (_rate(r_missing), _rate(s_missing))
    finite = r[np.isfinite(r)]
    s_present = max(int(np.count_nonzero(~s_missing)), 1)
    if finite.size == 0:
        empty = np.zeros(0)
        return Panel(column, "empty", (), None, empty, empty, missing, 0.0)
    edges, kind = number_edges(finite, column)
    s_finite = s[np.isfinite(s)]
    inside = s_finite[(s_finite >= edges[0]) & (s_finite <= edges[-1])]
    s_counts = np.histogram(inside, edges)[0]
    r_share = np.histogram(finite, edges)[0] / max(int(np.count_nonzero(~r_missing)), 1)
    outside = 1.0 - float(s_counts.sum()) / s_present if np.any(~s_missing) else 0.0
    return Panel(column, kind, (), edges, r_share, s_counts / s_present, missing, outside)


def _category_missing(values: np.ndarray, column: Column) -> np.ndarray:
    if column.type == "boolean":
        return missing_mask(values)
    return np.asarray(values, dtype=object) == ""  # an empty cell: other tokens are categories


def category_panel(
    real: np.ndarray, synthetic: np.ndarray, column: Column, top: int = TOP_CATEGORIES
) -> Panel:
    """The bars of a categorical or boolean column: the `top` commonest real values (all of
    them when there are at most `top` + 1) by real share, and "other values" for the rest of
    either table."""
    r_missing, s_missing = _category_missing(real, column), _category_missing(synthetic, column)
    r_values = pd.Series(np.asarray(real, dtype=object)[~r_missing]).astype(str)
    s_values = pd.Series(np.asarray(synthetic, dtype=object)[~s_missing]).astype(str)
    counts = r_values.value_counts()
    order = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    shown = order if len(order) <= top + 1 else order[:top]
    labels = [str(label) for label, _ in shown]
    r_share = np.array([count for _, count in shown], dtype=np.float64) / max(len(r_values), 1)
    s_counts = s_values.value_counts()
    s_share = np.array([s_counts.get(label, 0) for label in labels], np.float64)
    s_share /= max(len(s_values), 1)
    r_other = 1.0 - float(r_share.sum()) if len(r_values) else 0.0
    s_other = 1.0 - float(s_share.sum()) if len(s_values) else 0.0
    if len(order) > len(shown) or s_other > 1e-12:
        labels.append("other values")
        r_share, s_share = np.append(r_share, max(r_other, 0.0)), np.append(s_share, s_other)
    missing = (_rate(r_missing), _rate(s_missing))
    kind = "categories" if labels else "empty"
    return Panel(column, kind, tuple(labels), None, r_share, s_share, missing, 0.0)


def column_panel(real: RawTable, synthetic: RawTable, column: Column) -> Panel:
    """One column's panel data (the caller checks that both tables have the column)."""
    make = number_panel if column.is_numeric else category_panel
    return make(real.column(column.name), synthetic.column(column.name), column)


def _short(text: str, limit: int = _LABEL_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def value_text(value: float, column: Column, span: float = 0.0) -> str:
    """A bin edge as its column writes it: a date, a time (HH:MM), or 4 significant digits."""
    try:
        if column.is_time:
            moment = datetime.fromtimestamp(float(value), tz=UTC)
            brief = column.type == "date" or span > 3 * 86400
            return moment.strftime("%Y-%m-%d" if brief else "%m-%d %H:%M")
    except (OverflowError, OSError, ValueError):
        pass
    if column.clock is not None and math.isfinite(value):
        minutes = round(value)
        return f"{minutes // 60:02d}:{minutes % 60:02d}"
    return f"{value:.4g}"


def _draw_panel(ax: Any, panel: Panel) -> None:
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    column = panel.column
    title = f"{_short(column.name, 32)} ({column.type})\n"
    title += f"missing: real {panel.missing[0]:.1%}, synthetic {panel.missing[1]:.1%}"
    if panel.outside > 0:
        title += f"\nsynthetic outside the real bins: {panel.outside:.1%}"
    ax.set_title(title, fontsize=8)
    ax.tick_params(labelsize=7)
    if panel.kind == "empty":
        ax.text(0.5, 0.5, "no real values", ha="center", va="center", transform=ax.transAxes)
        ax.set_xticks([])
        ax.set_yticks([])
        return
    if panel.kind == "categories":
        y = np.arange(len(panel.labels))
        ax.barh(y - 0.2, panel.real, 0.4, color=_REAL, alpha=0.55)
        ax.barh(y + 0.2, panel.synthetic, 0.4, facecolor="none", edgecolor=_SYNTHETIC, lw=1.2)
        ax.set_yticks(y)
        ax.set_yticklabels([_short(label) for label in panel.labels], fontsize=7)
        ax.set_ylim(len(y) - 0.5, -0.5)  # the commonest real value on top
        ax.set_xlabel("share of non-missing cells", fontsize=7)
        return
    assert panel.edges is not None
    edges = panel.edges
    span = float(edges[-1] - edges[0])
    left = edges[:-1] if panel.kind == "linear" else np.arange(len(edges) - 1, dtype=float)
    widths = np.diff(edges) if panel.kind == "linear" else np.ones(len(edges) - 1)
    ax.bar(left, panel.real, widths, align="edge", color=_REAL, alpha=0.55)
    ax.stairs(panel.synthetic, np.append(left, left[-1] + widths[-1]), color=_SYNTHETIC, lw=1.5)
    ax.set_ylabel("share", fontsize=7)
    if panel.kind == "quantile":
        ticks = sorted({round(i * (len(edges) - 1) / 4) for i in range(5)})
        ax.set_xticks(ticks)
        ax.set_xticklabels([value_text(edges[t], column, span) for t in ticks], rotation=30)
        ax.set_xlabel("bins at the real rows' quantiles", fontsize=7)
        return
    ax.xaxis.set_major_locator(MaxNLocator(4))
    if column.is_time or column.clock is not None:
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: value_text(v, column, span)))
    ax.tick_params(axis="x", labelrotation=30)


def render_columns(panels: Sequence[Panel]) -> bytes:
    """PNG: the panels in a grid `ACROSS` wide, under one legend (real filled, synthetic
    outlined)."""
    from matplotlib.patches import Patch

    rows = max(1, math.ceil(len(panels) / ACROSS))
    figure = new_figure(3.6 * ACROSS, 3.0 * rows + 0.6)
    figure.set_layout_engine("constrained")
    axes = figure.subplots(rows, ACROSS, squeeze=False).ravel()
    for ax, panel in zip(axes, panels, strict=False):
        _draw_panel(ax, panel)
    for ax in axes[len(panels) :]:
        ax.set_axis_off()
    handles = [
        Patch(color=_REAL, alpha=0.55, label="real held-out rows"),
        Patch(facecolor="none", edgecolor=_SYNTHETIC, lw=1.5, label="synthetic rows"),
    ]
    figure.legend(handles=handles, loc="outside upper center", ncol=2, fontsize=9)
    return figure_png(figure)


def column_pages(
    synthetic: RawTable, real: RawTable, columns: Sequence[Column], per_page: int = PANELS
) -> list[bytes]:
    """The PNGs of the columns' panels, as few pages as `per_page` allows, evenly filled."""
    if not columns:
        return []
    pages = math.ceil(len(columns) / per_page)
    size = math.ceil(len(columns) / pages)
    return [
        render_columns([column_panel(real, synthetic, c) for c in columns[i : i + size]])
        for i in range(0, len(columns), size)
    ]


def check_table_report_dir(folder: Path) -> None:
    """As `release.check_report_dir`, also accepting an earlier table report's figures."""

    def earlier_report(path: Path) -> bool:
        names = {p.name for p in path.iterdir()}
        known = set(REPORT_FILES) | {ASSOCIATION_FILE}
        return "report.json" in names and all(n in known or PAGE_NAME.fullmatch(n) for n in names)

    check_target(folder, flag="--report", force=True, written_by_us=earlier_report)


def write_table_figures(
    folder: Path, synthetic: RawTable, real: RawTable, schema: Schema
) -> dict[str, Any]:
    """Write the column pages and the association heatmap into `folder` (an earlier report's
    pages this one does not rewrite are removed); what the report says of them."""
    columns = marginal_columns(schema)
    drawn = columns[:MAX_COLUMNS]
    files = []
    for number, png in enumerate(column_pages(synthetic, real, drawn), start=1):
        files.append(f"columns-{number}.png")
        write_bytes_atomic(folder / files[-1], png)
    for stale in sorted(folder.iterdir()):
        if PAGE_NAME.fullmatch(stale.name) and stale.name not in files:
            stale.unlink()
    found: dict[str, Any] = {"columns": files, "drawn": len(drawn), "total": len(columns)}
    if len(columns) >= 2:
        heat = association_difference(synthetic, real, schema)
        write_bytes_atomic(folder / ASSOCIATION_FILE, heat.png)
        upper = heat.matrix[np.triu_indices(len(heat.names), 1)]
        pairs = list(itertools.combinations(range(len(heat.names)), 2))
        worst = sorted(zip(upper.tolist(), pairs, strict=True), key=lambda x: -x[0])[:5]
        found["association"] = {
            "file": ASSOCIATION_FILE,
            "columns": len(heat.names),
            "mean": float(upper.mean()),
            "max": float(upper.max()),
            "worst": [{"columns": [heat.names[i] for i in p], "difference": v} for v, p in worst],
        }
    elif (folder / ASSOCIATION_FILE).exists():
        (folder / ASSOCIATION_FILE).unlink()
    return found


def figure_markdown(found: dict[str, Any]) -> list[str]:
    """report.md's lines for the figures `write_table_figures` wrote."""
    lines = [
        "## Columns: real held-out rows against synthetic rows",
        "",
        "Shares of each column's non-missing cells over the same bins (read off the real "
        "rows) or categories (the 20 commonest real values and the other values); each title "
        "gives the missing rates.",
        "",
    ]
    if found["drawn"] < found["total"]:
        lines += [f"The first {found['drawn']} of {found['total']} columns are drawn.", ""]
    lines += [f"![Columns, page {i}]({name})" for i, name in enumerate(found["columns"], 1)]
    lines.append("")
    heat = found.get("association")
    if heat:
        lines += [
            "## Pairwise association difference",
            "",
            "For each pair of columns, the absolute difference between its Cramér's V in the "
            "real rows and in the synthetic rows, on the 2-way TVD's bins (0: the same "
            f"association). Mean {heat['mean']:.4f}, max "
            f"{heat['max']:.4f}"
            + (f" over the first {heat['columns']} columns." if heat["columns"] < found["total"]
               else "."),
            "",
            f"![Pairwise association difference]({heat['file']})",
            "",
            "| column pair | difference |",
            "|---|---|",
        ]  # fmt: skip
        lines += [f"| {' × '.join(w['columns'])} | {w['difference']:.4f} |" for w in heat["worst"]]
        lines.append("")
    lines += [
        "The figures show the real held-out rows' distributions (statistics of them computed "
        "without DP): do not publish this report where the real data are private.",
        "",
    ]
    return lines
