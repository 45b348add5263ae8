"""`evaluate` for tables: classifiers trained on synthetic rows, tested on real held-out rows.

Logistic regression (one-hot categories, standardised numbers) and gradient boosting
(scikit-learn's HistGradientBoostingClassifier, categories as native categorical features) are
fitted on the synthetic rows only (a CSV, a Parquet file, a folder of Parquet parts or a
glob: `dpsynth.evaluation.table_input`) and tested on the real held-out table: accuracy and
ROC-AUC (binary: of the second class's score; more classes: one-vs-rest macro average), mean ±
std over `seeds` (the classifiers' random state; logistic regression is deterministic, so its
std is 0).
The final model is reported, nothing is selected on the test rows. `--real-train SPEC` adds the
same classifiers trained on real rows, for reference (a non-private statistic of those rows).

Each table is read once (`dpsynth.evaluation.table_pass`), in memory or batch by batch: the
marginals are exact counts over every row, the classifiers (and the report's figures) use a
seeded uniform sample of at most `ml_rows` rows a table (every row of a smaller table), and
the result states the rows used (`classifier_rows`).

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
from collections.abc import Callable, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import numpy as np

from dpsynth.data.frames import is_frame
from dpsynth.data.schema import Schema
from dpsynth.data.schema_file import parse_schema, read_schema
from dpsynth.data.sources import DataInput
from dpsynth.data.table_codec import RawTable
from dpsynth.errors import DataError, UsageError
from dpsynth.evaluation.marginals import compare_counts
from dpsynth.evaluation.release import (
    record_evaluation_release,
    report_fingerprint,
    training_data_warnings,
)
from dpsynth.evaluation.table_classifiers import classifier_scores, table_frame
from dpsynth.evaluation.table_figures import check_table_report_dir, write_table_figures
from dpsynth.evaluation.table_input import TableInput, open_real, open_synthetic, synthetic_manifest
from dpsynth.evaluation.table_markdown import TABLE_METRICS, ml_metrics, render_table_markdown
from dpsynth.evaluation.table_pass import ML_ROWS, SAMPLE_RULE, SAMPLE_SEED, TablePass, read_pass
from dpsynth.evaluation.table_provenance import checked_manifest_privacy, schema_release_summary
from dpsynth.rundir import write_bytes_atomic

if TYPE_CHECKING:
    import pandas as pd

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


def check_columns(raw: RawTable, schema: Schema) -> None:
    """DataError naming the schema's columns (all but ignored ones) that the table lacks."""
    missing = [c.name for c in schema.columns if c.type != "ignored" and c.name not in raw.header]
    if missing:
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise DataError(
            f"{raw.source}: has no column {', '.join(map(repr, missing[:5]))}{more}, which the "
            "schema lists (the header must name every schema column that is not ignored)"
        )


def _real_table(
    spec: DataInput, schema: Schema | None, flag: str = "real"
) -> tuple[TableInput, Schema, str, str]:
    table, chosen, canonical, kind = open_real(spec, schema, flag)
    if chosen is None:
        named = spec if kind in ("builtin", "frame") or not isinstance(spec, str) else canonical
        named = "a DataFrame" if kind == "frame" else named
        raise UsageError(
            f"{{{flag}}} {named}: pass {{schema}} FILE.json (the table's public schema)",
            parameters=(flag, "schema"),
        )
    return table, chosen, canonical, kind


