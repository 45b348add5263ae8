"""The leaderboard's pages: the Markdown tables (images and tables) and the JSON report with
the date, commit, machine and command above the table."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


def _pm(row: dict[str, Any], key: str) -> str:
    """`mean ± std` of a score, or – when it was not measured."""
    mean, std = row.get(f"{key}_mean"), row.get(f"{key}_std")
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return "–"
    return f"{mean:.3f} ± {std:.3f}"


def table_markdown(report: dict[str, Any]) -> str:
    """The table leaderboard: LR and GB accuracy and ROC-AUC, the real-trained row first."""
    head = (
        "| method | preset | ε | steps | train time (s) | LR accuracy | LR ROC-AUC "
        "| GB accuracy | GB ROC-AUC |\n|---|---|---|---|---|---|---|---|---|\n"
    )
    lines = []
    rows = ([report["real"]] if report.get("real") else []) + list(report["rows"])
    for row in rows:
        epsilon = _fmt_eps(row.get("epsilon_target", row.get("epsilon")))
        if "error" in row:
            lines.append(
                f"| {row['method']} | {row.get('preset') or '–'} | {epsilon} "
                f"| failed: {row['error'][:80]} | | | | | |"
            )
            continue
        steps = f"{row['steps']:,}" if row.get("steps") is not None else "–"
        lines.append(
            f"| {row['method']} | {row.get('preset') or '–'} | {epsilon} | {steps} "
            f"| {_fmt(row.get('train_seconds'), '.0f')} | {_pm(row, 'logreg_accuracy')} "
            f"| {_pm(row, 'logreg_roc_auc')} | {_pm(row, 'gbm_accuracy')} "
            f"| {_pm(row, 'gbm_roc_auc')} |"
        )
    majority = report.get("majority_class_rate")
    tail = f"\nMajority-class accuracy on the test table: {majority:.3f}.\n" if majority else ""
    return head + "\n".join(lines) + "\n" + tail


def _fmt_eps(value: Any) -> str:
    """An ε for the table: its target, ∞ marked not private, – for a reference row."""
    if value is None:
        return "–"
    if value == "inf" or (isinstance(value, float) and math.isinf(value)):
        return "∞ (not private)"
    return f"{float(value):.3g}"


def _fmt(value: Any, spec: str) -> str:
    """`value` formatted by `spec`, or – when missing."""
    return "–" if value is None else format(value, spec)


def markdown_table(report: dict[str, Any]) -> str:
    """The leaderboard as a Markdown table, the real-trained row first."""
    real = report.get("real")
    real_mean = real["cnn_mean"] if real else None
    head = (
        "| method | preset | ε | steps | train time (s) | CNN accuracy | % of real | FID "
        "| precision | recall | sampling images/s |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    lines = []
    public = [report["public_images"]] if report.get("public_images") else []
    rows = ([real] if real else []) + public + list(report.get("dpsgd", [])) + list(report["rows"])
    for row in rows:
        if "error" in row:
            lines.append(
                f"| {row['method']} | {row.get('preset') or '–'} | {_fmt_eps(row.get('epsilon'))} "
                f"| failed: {row['error'][:80]} | | | | | | | |"
            )
            continue
        share = (
            f"{100 * row['cnn_mean'] / real_mean:.0f}%"
            if real_mean and row is not real
            else ("100%" if row is real else "–")
        )
        steps = f"{row['steps']:,}" if row.get("steps") is not None else "–"
        # The target ε names the row; the accountant's bound (≤ target) is in the JSON.
        epsilon = _fmt_eps(row.get("epsilon_target", row.get("epsilon")))
        preset = (row.get("preset") or "–") + (f" ({row['variant']})" if row.get("variant") else "")
        preset += " + public" if row.get("public") else ""
        lines.append(
            f"| {row['method']} | {preset} | {epsilon} "
            f"| {steps} | {_fmt(row.get('train_seconds'), '.0f')} "
            f"| {row['cnn_mean']:.3f} ± {row['cnn_std']:.3f} | {share} "
            f"| {_fmt(row.get('fid'), '.1f')} | {_fmt(row.get('precision'), '.2f')} "
            f"| {_fmt(row.get('recall'), '.2f')} | {_fmt(row.get('sample_images_per_s'), '.0f')} |"
        )
    return head + "\n".join(lines) + "\n"


def write_results(report: dict[str, Any], json_path: Path, markdown_path: Path) -> None:
    """Write the JSON report and the Markdown page (date, machine, command above the table)."""
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(report, indent=2) + "\n")
    machine = report["machine"]
    where = machine["gpu"] or f"{machine['cpu']}, {machine['cpu_cores']} cores"
    # The commit the figures were measured at (reports written before it was recorded: none).
    when = report["date"] + (f" at `{machine['commit']}`" if machine.get("commit") else "")
    if report.get("modality") == "table":
        header = (
            f"# Leaderboard: {report['data']}\n\n"
            f"{when} · {where} · torch {machine['torch']} · "
            f"{report['synthetic_n']:,} synthetic rows per run (balanced labels) · "
            f"classifiers {report['seeds']} seeds · {report.get('runs', 1)} training run(s) "
            f"per row (± over {'runs' if report.get('runs', 1) > 1 else 'classifier seeds'}) · "
            f"tested on {report['test']}\n\n"
            f"`{report['command']}`\n\n"
        )
        markdown_path.parent.mkdir(parents=True, exist_ok=True)
        markdown_path.write_text(header + table_markdown(report))
        return
    header = (
        f"# Leaderboard: {report['data']}\n\n"
        f"{when} · {where} · torch {machine['torch']} · "
        f"{report['synthetic_n']:,} synthetic images per run · CNN {report['seeds']} seeds · "
        f"FID, precision and recall (k = 3) of {report.get('fid_n', 'all')} synthetic images "
        f"against {report.get('test') or report['data'] + ':test'}"
        f"{'' if report['fid'] else ': not measured (--no-fid), NOT a run of record'}"
        f"{' · public pretraining images: ' + report['public'] if report.get('public') else ''}"
        f"\n\n`{report['command']}`\n\n"
    )
    markdown_path.parent.mkdir(parents=True, exist_ok=True)
    markdown_path.write_text(header + markdown_table(report))
