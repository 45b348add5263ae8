"""The image evaluation report's pages: the sample grid, the per-class accuracy chart and the
ε curve as PNGs, and the Markdown page that links them; the figure helpers the table report's
PNGs share (`dpsynth.evaluation.table_figures`)."""

from __future__ import annotations

import io
import math

import numpy as np
import torch

from dpsynth.data.images import ImageData
from dpsynth.evaluation import folders

GRID_PER_SIDE = 8


def new_figure(width: float, height: float):
    """A matplotlib Figure of `width` × `height` inches at 100 dpi on an explicit Agg canvas:
    headless, and no pyplot global state (matplotlib is imported here, not with dpsynth)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(figure)
    return figure


def figure_png(figure) -> bytes:
    """The figure as PNG bytes (tight bounding box)."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", bbox_inches="tight")
    return buffer.getvalue()


def _grid_rows(
    x: torch.Tensor, y: torch.Tensor, n_classes: int, per_row: int
) -> list[list[np.ndarray]]:
    rows = []
    for c in range(n_classes):
        picked = x[y == c][:per_row]
        rows.append([img.permute(1, 2, 0).numpy() for img in picked])
    return rows


def render_sample_grid(
    synth: folders.SyntheticImages, real_data: ImageData, per_side: int = GRID_PER_SIDE
) -> bytes:
    """PNG: one row per class, `per_side` synthetic images left of `per_side` real ones."""
    classes = real_data.classes
    channels, height, width = real_data.shape
    fake_rows = _grid_rows(synth.x, synth.y, len(classes), per_side)
    real_rows = _grid_rows(real_data.x, real_data.y, len(classes), per_side)
    gap = max(2, width // 2)
    cell_w, cell_h = width + 1, height + 1
    canvas_w = 2 * per_side * cell_w + gap
    canvas = np.full((len(classes) * cell_h, canvas_w, channels), 255, dtype=np.uint8)
    for row, (fakes, reals) in enumerate(zip(fake_rows, real_rows, strict=True)):
        top = row * cell_h
        for i, img in enumerate(fakes):
            canvas[top : top + height, i * cell_w : i * cell_w + width] = img
        for i, img in enumerate(reals):
            left = per_side * cell_w + gap + i * cell_w
            canvas[top : top + height, left : left + width] = img
    figure = new_figure(max(6.0, canvas_w / 40), max(2.0, len(classes) * cell_h / 40))
    ax = figure.add_subplot(1, 1, 1)
    image = canvas[:, :, 0] if channels == 1 else canvas
    ax.imshow(image, cmap="gray" if channels == 1 else None, vmin=0, vmax=255)
    ax.set_yticks([r * cell_h + height / 2 for r in range(len(classes))])
    ax.set_yticklabels(list(classes))
    ax.set_xticks([per_side * cell_w / 2, per_side * cell_w + gap + per_side * cell_w / 2])
    ax.set_xticklabels(["synthetic", f"real ({real_data.spec})"])
    ax.tick_params(length=0)
    for spine in ax.spines.values():
        spine.set_visible(False)
    return figure_png(figure)


def render_per_class(accuracy: dict) -> bytes:
    """PNG bar chart: per-class accuracy of the synthetic-trained (and real-trained) classifier."""
    names = list(accuracy["per_class"])
    synth_values = [_nan_if_none(accuracy["per_class"][c]) for c in names]
    figure = new_figure(max(5.0, 0.5 * len(names) + 2), 3.5)
    ax = figure.add_subplot(1, 1, 1)
    positions = np.arange(len(names))
    upper = accuracy.get("real_train_per_class")
    width = 0.4 if upper else 0.8
    ax.bar(
        positions - (width / 2 if upper else 0), synth_values, width, label="trained on synthetic"
    )
    if upper:
        real_values = [_nan_if_none(upper.get(c)) for c in names]
        ax.bar(positions + width / 2, real_values, width, label="trained on real (upper bound)")
    ax.set_xticks(positions)
    ax.set_xticklabels(names)
    ax.set_ylim(0, 1)
    ax.set_xlabel("class")
    ax.set_ylabel(f"accuracy on {accuracy.get('reference', 'real test')}")
    ax.set_title(f"{accuracy['classifier']}: mean {accuracy['mean']:.3f} ± {accuracy['std']:.3f}")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=2, frameon=False)
    return figure_png(figure)