def _labelled(raw: RawTable, schema: Schema) -> tuple[pd.DataFrame, np.ndarray]:
    """A sample's features and labels, the rows whose target is not a class left out."""
    x, y = table_frame(raw, schema)
    keep = y >= 0
    return x[keep].reset_index(drop=True), y[keep]


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
    ml_rows: int = ML_ROWS,
    progress: Callable[[str, int, int], None] | None = None,
) -> dict[str, Any]:
    """Evaluate a synthetic table (a CSV, a Parquet file, a folder of Parquet parts or a glob
    of them, or a DataFrame as `Synthesizer.sample` returns) against a real held-out table
    (see the module docstring). The classifiers train on at most `ml_rows` synthetic rows and
    are tested on at most `ml_rows` real rows (seeded samples, `dpsynth.evaluation.table_pass`);
    `progress(stage, rows read, rows)` follows each table's pass."""
    wanted = parse_table_metrics(metrics)
    if real_train is not None and not ml_metrics(wanted):
        raise UsageError(
            "{real_train} is for the classifier metrics (accuracy, roc_auc, ml)",
            parameter="real_train",
        )
    if seeds < 1:
        raise UsageError(f"{{seeds}} must be at least 1, got {seeds}", parameter="seeds")
    if ml_rows < 2:
        raise UsageError(f"{{ml_rows}} must be at least 2, got {ml_rows}", parameter="ml_rows")
    if report_dir is not None:
        check_table_report_dir(Path(report_dir))
    in_memory = is_frame(synthetic)
    warnings_list: list[str] = []
    manifest: dict[str, Any] = {}
    if not in_memory:
        manifest, note = synthetic_manifest(synthetic)  # type: ignore[arg-type]
        warnings_list += [note] if note else []
    schema = None
    if schema_path is not None:
        schema = read_schema(schema_path)
    elif isinstance(manifest.get("schema"), dict):
        schema = parse_schema(manifest["schema"], f"{synthetic} manifest schema")
    real_in, schema, real_spec, real_kind = _real_table(real, schema)
    check_columns(real_in.head, schema)
    synth_in = open_synthetic(synthetic, schema)
    check_columns(synth_in.head, schema)
    synth_path = Path(synth_in.name)
    classifier_metrics = ml_metrics(wanted)
    sample_rows = ml_rows if classifier_metrics or report_dir is not None else 0

    def stage(name: str) -> Callable[[int, int], None] | None:
        return None if progress is None else lambda done, total: progress(name, done, total)

    def read(table: TableInput, stream: int, marginals: bool) -> TablePass:
        return read_pass(
            table,
            schema,
            marginals=marginals,
            max_rows=sample_rows,
            stream=stream,
            digest=stream > 0,  # the real tables' (the ledger's check)
            progress=stage(f"read {table.name}"),
        )

    real_pass = read(real_in, 1, "marginals" in wanted)
    synth_pass = read(synth_in, 0, "marginals" in wanted)
    real_digest = real_pass.digest or ""
    real_id = SimpleNamespace(spec=real_spec, dataset_id=real_spec, content_digest=real_digest)
    spent = training_data_warnings(real_id, ledger_path, "--real")  # type: ignore[arg-type]
    non_private = bool(spent)
    warnings_list += spent
    described = {column.name for column in schema.columns if column.type != "ignored"}
    unscored = [name for name in synth_in.header if name not in described]
    if unscored:
        shown = ", ".join(map(repr, unscored[:5])) + (" …" if len(unscored) > 5 else "")
        warnings_list.append(
            f"--synthetic {synth_path.name}: {len(unscored)} column(s) the schema does not "
            f"describe (or ignores) are not scored: {shown}"
        )
    result_metrics: dict[str, Any] = {}
    if synth_pass.counts is not None and real_pass.counts is not None:
        result_metrics["marginals"] = compare_counts(synth_pass.counts, real_pass.counts)
    n_synthetic, n_real = synth_pass.rows, real_pass.rows
    rows_used: dict[str, Any] | None = None
    if classifier_metrics:
        for name, found in (("real", real_pass), ("synthetic", synth_pass)):
            if found.outside:
                warnings_list.append(
                    f"{found.outside} {name} row(s) have a target outside the classes"
                )
        test, train = _labelled(real_pass.sample, schema), _labelled(synth_pass.sample, schema)
        n_synthetic, n_real = (
            synth_pass.rows - synth_pass.outside,
            real_pass.rows - real_pass.outside,
        )
        rows_used = {
            "synthetic": len(train[1]),
            "synthetic_of": n_synthetic,
            "real": len(test[1]),
            "real_of": n_real,
            "max_rows": ml_rows,
            "seed": SAMPLE_SEED,
            "rule": SAMPLE_RULE,
        }
        if len(np.unique(train[1])) < 2:
            warnings_list.append("the synthetic rows hold fewer than two classes: no classifier")
        result_metrics["classifiers"] = classifier_scores(
            train, test, schema, classifier_metrics, seeds
        )
    if real_train is not None:
        train_in, _, train_spec, train_kind = _real_table(real_train, schema, "real_train")
        check_columns(train_in.head, schema)
        train_pass = read(train_in, 2, False)
        train_rows = _labelled(train_pass.sample, schema)
        train_id = SimpleNamespace(
            spec=train_spec, dataset_id=train_spec, content_digest=train_pass.digest or ""
        )
        found = training_data_warnings(train_id, ledger_path, "--real-train")  # type: ignore[arg-type]
        non_private = non_private or bool(found)
        warnings_list += found
        result_metrics["real_train"] = train_spec
        result_metrics["real_train_classifiers"] = classifier_scores(
            train_rows, test, schema, classifier_metrics, seeds
        )
        if rows_used is not None:
            rows_used["real_train"] = len(train_rows[1])
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
        "synthetic": synth_in.name,
        "synthetic_source": "sample" if manifest else "frame" if in_memory else "file",
        "synthetic_layout": synth_in.layout,
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
        **({"classifier_rows": rows_used} if rows_used is not None else {}),
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
        figures = write_table_figures(folder, synth_pass.sample, real_pass.sample, schema)
        figures["rows"] = {"synthetic": synth_pass.sample.n, "real": real_pass.sample.n}
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
