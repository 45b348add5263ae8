"""`dpsynth evaluate`: FID and downstream accuracy against held-out real data."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

import typer

from dpsynth.cli.app import app, handle_errors, resolve_ledger_path, threads_option
from dpsynth.cli.options import ChannelsOpt, ClassesOpt, DeviceOpt, JsonOpt, LedgerOpt, QuietOpt
from dpsynth.cli.render import (
    emit_json,
    print_kv,
    print_warnings,
    progress_bar,
    show_progress,
)


@app.command()
@handle_errors
@threads_option
def evaluate(
    synthetic: Annotated[
        str,
        typer.Option(
            help="A folder written by `sample` (class sub-folders) or a run dir; a table: a CSV, "
            "a Parquet file, a folder of Parquet parts (a partitioned release) or a glob."
        ),
    ],
    real: Annotated[
        str,
        typer.Option(help="Held-out real data spec, e.g. digits:test, csv:FILE, parquet:DIR."),
    ],
    metrics: Annotated[
        str,
        typer.Option(
            help="Comma list: fid, accuracy, precision, recall; tables: accuracy, roc_auc, ml, "
            "marginals; auto: fid,accuracy for images, ml,marginals for tables."
        ),
    ] = "auto",
    classifier: Annotated[str, typer.Option(help="cnn or logreg.")] = "cnn",
    seeds: Annotated[int, typer.Option(help="Classifier seeds (mean and std).")] = 3,
    n: Annotated[
        int | None, typer.Option("--n", help="Synthetic images to use (or to draw from a run).")
    ] = None,
    fid_n: Annotated[
        int | None,
        typer.Option(
            "--fid-n",
            help="FID, precision and recall on this many of the synthetic images (a "
            "public-seeded draw; default: all). Compare FIDs only at the same n.",
        ),
    ] = None,
    report: Annotated[
        Path | None, typer.Option(help="Write report.json/.md and PNGs here.")
    ] = None,
    inception_weights: Annotated[
        Path | None, typer.Option(help="TorchScript TF-Inception weights file.")
    ] = None,
    cache_real_features: Annotated[
        bool,
        typer.Option(
            "--cache-real-features",
            help="Keep the real images' Inception features for the next evaluation (per-record "
            "features of the real data, files 0600 in $DPSYNTH_CACHE_DIR/fid, else "
            "~/.cache/dpsynth/fid; `dpsynth cache clear` removes them). Default: nothing kept.",
        ),
    ] = False,
    real_train: Annotated[
        str | None, typer.Option(help="Real training spec for the upper-bound accuracy.")
    ] = None,
    schema: Annotated[
        Path | None,
        typer.Option(help="Tables: the schema reading --real [default: the sample's or built-in]."),
    ] = None,
    ml_rows: Annotated[
        int | None,
        typer.Option(
            "--ml-rows",
            help="Tables: the classifiers train on a seeded sample of at most this many "
            "synthetic rows and are tested on at most this many real rows [default: 100000].",
        ),
    ] = None,
    classes: ClassesOpt = None,
    channels: ChannelsOpt = None,
    device: DeviceOpt = "auto",
    ledger: LedgerOpt = None,
    as_json: JsonOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """FID and downstream accuracy of synthetic images against held-out real data; for tables
    (--real csv:FILE or german-credit:test), logistic regression and gradient boosting trained
    on the synthetic CSV: accuracy and ROC-AUC (--metrics accuracy,roc_auc or ml), and the
    total variation distance of its 1-, 2- and 3-way marginals to the real rows (marginals)."""
    from dpsynth.api import evaluate as evaluate_api
    from dpsynth.data.sources import parse_classes

    show = show_progress(quiet, as_json)
    with progress_bar(show, "evaluate") as bar:
        tasks: dict[str, Any] = {}

        def on_progress(stage: str, done: int, total: int) -> None:
            if bar is None:
                return
            if stage not in tasks:
                tasks[stage] = bar.add_task(stage, total=total, info="")
            bar.update(tasks[stage], completed=done, total=total)

        result = evaluate_api(
            synthetic,
            real,
            metrics=[m.strip() for m in metrics.split(",") if m.strip()],
            classifier=classifier,
            seeds=seeds,
            n=n,
            fid_n=fid_n,
            report=report,
            inception_weights=inception_weights,
            device=device,
            real_train=real_train,
            classes=parse_classes(classes),
            channels=channels,
            ledger=resolve_ledger_path(ledger),
            progress=on_progress,
            schema=schema,
            cache_real_features=cache_real_features,
            **({"ml_rows": ml_rows} if ml_rows is not None else {}),
        ).to_json()
    if as_json:
        emit_json(result)
        return
    if result.get("modality") == "table":
        _render_table(result)
        return
    print_warnings(list(result.get("warnings", [])))
    rows: list[tuple[str, Any]] = [("synthetic", result.get("synthetic")), ("real", real)]
    if result.get("non_private"):
        rows.append(("privacy", "NOT PRIVATE: evaluated on data a DP run spent budget on"))
    found = result.get("metrics", {})
    if "fid" in found:
        fid = found["fid"]
        rows.append(
            (
                "FID",
                f"{fid['value']:.3f} (n={fid.get('n_synthetic')} synthetic vs "
                f"{fid.get('n_real')} real from {fid.get('reference', real)}"
                f"{'; real features from the cache' if fid.get('real_features_cached') else ''})",
            )
        )
    for key in ("precision", "recall"):
        if key in found:
            rows.append((key, f"{found[key]['value']:.3f}"))
    if "accuracy" in found:
        acc = found["accuracy"]
        rows.append(
            (
                f"accuracy ({acc.get('classifier')})",
                f"{acc['mean']:.4f} ± {acc['std']:.4f} over {len(acc.get('per_seed', []))} seeds",
            )
        )
        if acc.get("real_train_accuracy") is not None:
            rows.append(("accuracy, real-trained", f"{acc['real_train_accuracy']:.4f}"))
    if result.get("report_dir"):
        rows.append(("report", os.path.join(str(result["report_dir"]), "report.md")))
    print_kv("evaluate", rows)


def _render_table(result: dict[str, Any]) -> None:
    from dpsynth.evaluation.table_markdown import (
        fmt_score,
        marginal_rows,
        ml_metrics,
        rows_line,
        score_rows,
    )

    print_warnings(list(result.get("warnings", [])))
    rows: list[tuple[str, Any]] = [
        ("synthetic", f"{result['synthetic']} ({result['n_synthetic']} rows)"),
        ("real", f"{result['real']} ({result['real_n']} rows), target {result['target']}"),
    ]
    if result.get("privacy"):
        rows.append(("privacy", result["privacy"]))
    if result.get("non_private"):
        rows.append(("privacy", "NOT PRIVATE: evaluated on data a DP run spent budget on"))
    if result.get("synthetic_layout"):
        rows[0] = ("synthetic", f"{rows[0][1]}, {result['synthetic_layout']}")
    if rows_line(result):
        rows.append(("classifier rows", rows_line(result)))
    for trained, kind, values in score_rows(result):
        for metric in ml_metrics(result["metrics_requested"]):
            rows.append((f"{metric}, {kind} trained on {trained}", fmt_score(values[metric])))
    rows += marginal_rows(result)
    if result.get("report_dir"):
        rows.append(("report", os.path.join(str(result["report_dir"]), "report.md")))
    print_kv("evaluate", rows)
