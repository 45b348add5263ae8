"""Benchmark DP-Kernel on tables: train → sample → evaluate, logistic-regression ROC-AUC.

Usage: python -m bench.tables [--data german|census] [--eps 1,10] [--preset small]
                              [--set key=value ...] [--n 2000] [--json OUT]
                              [--weights declared|none|dp] [--weights-share 0.02]
                              [--sample-labels weights,balanced]

- german: the built-in `german-credit` (800 train rows), tested on `german-credit:test`.
- census: `csv:../shared/data/census_income_kdd_train.csv.gz` (199,523 rows) with a schema
  drafted from it, `instance_weight` ignored and the drafted entries declared public (the
  benchmark's assumption: the UCI documentation publishes the category lists, ranges and the
  income shares, given as the target's `weights`);
  tested on the real test file (99,762 rows). Skipped when the file is absent.
  `--weights none` drops the target's weights (balanced labels in training and sampling);
  `--weights dp` drops them and releases them with `--class-weights-epsilon`
  (share × ε of each run's total ε).
Each setting: one training run per ε through the library (`train_run`, `sample_table`,
`run_table_evaluation`), printing logistic regression and gradient boosting accuracy and
ROC-AUC of the synthetic-trained models beside the real-trained ones.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from dpsynth.data.schema_draft import draft_schema
from dpsynth.data.table_codec import read_csv_table
from dpsynth.evaluation.table_report import run_table_evaluation
from dpsynth.sampling import sample_table
from dpsynth.training import train_run

REPO = Path(__file__).resolve().parents[1]

CENSUS = REPO.parent / "shared" / "data"


def census_schema(folder: Path, weights: bool = True) -> Path:
    """A schema for Census-Income KDD: drafted, instance_weight ignored, declared public
    (the income shares declared as the target's `weights` unless `weights` is False)."""
    path = folder / "census.schema.json"
    raw = read_csv_table(CENSUS / "census_income_kdd_train.csv.gz")
    schema = draft_schema(raw.header, raw.columns, "income").to_json()
    income = raw.column("income")
    for column in schema["columns"]:
        column.pop("source", None)
        if column["name"] == "income" and weights:
            # public: the survey's published income distribution (here: the file's shares)
            column["weights"] = [float((income == c).mean()) for c in column["categories"]]
        if column["name"] == "instance_weight":
            for key in ("min", "max", "categories"):
                column.pop(key, None)
            column["type"] = "ignored"
    schema.pop("notes", None)
    path.write_text(json.dumps(schema, indent=1))
    return path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", choices=("german", "census"), default="german")
    parser.add_argument("--eps", default="1,10")
    parser.add_argument("--preset", default="small")
    parser.add_argument("--set", action="append", default=[])
    parser.add_argument("--n", type=int, default=None, help="synthetic rows (default: as train)")
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--json", default=None)
    parser.add_argument("--weights", choices=("declared", "none", "dp"), default="declared")
    parser.add_argument("--weights-share", type=float, default=0.02)
    parser.add_argument(
        "--sample-labels",
        default="balanced",
        help="sample's --labels rules to evaluate, e.g. weights,balanced",
    )
    args = parser.parse_args()
    overrides = dict(item.split("=", 1) for item in args.set)
    folder = Path(tempfile.mkdtemp(prefix="dpsynth-bench-tables-"))
    if args.data == "german":
        data, real, real_train, schema, n = (
            "german-credit", "german-credit:test", "german-credit", None, 800,
        )  # fmt: skip
    else:
        if not (CENSUS / "census_income_kdd_train.csv.gz").is_file():
            print(f"skipped: {CENSUS} has no Census-Income KDD files")
            return
        schema = census_schema(folder, weights=args.weights == "declared")
        data = f"csv:{CENSUS / 'census_income_kdd_train.csv.gz'}"
        real = f"csv:{CENSUS / 'census_income_kdd_test.csv.gz'}"
        real_train, n = data, 20000
    n = args.n or n
    rows = []
    for index, eps in enumerate(args.eps.split(",")):
        start = time.time()
        run = folder / f"run-{eps}"
        summary = train_run(
            method="dpkernel", data=data, epsilon=eps, preset=args.preset, out=run,
            ledger_path=folder / f"ledger-{eps}.jsonl", device="cpu", overrides=overrides,
            schema=schema, schema_public=schema is not None,
            class_weights_epsilon=(
                args.weights_share * float(eps) if args.weights == "dp" else None
            ),
        )  # fmt: skip
        trained = time.time() - start
        for which, labels in enumerate(args.sample_labels.split(",")):
            out = folder / f"synth-{eps}-{labels}.csv"
            sample_table(run, n, out, labels=labels, ledger_path=folder / f"ledger-{eps}.jsonl",
                         device="cpu")  # fmt: skip
            result = run_table_evaluation(
                synthetic=str(out), real=real, metrics=["ml"], seeds=args.seeds,
                real_train=real_train if index == 0 and which == 0 else None,
                schema_path=schema,
            )  # fmt: skip
            metrics = result["metrics"]
            row = {
                "epsilon": eps,
                "train_s": round(trained, 1),
                "sigma": summary["noise_multiplier"],
                "weights": args.weights,
                "sample_labels": labels,
                "class_weights": (summary.get("schema_release") or {}).get("class_weights"),
                "synthetic": metrics["classifiers"],
                "real_train": metrics.get("real_train_classifiers"),
            }
            rows.append(row)
            syn = metrics["classifiers"]
            line = (
                f"eps={eps} weights={args.weights} sample={labels} train {trained:.0f}s "
                f"sigma={summary['noise_multiplier']:.3g}  logreg auc "
                f"{syn['logreg']['roc_auc']['mean']:.4f} acc "
                f"{syn['logreg']['accuracy']['mean']:.4f}  gbm auc "
                f"{syn['gbm']['roc_auc']['mean']:.4f}"
            )
            if row["class_weights"]:
                line += f"  released weights {row['class_weights']['weights']}"
            if row["real_train"]:
                ref = row["real_train"]
                line += (
                    f"  | real logreg auc {ref['logreg']['roc_auc']['mean']:.4f} acc "
                    f"{ref['logreg']['accuracy']['mean']:.4f} gbm auc "
                    f"{ref['gbm']['roc_auc']['mean']:.4f}"
                )
            print(line, flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"data": args.data, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
