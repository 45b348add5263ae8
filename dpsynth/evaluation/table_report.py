"""`evaluate` for tables: classifiers trained on synthetic rows, tested on real held-out rows.

Logistic regression (one-hot categories, standardised numbers) and gradient boosting
(scikit-learn's HistGradientBoostingClassifier, categories as native categorical features) are
fitted on the synthetic rows only (a CSV, or Parquet when its name ends in `.parquet`) and
tested on the real held-out table: accuracy and ROC-AUC
(binary: of the second class's score; more classes: one-vs-rest macro average), mean ± std over
`seeds` (the classifiers' random state; logistic regression is deterministic, so its std is 0).
The final model is reported, nothing is selected on the test rows. `--real-train SPEC` adds the
same classifiers trained on real rows, for reference (a non-private statistic of those rows).

`--metrics marginals` adds the marginal fidelity (`dpsynth.evaluation.marginals`): the total
variation distance of the 1-, 2- and 3-way marginals between the synthetic and the real rows,
numbers binned on the schema's public bounds; `ml` and `marginals` combine (`ml,marginals`).

The schema that reads both tables: `--schema`, else the one in the synthetic CSV's manifest
(the run's public schema), else a built-in table's own. Values the schema does not list are
kept: one-hot encoding ignores them and the boosted trees treat them as missing. Rows whose
target is not one of the classes are dropped (with a warning). The ledger rules are the image
ones (`dpsynth.evaluation.release`): real data that a DP run spent budget on is flagged, metrics
on a user's own held-out rows are listed as non-private, and the evaluation is recorded as a
zero-cost release. `--report DIR` writes report.json, report.md and the figures of
`dpsynth.evaluation.table_figures`; the page also shows what the synthetic table's run released
of its schema with DP (`dpsynth.evaluation.table_provenance`).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import numpy as np

from dpsynth.data.frames import is_frame, read_frame
from dpsynth.data.schema import Schema
from dpsynth.data.schema_file import parse_schema, read_schema
from dpsynth.data.sources import DataInput, read_table, read_table_file
from dpsynth.data.table_codec import RawTable, table_content_digest
from dpsynth.errors import DataError, UsageError
from dpsynth.evaluation.release import (
    record_evaluation_release,
    report_fingerprint,
    training_data_warnings,
)
from dpsynth.evaluation.render import fingerprint_note
from dpsynth.evaluation.table_classifiers import classifier_scores, table_frame
from dpsynth.evaluation.table_figures import (
    check_table_report_dir,
    figure_markdown,
    write_table_figures,
)
from dpsynth.evaluation.table_provenance import (
    checked_manifest_privacy,
    read_manifest,
    schema_release_markdown,
    schema_release_summary,
)
from dpsynth.rundir import write_bytes_atomic

if TYPE_CHECKING:
    import pandas as pd

TABLE_METRICS = ("accuracy", "roc_auc")
FIDELITY_METRICS = ("marginals",)
_ALIASES = {"ml": TABLE_METRICS, "auc": ("roc_auc",), "roc-auc": ("roc_auc",)}


def parse_table_metrics(metrics: Sequence[str]) -> list[str]:
    """accuracy, roc_auc (aliases: auc, roc-auc; ml for both) and marginals."""
    wanted: list[str] = []
    for name in (m.strip().lower() for m in metrics if m.strip()):
        for metric in _ALIASES.get(name, (name,)):
            if metric not in TABLE_METRICS + FIDELITY_METRICS:
                raise UsageError(
                    f"{{metrics}} {name!r} is not a table metric; choose from accuracy, roc_auc "
                    "(or ml for both), marginals",
                    parameter="metrics",
                )
            if metric not in wanted:
                wanted.append(metric)
    if not wanted:
        raise UsageError(
            "{metrics}: name at least one of accuracy, roc_auc, ml, marginals",
            parameter="metrics",
        )
    return wanted


def ml_metrics(wanted: Sequence[str]) -> list[str]:
    """The classifier metrics among the requested ones (accuracy, roc_auc)."""
    return [m for m in wanted if m in TABLE_METRICS]


def check_columns(raw: RawTable, schema: Schema) -> None:
    """DataError naming the schema's columns (all but ignored ones) that the table lacks."""
    missing = [c.name for c in schema.columns if c.type != "ignored" and c.name not in raw.header]
    if missing:
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise DataError(
            f"{raw.source}: has no column {', '.join(map(repr, missing[:5]))}{more}, which the "
            "schema lists (the header must name every schema column that is not ignored)"
        )


