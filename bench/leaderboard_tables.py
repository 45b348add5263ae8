"""The leaderboard's table rows: the real-trained reference, one (method, ε) trained, sampled as
a CSV and scored by the classifiers, and K training runs combined into one row."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

from bench import leaderboard_runs as board
from bench.leaderboard_runs import _run_row, test_spec


def _table_schema(args: argparse.Namespace) -> Any:
    """The schema reading the test table: --schema, else the built-in table's own."""
    from dpsynth.data.schema_file import read_schema
    from dpsynth.data.sources import read_table

    return read_schema(args.schema) if args.schema else read_table(args.data)[2]


def majority_rate(args: argparse.Namespace) -> float:
    """The share of the test table's most common target class (the trivial accuracy)."""
    from collections import Counter

    from dpsynth.data.sources import read_table

    schema = _table_schema(args)
    raw = read_table(test_spec(args))[0]
    counts = Counter(raw.column(schema.target))
    return max(counts.values()) / sum(counts.values())


def _evaluate_table(
    csv: Path, args: argparse.Namespace, ledger: Path, seeds: int, metrics: str = "ml"
) -> dict:
    """`dpsynth evaluate --metrics METRICS` of a synthetic CSV against the held-out table."""
    command = [
        "evaluate", "--synthetic", str(csv), "--real", test_spec(args), "--metrics", metrics,
        "--seeds", str(seeds), "--ledger", str(ledger), "--quiet",
    ]  # fmt: skip
    if args.schema:
        command += ["--schema", str(args.schema)]
    evaluation, _ = board.run_cli(command)
    return evaluation


def _table_scores(evaluation: dict) -> dict[str, Any]:
    """The classifiers' scores (and, when measured, the mean 1-, 2- and 3-way marginal TVDs
    and each column's 1-way TVD) of a table evaluation."""
    scores = evaluation["metrics"]["classifiers"]
    out: dict[str, Any] = {}
    marginals = evaluation["metrics"].get("marginals")
    if marginals:
        for order in ("one_way", "two_way", "three_way"):
            out[f"tvd_{order}"] = marginals[order]["mean"]
        out["tvd_per_column"] = marginals["one_way"]["per_column"]
    for kind in ("logreg", "gbm"):
        for metric in ("accuracy", "roc_auc"):
            found = scores[kind][metric]
            out[f"{kind}_{metric}_mean"] = found["mean"]
            out[f"{kind}_{metric}_std"] = found["std"]
    out["warnings"] = evaluation.get("warnings", [])
    return out


def real_table_row(args: argparse.Namespace, seeds: int, metrics: str = "ml") -> dict[str, Any]:
    """The real-trained reference: the train table, written as a CSV, evaluated as synthetic
    (`metrics` as `evaluate --metrics`)."""
    import pandas as pd

    from dpsynth.data.sources import read_table

    raw = read_table(args.data)[0]
    with tempfile.TemporaryDirectory(prefix="leaderboard-real-") as tmp:
        csv = Path(tmp) / "real-train.csv"
        frame = pd.DataFrame({h: c for h, c in zip(raw.header, raw.columns, strict=True)})
        frame.to_csv(csv, index=False)
        evaluation = _evaluate_table(csv, args, Path(tmp) / "ledger.jsonl", seeds, metrics)
    return {"method": "real train data", "preset": None, "epsilon": None, "n": len(frame)} | (
        _table_scores(evaluation)
    )


def table_method_row(
    method: str, epsilon: str, args: argparse.Namespace, seeds: int, n: int
) -> dict[str, Any]:
    """Train, sample a CSV and evaluate one (method, ε) on a table in a fresh ledger."""
    preset = args.preset or "small"
    with tempfile.TemporaryDirectory(prefix=f"leaderboard-{method}-") as tmp:
        root = Path(tmp)
        ledger = root / "ledger.jsonl"
        command = [
            "train", "--method", method, "--data", args.data, "--epsilon", epsilon,
            "--preset", preset, "--out", str(root / "run"), "--device", args.device,
            "--ledger", str(ledger), "--quiet",
        ]  # fmt: skip
        if args.schema:
            command += ["--schema", str(args.schema)]
        if args.schema_public:
            command.append("--schema-public")
        for item in args.set or []:
            command += ["--set", item]
        trained, train_s = board.run_cli(command)
        sampled, sample_s = board.run_cli(
            ["sample", str(root / "run"), "--n", str(n), "--out", str(root / "synth.csv"),
             "--device", args.device, "--ledger", str(ledger), "--quiet"]
        )  # fmt: skip
        evaluation = _evaluate_table(root / "synth.csv", args, ledger, seeds)
    row = _run_row(method, preset, epsilon, args, (trained, train_s), (sampled, sample_s))
    return row | _table_scores(evaluation)


SCORE_KEYS = ("logreg_accuracy", "logreg_roc_auc", "gbm_accuracy", "gbm_roc_auc")


def combine_runs(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One row from K training runs: each score's mean ± std over the runs' means (training
    runs differ in their secret batches and noise; classifier seeds barely move a score)."""
    import numpy as np

    if len(runs) == 1:
        return runs[0] | {"runs": 1}
    row = dict(runs[0]) | {"runs": len(runs), "per_run": runs}
    row["train_seconds"] = round(float(np.mean([r["train_seconds"] for r in runs])), 1)
    for key in SCORE_KEYS:
        values = [r[f"{key}_mean"] for r in runs]
        row[f"{key}_mean"] = float(np.mean(values))
        row[f"{key}_std"] = float(np.std(values))
    return row