def _nan_if_none(value: float | None) -> float:
    return math.nan if value is None else float(value)


def render_epsilon_curve(log: list[dict]) -> bytes:
    """PNG line plot of the ε spent (accountant upper bound) against the training step."""
    steps = [float(row["step"]) for row in log]
    eps = [_nan_if_none(row.get("epsilon")) for row in log]
    figure = new_figure(5.0, 3.5)
    ax = figure.add_subplot(1, 1, 1)
    ax.plot(steps, eps, marker="." if len(steps) < 50 else None)
    ax.set_xlabel("step")
    ax.set_ylabel("ε spent (upper bound)")
    ax.set_title("privacy spent during training")
    ax.grid(alpha=0.3)
    return figure_png(figure)


def fingerprint_note(fingerprint: str | None) -> str:
    """`, ledger fingerprint …` for a report line, or nothing without one."""
    return f", ledger fingerprint `{fingerprint[:28]}…`" if fingerprint else ""


def render_markdown(result: dict, images: dict[str, str]) -> str:
    """The human-readable report page, linking the PNGs."""
    lines = [
        "# dpsynth evaluation report",
        "",
        f"- Synthetic: `{result['synthetic']}` ({result['synthetic_source']}, "
        f"{result['n_synthetic']} images)",
        f"- Real reference: `{result['real']}` ({result['real_n']} images"
        f"{fingerprint_note(result['real_fingerprint'])})",
        "",
    ]
    if result["warnings"]:
        lines += ["## Warnings", ""] + [f"- **{w}**" for w in result["warnings"]] + [""]
    metrics = result["metrics"]
    lines += ["## Metrics", "", "| metric | value | details |", "|---|---|---|"]
    if "fid" in metrics:
        m = metrics["fid"]
        lines.append(
            f"| FID | {m['value']:.3f} | n_synthetic={m['n_synthetic']}, n_real={m['n_real']}, "
            f"reference `{m['reference']}`, TF-Inception pool3 |"
        )
    for name in ("precision", "recall"):
        if name in metrics:
            lines.append(f"| {name} | {metrics[name]['value']:.3f} | k={metrics[name]['k']} |")
    if "accuracy" in metrics:
        a = metrics["accuracy"]
        lines.append(
            f"| accuracy ({a['classifier']}, trained on synthetic) | {a['mean']:.4f} ± "
            f"{a['std']:.4f} | {a['seeds']} seed(s), final model, tested on `{a['reference']}` |"
        )
        if "real_train_accuracy" in a:
            lines.append(
                f"| accuracy ({a['classifier']}, trained on `{a['real_train']}`) | "
                f"{a['real_train_accuracy']:.4f} ± {a['real_train_std']:.4f} | upper bound |"
            )
        lines += ["", "### Per-class accuracy", "", "| class | synthetic-trained |", "|---|---|"]
        for name, value in a["per_class"].items():
            lines.append(f"| {name} | {'n/a' if value is None else f'{value:.3f}'} |")
    lines.append("")
    titles = {
        "samples": "Synthetic samples (left) beside real ones (right)",
        "per_class_accuracy": "Per-class accuracy",
        "epsilon_curve": "ε against training step",
    }
    for key, file in images.items():
        lines += [f"## {titles[key]}", "", f"![{titles[key]}]({file})", ""]
    if "samples" in images:
        lines.append(
            "The right-hand images are real records of the reference set: do not publish this "
            "report where the real data are private."
        )
        lines.append("")
    return "\n".join(lines)