def _real_table(spec: DataInput, schema: Schema | None) -> tuple[RawTable, Schema, str, str]:
    raw, parsed, bundled = read_table(spec, schema)
    chosen = schema or bundled
    if chosen is None:
        named = parsed.given if parsed.kind in ("builtin", "frame") else parsed.canonical
        raise UsageError(
            f"{{real}} {named}: pass {{schema}} FILE.json (the table's public schema)",
            parameters=("real", "schema"),
        )
    return raw, chosen, parsed.canonical, parsed.kind


def run_table_evaluation(
    *,
    synthetic: str | os.PathLike[str] | pd.DataFrame,
    real: DataInput,
    metrics: Sequence[str],
    seeds: int = 3,
    real_train: DataInput | None = None,
    schema_path: str | os.PathLike[str] | None = None,
    report_dir: str | os.PathLike[str] | None = None,
    ledger_path: str | os.PathLike[str] | None = None,
) -> dict[str, Any]:
    """Evaluate a synthetic CSV or Parquet file, or a DataFrame (as `Synthesizer.sample`
    returns), against a real held-out table (see the module docstring)."""
    wanted = parse_table_metrics(metrics)
    if real_train is not None and not ml_metrics(wanted):
        raise UsageError(
            "{real_train} is for the classifier metrics (accuracy, roc_auc, ml)",
            parameter="real_train",
        )
    if seeds < 1:
        raise UsageError(f"{{seeds}} must be at least 1, got {seeds}", parameter="seeds")
    if report_dir is not None:
        check_table_report_dir(Path(report_dir))
    in_memory = is_frame(synthetic)
    synth_path = Path("DataFrame" if in_memory else synthetic)  # type: ignore[arg-type]
    if not in_memory and synth_path.is_dir():
        raise UsageError(
            f"{{synthetic}} {synthetic}: for a table give the file written by `sample --out "
            "FILE.csv` (or FILE.parquet)",
            parameter="synthetic",
        )
    manifest = {} if in_memory else read_manifest(synth_path)
    schema = None
    if schema_path is not None:
        schema = read_schema(schema_path)
    elif isinstance(manifest.get("schema"), dict):
        schema = parse_schema(manifest["schema"], f"{synthetic} manifest schema")
    raw_real, schema, real_spec, real_kind = _real_table(real, schema)
    check_columns(raw_real, schema)
    synth_raw = (
        read_frame(synthetic, schema)  # type: ignore[arg-type]
        if in_memory
        else read_table_file(synth_path, source=f"--synthetic {synthetic}", schema=schema)
    )
    check_columns(synth_raw, schema)
    real_digest = table_content_digest(raw_real, schema)
    warnings_list: list[str] = []
    real_id = SimpleNamespace(spec=real_spec, dataset_id=real_spec, content_digest=real_digest)
    warnings_list += training_data_warnings(real_id, ledger_path, "--real")  # type: ignore[arg-type]
    non_private = bool(warnings_list)
    described = {column.name for column in schema.columns if column.type != "ignored"}
    unscored = [name for name in synth_raw.header if name not in described]
    if unscored:
        shown = ", ".join(map(repr, unscored[:5])) + (" …" if len(unscored) > 5 else "")
        warnings_list.append(
            f"--synthetic {synth_path.name}: {len(unscored)} column(s) the schema does not "
            f"describe (or ignores) are not scored: {shown}"
        )
    result_metrics: dict[str, Any] = {}
    if "marginals" in wanted:
        from dpsynth.evaluation.marginals import marginal_fidelity

        result_metrics["marginals"] = marginal_fidelity(synth_raw, raw_real, schema)
    classifier_metrics = ml_metrics(wanted)
    n_synthetic, n_real = synth_raw.n, raw_real.n
    if classifier_metrics:
        x_real, y_real = table_frame(raw_real, schema)
        x_syn, y_syn = table_frame(synth_raw, schema)
        for name, labels in (("real", y_real), ("synthetic", y_syn)):
            dropped = int((labels < 0).sum())
            if dropped:
                warnings_list.append(f"{dropped} {name} row(s) have a target outside the classes")
        keep_real, keep_syn = y_real >= 0, y_syn >= 0
        test = (x_real[keep_real].reset_index(drop=True), y_real[keep_real])
        train = (x_syn[keep_syn].reset_index(drop=True), y_syn[keep_syn])
        n_synthetic, n_real = len(train[1]), len(test[1])
        if len(np.unique(train[1])) < 2:
            warnings_list.append("the synthetic rows hold fewer than two classes: no classifier")
        result_metrics["classifiers"] = classifier_scores(
            train, test, schema, classifier_metrics, seeds
        )
    if real_train is not None:
        raw_train, _, train_spec, train_kind = _real_table(real_train, schema)
        train_id = SimpleNamespace(
            spec=train_spec,
            dataset_id=train_spec,
            content_digest=table_content_digest(raw_train, schema),
        )
        found = training_data_warnings(train_id, ledger_path, "--real-train")  # type: ignore[arg-type]
        non_private = non_private or bool(found)
        warnings_list += found
        x_rt, y_rt = table_frame(raw_train, schema)
        result_metrics["real_train"] = train_spec
        result_metrics["real_train_classifiers"] = classifier_scores(
            (x_rt[y_rt >= 0].reset_index(drop=True), y_rt[y_rt >= 0]),
            test, schema, classifier_metrics, seeds,
        )  # fmt: skip
        if train_kind != "builtin":
            warnings_list.append(
                f"the real-trained reference reads {train_spec} without DP: a non-private "
                "statistic of that data; do not publish it for private data"
            )
    provenance = {
        key: manifest[key]
        for key in ("run_id", "method", "dataset_id", "fingerprint")
        if key in manifest
    }
    result: dict[str, Any] = {
        "modality": "table",
        "synthetic": "a DataFrame" if in_memory else str(synth_path),
        "synthetic_source": "sample" if manifest else "frame" if in_memory else "file",
        "n_synthetic": n_synthetic,
        "real": real_spec,
        "real_kind": real_kind,
        "non_private": non_private,
        "real_n": n_real,
        "real_fingerprint": report_fingerprint(real_digest, ledger_path),
        "classes": list(schema.classes),
        "target": schema.target,
        "metrics_requested": wanted,
        "metrics": result_metrics,
        "seeds": seeds,
        "provenance": provenance,
        "schema_release": schema_release_summary(manifest),
        "warnings": warnings_list,
        "report_dir": None,
    }
    privacy = checked_manifest_privacy(manifest, synth_path, ledger_path, warnings_list)
    if privacy is not None:
        result["privacy"] = privacy
    reasons = []
    if "real_train_classifiers" in result_metrics and real_train is not None:
        reasons.append("real-trained scores: a statistic of the real training data")
    if non_private:
        reasons.append("metrics on data that DP training spent budget on")
    if real_kind != "builtin":
        reasons.append(
            f"{', '.join(wanted)} on {real_spec}: a statistic of the user's own held-out rows, "
            "computed without DP"
        )
    result["non_private_contents"] = reasons
    if report_dir is not None:
        folder = Path(report_dir)
        folder.mkdir(parents=True, exist_ok=True)
        result["report_dir"] = str(folder)
        figures = write_table_figures(folder, synth_raw, raw_real, schema)
        result["report_files"] = {"json": "report.json", "markdown": "report.md"} | {
            "columns": figures["columns"],
            **({"association": figures["association"]["file"]} if "association" in figures else {}),
        }
        result["figures"] = figures
        if real_kind != "builtin":
            reasons.append(
                "the report's figures: distributions and pairwise associations of the real "
                "held-out rows, computed without DP"
            )
        data = json.dumps(result, indent=2, ensure_ascii=False).encode() + b"\n"
        write_bytes_atomic(folder / "report.json", data)
        write_bytes_atomic(folder / "report.md", render_table_markdown(result).encode())
        digest = hashlib.sha256(data).hexdigest()
    else:
        digest = hashlib.sha256(
            json.dumps(result, sort_keys=True, separators=(",", ":")).encode()
        ).hexdigest()
    result["release"] = record_evaluation_release(ledger_path, result, digest)
    return result


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
            f"Lower is better (0: the same distribution, 1: disjoint). {found['binning']}.",
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
    lines += schema_release_markdown(result["schema_release"])
    return "\n".join(lines)
