"""The lines a table evaluation's result is shown with: the classifiers' scores, the marginal
fidelity, the rows each was computed on, and report.md (`evaluate --report DIR`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dpsynth.evaluation.render import fingerprint_note
from dpsynth.evaluation.table_figures import figure_markdown
from dpsynth.evaluation.table_provenance import schema_release_markdown

TABLE_METRICS = ("accuracy", "roc_auc")


def ml_metrics(wanted: Sequence[str]) -> list[str]:
    """The classifier metrics among the requested ones (accuracy, roc_auc)."""
    return [m for m in wanted if m in TABLE_METRICS]


def rows_line(result: dict[str, Any]) -> str | None:
    """What the classifiers were trained and tested on (None when they did not run)."""
    rows = result.get("classifier_rows")
    if not rows:
        return None
    sampled = rows["synthetic"] < rows["synthetic_of"] or rows["real"] < rows["real_of"]
    how = (
        f"a seeded uniform sample of at most {rows['max_rows']:,} rows a table (seed "
        f"{rows['seed']})"
        if sampled
        else "every row"
    )
    return (
        f"trained on {rows['synthetic']:,} of {rows['synthetic_of']:,} synthetic rows, tested on "
        f"{rows['real']:,} of {rows['real_of']:,} real rows: {how}"
    )


def score_rows(result: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """(trained on, classifier, {metric: {mean, std}}) rows of a result, synthetic first."""
    metrics = result["metrics"]
    rows = [("synthetic", k, v) for k, v in metrics.get("classifiers", {}).items()]
    for kind, values in metrics.get("real_train_classifiers", {}).items():
        rows.append((f"real ({metrics['real_train']})", kind, values))
    return rows


def fmt_score(value: dict[str, Any]) -> str:
    """`mean ± std`, or n/a."""
    if value.get("mean") is None:
        return "n/a"
    return f"{value['mean']:.4f} ± {value['std']:.4f}"


def marginal_rows(result: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, value) lines of a result's marginal fidelity; none when it was not requested."""
    found = result["metrics"].get("marginals")
    if not found:
        return []

    def tvd(part: dict[str, Any]) -> str:
        if part["mean"] is None:
            return "n/a (fewer columns)"
        return f"{part['mean']:.4f} (max {part['max']:.4f}, {part['count']} marginals)"

    three = found["three_way"]
    rows = [
        ("1-way TVD", tvd(found["one_way"])),
        ("2-way TVD", tvd(found["two_way"])),
        (f"3-way TVD (public random triples, seed {three['seed']})", tvd(three)),
    ]
    worst = found["two_way"]["worst"]
    if worst:
        rows.append(
            ("worst 2-way", ", ".join(f"{'×'.join(w['columns'])} {w['tvd']:.3f}" for w in worst))
        )
    for side, shares in found["other_share"].items():
        if shares:
            shown = ", ".join(f"{k} {v:.1%}" for k, v in list(shares.items())[:8])
            rows.append((f"{side} values outside the schema", shown))
    return rows


def render_table_markdown(result: dict[str, Any]) -> str:
    """The Markdown page of a table evaluation."""
    wanted = ml_metrics(result["metrics_requested"])
    lines = [
        "# dpsynth evaluation report (table)",
        "",
        f"- Synthetic: `{result['synthetic']}` ({result['n_synthetic']} rows)",
        f"- Real held-out: `{result['real']}` ({result['real_n']} rows"
        f"{fingerprint_note(result['real_fingerprint'])}), target `{result['target']}`",
    ]
    if result.get("synthetic_layout"):
        lines.append(f"- Synthetic read as: {result['synthetic_layout']}")
    if rows_line(result):
        lines.append(f"- Classifiers: {rows_line(result)}")
    if result.get("privacy"):
        lines.append(f"- Privacy of the synthetic rows: {result['privacy']}")
    lines.append(f"- Mean ± std over {result['seeds']} seed(s); final models, no selection")
    lines.append("")
    if result["warnings"]:
        lines += ["## Warnings", ""] + [f"- **{w}**" for w in result["warnings"]] + [""]
    if wanted:
        lines += [
            "## Classifiers tested on the real held-out rows",
            "",
            "| trained on | classifier | " + " | ".join(wanted) + " |",
            "|---|---|" + "---|" * len(wanted),
        ]
        for trained, kind, values in score_rows(result):
            cells = " | ".join(fmt_score(values[m]) for m in wanted)
            lines.append(f"| {trained} | {kind} | {cells} |")
        lines.append("")
    found = result["metrics"].get("marginals")
    if found:
        lines += [
            "## Marginal fidelity (total variation distance to the real held-out rows)",
            "",
            f"Lower is better (0: the same distribution, 1: disjoint). {found['binning']}. "
            "Counted exactly over every row of both tables.",
            "",
            "| marginals | TVD |",
            "|---|---|",
        ]
        lines += [f"| {label} | {value} |" for label, value in marginal_rows(result)]
        lines += ["", "| column | 1-way TVD |", "|---|---|"]
        per_column = found["one_way"]["per_column"]
        lines += [f"| {name} | {value:.4f} |" for name, value in per_column.items()]
        lines.append("")
    if result.get("figures"):
        lines += figure_markdown(result["figures"])
        drawn = result["figures"].get("rows")
        if drawn and (
            drawn["synthetic"] < result["n_synthetic"] or drawn["real"] < result["real_n"]
        ):
            lines += [
                f"The figures are drawn from the classifiers' row samples: {drawn['synthetic']:,} "
                f"synthetic and {drawn['real']:,} real rows.",
                "",
            ]
    lines += schema_release_markdown(result["schema_release"])
    return "\n".join(lines)
