"""The Markdown page of bench/tables_real.py's results."""

from __future__ import annotations

from typing import Any

from bench.cli_runner import load1


def _f(value: Any, spec: str = ".3f") -> str:
    return "–" if value is None else format(value, spec)


def _auc(classifiers: dict[str, Any] | None, name: str) -> str:
    if not classifiers or "error" in classifiers:
        return "–"
    return _f(classifiers[name]["roc_auc"])


def matches_text(metrics: dict[str, Any]) -> str:
    """Synthetic identifier values equal to real ones, and in brackets free-text values."""
    text = f"{sum(metrics['id_matches'].values())}"
    if metrics.get("text_matches"):
        text += f" ({sum(metrics['text_matches'].values())})"
    return text


def gap_text(gap: dict[str, Any] | None) -> str:
    """The largest missing-rate gap: 'column: 0.12', or 0."""
    return f"{gap['column']}: {gap['gap']:.2f}" if gap and gap["gap"] > 0 else "0"


def outside_text(metrics: dict[str, Any]) -> str:
    """The mean share of synthetic numbers outside the real range, and the worst column."""
    outside = metrics.get("outside_range")  # absent from cells scored before it existed
    if not outside or outside["mean"] is None:
        return "–"
    worst = outside["worst"]
    return f"{outside['mean']:.3f} ({worst['column']}: {worst['share']:.2f})"


def markdown(report: dict[str, Any]) -> str:
    """The report: the machine, the commands, the tables, one line per cell under its floor."""
    host = report["machine"]
    lines = [
        f"# Real tables through the CLI's safe path ({report['date'][:10]})",
        "",
        f"{host['cpu']}, {host['cpu_cores']} cores, dpsynth's default threads (OMP_NUM_THREADS="
        f"{host['omp_num_threads']}), load {host['load_average_1min']:.1f} at the start (a "
        "shared machine: times are noisy); one training at a time · commit "
        f"`{host['commit']}` · dpsynth from `{report['dpsynth']}`"
        + (f" ({report['label']})" if report.get("label") else ""),
        "",
        *[f"`{c}`" for c in report["commands"]],
        "",
        "TVD against the real held-out rows (numbers and dates: 10 held-out quantile bins + "
        "missing; categoricals: 20 most common held-out values + other + missing; identifiers "
        "and free text left out). Missing gap: the largest |real train − synthetic| missing "
        "rate of a scored column. Id (text) matches: synthetic identifier (free-text) values "
        "equal to a real training value. (other): the largest synthetic share of a column's "
        "other category, beside that real column's most common value share. Outside range: "
        "the mean share of synthetic numbers and dates outside the real training rows' "
        "[min, max] (the TVD's end bins are open), and the worst column.",
        "",
        "| data | method | ε | schema flags | 1-way TVD | 2-way TVD | logreg AUC | GBM AUC "
        "| missing gap | id (text) matches | (other) vs real top | outside range | train s "
        "| sample s | load | status |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, facts in sorted(report["tables"].items()):
        floor, base = facts["floor"], facts["real_train_classifiers"]
        lines.append(
            f"| {name} | real train rows (floor) | – | – | {_f(floor['tvd_one_way'])} | "
            f"{_f(floor['tvd_two_way'])} | {_auc(base, 'logreg')} | {_auc(base, 'gbm')} | 0 | – "
            f"| – | – | – | – | – | {facts['train_rows']:,} train / {facts['holdout_rows']:,} "
            f"held out, {facts['columns']} columns |"
        )
        for cell in (c for c in report["cells"] if c["data"] == name):
            flags = cell.get("schema_flags", "")
            head = f"| {name} | {cell['method']} | {cell['epsilon']} | `{flags}` |"
            load = _f(load1(cell.get("uptime_before_train")), ".1f")
            times = (
                f"{_f(cell.get('train_seconds'), '.0f')} | {_f(cell.get('sample_seconds'), '.0f')}"
            )
            if cell.get("error"):
                text = " ".join(cell["error"].split())[:300].replace("|", "/")
                lines.append(f"{head} | | | | | | | | {times} | {load} | {text} |")
                continue
            m = cell["metrics"]
            gap = m["missing_rate_worst"]
            other = m["other"]
            other_text = (
                f"{other['column']}: {other['synthetic_other_share']:.2f} vs "
                f"{other['real_top_share']:.2f}"
                if other["column"]
                else "0"
            )
            lines.append(
                f"{head} {_f(m['tvd_one_way'])} | {_f(m['tvd_two_way'])} | "
                f"{_auc(m['classifiers'], 'logreg')} | {_auc(m['classifiers'], 'gbm')} | "
                f"{gap_text(gap)} | {matches_text(m)} | "
                f"{other_text} | {outside_text(m)} | {times} | {load} | ok |"
            )
    lines += ["", "## Tables", ""]
    for name, facts in sorted(report["tables"].items()):
        schema = facts.get("schema", {})
        lines.append(
            f"- **{name}** ({facts['source']}; target `{facts['target']}`): "
            f"{facts['messy']}. Schema: {schema.get('error') or schema.get('types')}"
        )
        if facts.get("scored_identifiers"):  # fresh keys scored as a lost column
            lines.append(f"  - scored though drafted identifiers: {facts['scored_identifiers']}")
    return "\n".join(lines) + "\n"
