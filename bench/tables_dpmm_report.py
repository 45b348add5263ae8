"""The Markdown page of bench/tables_dpmm.py's results: dpmm's cells beside dpsynth's."""

from __future__ import annotations

import re
from typing import Any

from bench.cli_runner import load1
from bench.tables_real_report import _auc, _f, gap_text, matches_text

# dpmm's binner found no bounds for a numeric column (approx_bounds returned None): an integer
# column fails at once, a float column gets NaN bounds and fails when the rows are binned
NO_BOUNDS = re.compile(
    r"get_bounds.*argument must be .* not 'NoneType'"
    r"|Bin labels must be one fewer than the number of bin edges",
    re.S,
)


def attempt_text(tried: dict[str, Any]) -> str:
    """An attempt in a few words: ok, no bounds, or its error's end."""
    error = tried.get("error")
    if not error:
        return "ok"
    if tried.get("no_bounds") or NO_BOUNDS.search(error) or "not 'NoneType'" in error:
        return "no DP bounds found for a numeric column"
    return " ".join(error.split())[-160:]


def markdown(report: dict[str, Any]) -> str:
    """The report: machine, commands, one line per cell under its table's floor, notes."""
    host = report["machine"]
    lines = [
        f"# dpmm's MST and AIM on the real tables ({report['date'][:10]})",
        "",
        f"{host['cpu']}, {host['cpu_cores']} cores, load {host['load_average_1min']:.1f} at the "
        "start (a shared machine: times are noisy); one run at a time · commit "
        f"`{host['commit']}` · {report['package']} in `{report['venv']}` (Python "
        f"{report.get('venv_python', '?')})",
        "",
        *[f"`{c}`" for c in report["commands"]],
        "",
        "dpmm's pipelines with their defaults and no domain given (its DP PrivTree binning of "
        "the numbers; category lists, missing-value columns and constant columns read off the "
        "data without DP). ε is the total: the binner's share (proc ε) plus the model's. δ: "
        "dpsynth's default for the training rows. Identifier, free-text and excluded columns "
        "are not given to dpmm (written empty). Metrics as in bench/tables_real.py: TVD "
        "against the real held-out rows (floor: the real training rows), ROC-AUC of models "
        "trained on the rows and tested on the held-out rows, the largest missing-rate gap, "
        "synthetic identifier (free-text) values equal to a real one.",
        "",
        "| data | method | ε | δ | proc ε | 1-way TVD | 2-way TVD | logreg AUC | GBM AUC "
        "| missing gap | id (text) matches | fit s | generate s | wall s | peak MB | load "
        "| status |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, facts in sorted(report["tables"].items()):
        floor, base = facts["floor"], facts["real_train_classifiers"]
        lines.append(
            f"| {name} | real train rows (floor) | – | – | – | {_f(floor['tvd_one_way'])} | "
            f"{_f(floor['tvd_two_way'])} | {_auc(base, 'logreg')} | {_auc(base, 'gbm')} | 0 "
            f"| – | – | – | – | – | – | {facts['train_rows']:,} train / "
            f"{facts['holdout_rows']:,} held out, {facts['columns']} columns |"
        )
        for cell in (c for c in report["cells"] if c["data"] == name):
            proc = _f(cell.get("proc_epsilon"), ".2g")
            head = f"| {name} | {cell['method']} | {cell['epsilon']} | {cell['delta']:g} | {proc} |"
            times = (
                f"{_f(cell.get('fit_seconds'), '.0f')} | {_f(cell.get('generate_seconds'), '.0f')}"
                f" | {_f(cell.get('seconds'), '.0f')} | {_f(cell.get('peak_rss_mb'), '.0f')}"
            )
            load = _f(load1(cell.get("uptime_before")), ".1f")
            retried = len(cell.get("attempts", [])) > 1
            note = "retried at a larger proc ε; " if retried else ""
            if cell.get("error"):
                last = (cell.get("attempts") or [{}])[-1]
                text = attempt_text(last) if last.get("error") else cell["error"]
                text = " ".join(text.split())[-300:].replace("|", "/")
                lines.append(f"{head} | | | | | | {times} | {load} | {note}{text} |")
                continue
            m = cell["metrics"]
            lines.append(
                f"{head} {_f(m['tvd_one_way'])} | {_f(m['tvd_two_way'])} | "
                f"{_auc(m['classifiers'], 'logreg')} | {_auc(m['classifiers'], 'gbm')} | "
                f"{gap_text(m['missing_rate_worst'])} | {matches_text(m)} | {times} | {load} "
                f"| {note}ok |"
            )
    lines += ["", "## Cells", ""]
    for cell in report["cells"]:
        tries = "; ".join(
            f"proc share {a['proc_share']:g}: " + attempt_text(a) for a in cell.get("attempts", [])
        )
        info = cell.get("info") or {}
        facts = ""
        if info:
            bins = list(info.get("numeric_bins", {}).values())
            facts = (
                f" dpmm saw {len(info.get('columns_given', {}))} columns: "
                f"{len(bins)} numeric (bins {min(bins, default=0)}–{max(bins, default=0)}), "
                f"{len(info.get('categorical_levels', {}))} categorical (with "
                f"{len(info.get('missing_indicators', []))} missing indicators), "
                f"{len(info.get('constant_columns_dropped', []))} constant; "
                f"{info.get('privacy_leakage_warnings', 0)} PrivacyLeakage warnings; "
                f"{len(info.get('cliques', []))} cliques measured."
            )
        dropped = ", ".join(cell.get("dropped", [])) or "none"
        progress = cell.get("progress")
        if progress and cell.get("timed_out"):
            facts += (
                f" At the limit: {progress['inferences_started']} inferences started, the "
                f"last at {progress['last_started_at_s']} s."
            )
        lines.append(
            f"- **{cell['data']} {cell['method']} ε {cell['epsilon']}**: {tries}. "
            f"Not given: {dropped}.{facts}"
        )
    lines += ["", "## Tables", ""]
    for name, facts in sorted(report["tables"].items()):
        lines.append(
            f"- **{name}** ({facts['source']}; target `{facts['target']}`): {facts['messy']}"
        )
    return "\n".join(lines) + "\n"
