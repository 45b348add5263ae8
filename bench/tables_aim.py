"""Benchmark AIM and MST on tables: train → sample → ML metric and 2-way TVD, time and memory.

Usage: python -m bench.tables_aim [--data german,census] [--eps 1,10] [--methods aim,mst]
                                  [--runs 1] [--preset small] [--set key=value ...]
                                  [--n ROWS] [--labels model] [--json OUT]

- german: the built-in `german-credit` (800 train rows, δ = 1e-4), tested on
  `german-credit:test`.
- census: Census-Income KDD train (199,523 rows, δ = 1e-5) under
  `bench/census.schema.json`, tested on the real test file (99,762 rows); the data
  folder is `$DPSYNTH_DATA` or `../shared/data` beside the repository (or `/work/shared/data`).
Each run trains in its own process (`dpsynth train`), so that its wall time and peak RSS
(VmHWM) are its own; then `sample` writes as many rows as the training set (labels drawn from
the model's own class proportions, `--labels model`), and the synthetic rows are scored by
`evaluate --metrics ml` (logistic regression and gradient boosting ROC-AUC on the real test
rows) and by the mean total variation distance of all 2-way marginals against the real test
rows (numbers in 10 equal bins over their public schema range; computed here, as
`evaluate --metrics marginals` is not on this branch).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.machine import describe
from dpsynth.data.schema import Schema
from dpsynth.data.schema_file import read_schema
from dpsynth.data.table_codec import read_csv_table
from dpsynth.evaluation.table_report import run_table_evaluation

REPO = Path(__file__).resolve().parents[1]

DELTA = {"german": 1e-4, "census": 1e-5}


def data_folder() -> Path:
    """Where the real tables are."""
    for candidate in (os.environ.get("DPSYNTH_DATA"), REPO.parent / "shared" / "data"):
        if candidate and Path(candidate).is_dir():
            return Path(candidate)
    return Path("/work/shared/data")


def specs(name: str) -> tuple[str, str, Path | None]:
    """(train spec, test spec, schema path) of a benchmark table."""
    if name == "german":
        return "german-credit", "german-credit:test", None
    folder = data_folder()
    return (
        f"csv:{folder / 'census_income_kdd_train.csv.gz'}",
        f"csv:{folder / 'census_income_kdd_test.csv.gz'}",
        REPO / "bench" / "census.schema.json",
    )


def binned(raw_columns: dict[str, np.ndarray], schema: Schema) -> dict[str, np.ndarray]:
    """Every used column as integer codes: categories by list index, numbers in 10 bins."""
    out = {}
    for column in schema.columns:
        if column.type == "ignored":
            continue
        values = raw_columns[column.name]
        if column.type == "categorical":
            lookup = {c: i for i, c in enumerate(column.categories)}
            out[column.name] = np.array([lookup.get(v, -1) for v in values.tolist()])
        else:
            low, high = float(column.min), float(column.max)
            x = np.clip(values.astype(np.float64), low, high)
            unit = (x - low) / (high - low) if high > low else np.zeros_like(x)
            out[column.name] = np.minimum(np.floor(unit * 10), 9).astype(np.int64)
    return out


def two_way_tvd(synthetic: Path, real_spec: str, schema: Schema) -> float:
    """Mean TVD over all pairs of used columns between the synthetic and real rows."""
    from dpsynth.data.sources import read_table

    real_raw = read_table(real_spec)[0]
    synth_raw = read_csv_table(synthetic)
    real = binned({h: real_raw.column(h) for h in real_raw.header}, schema)
    synth = binned({h: synth_raw.column(h) for h in synth_raw.header}, schema)
    names = list(real)
    tvds = []
    for a, b in itertools.combinations(names, 2):
        size_b = int(max(real[b].max(), synth[b].max())) + 2
        pr = np.bincount((real[a] + 1) * size_b + real[b] + 1) / len(real[a])
        ps = np.bincount((synth[a] + 1) * size_b + synth[b] + 1) / len(synth[a])
        width = max(len(pr), len(ps))
        pr, ps = np.pad(pr, (0, width - len(pr))), np.pad(ps, (0, width - len(ps)))
        tvds.append(0.5 * np.abs(pr - ps).sum())
    return float(np.mean(tvds))


def train_measured(args: list[str]) -> tuple[float, float, dict]:
    """Run `dpsynth train` in a fresh process: (wall seconds, peak RSS MB, its JSON)."""
    driver = (
        "import json,sys;from dpsynth.cli import main\nsys.argv=['dpsynth',*sys.argv[1:]]\n"
        "try:\n    main()\nexcept SystemExit as e:\n    code=e.code\nelse:\n    code=0\n"
        "hwm=[l for l in open('/proc/self/status') if l.startswith('VmHWM')][0].split()[1]\n"
        "sys.stderr.write(f'VMHWM {hwm}\\n');sys.exit(code)"
    )
    start = time.time()
    done = subprocess.run(
        [sys.executable, "-c", driver, "train", *args, "--json"],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")},
    )
    wall = time.time() - start
    if done.returncode != 0:
        raise SystemExit(f"train failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    hwm = next(line for line in done.stderr.splitlines() if line.startswith("VMHWM"))
    return wall, int(hwm.split()[1]) / 1024, json.loads(done.stdout)


def one_run(
    data: str, method: str, epsilon: float, preset: str, sets: list[str], n: int | None,
    labels: str, folder: Path, index: int,
) -> dict:  # fmt: skip
    """Train, sample and score one setting."""
    from dpsynth.sampling import sample_table

    train_spec, test_spec, schema_path = specs(data)
    run = folder / f"{data}-{method}-eps{epsilon:g}-{index}"
    ledger = folder / f"ledger-{data}-{method}-{epsilon:g}-{index}.jsonl"
    args = [
        "--method", method, "--data", train_spec, "--epsilon", str(epsilon),
        "--delta", str(DELTA[data]), "--out", str(run), "--ledger", str(ledger),
        "--preset", preset, "--device", "cpu", "--seed", str(index),
    ]  # fmt: skip
    if schema_path is not None:
        args += ["--schema", str(schema_path)]
    for item in sets:
        args += ["--set", item]
    wall, rss, summary = train_measured(args)
    rows = n or int(json.loads((run / "config.json").read_text())["data"]["n"])
    synthetic = folder / f"{run.name}.csv"
    start = time.time()
    sample_table(run, rows, synthetic, labels=labels, seed=index, ledger_path=ledger, device="cpu")
    sample_s = time.time() - start
    result = run_table_evaluation(
        synthetic=str(synthetic), real=test_spec, metrics=["ml"], seeds=1, ledger_path=ledger
    )
    if schema_path is not None:
        schema = read_schema(schema_path)
    else:
        from dpsynth.data.builtin_tables import TABLE_BUILTINS

        schema = TABLE_BUILTINS["german-credit"].schema()
    scores = {
        kind: round(values["roc_auc"]["mean"], 4)
        for kind, values in result["metrics"]["classifiers"].items()
    }
    return {
        "data": data, "method": method, "epsilon": epsilon, "preset": preset, "sets": sets,
        "run": index, "train_s": round(wall, 1), "train_peak_rss_mb": round(rss),
        "sample_s": round(sample_s, 1), "rows": rows, "epsilon_bound": summary.get("epsilon"),
        "tvd2": round(two_way_tvd(synthetic, test_spec, schema), 4), "ml": scores,
    }  # fmt: skip


def main() -> None:
    """Parse the flags, run every setting, print a table and write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="german")
    parser.add_argument("--eps", default="1,10")
    parser.add_argument("--methods", default="aim,mst")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--preset", default="small")
    parser.add_argument("--set", action="append", default=[], dest="sets")
    parser.add_argument("--n", type=int, default=None)
    parser.add_argument("--labels", default="model")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for data, method, eps, index in itertools.product(
            args.data.split(","), args.methods.split(","),
            [float(e) for e in args.eps.split(",")], range(args.runs),
        ):  # fmt: skip
            row = one_run(
                data, method, eps, args.preset, args.sets, args.n, args.labels, Path(tmp), index
            )
            results.append(row)
            auc = "  ".join(f"{k} AUC {v:.3f}" for k, v in row["ml"].items())
            print(
                f"{data:7s} {method:4s} ε={eps:<4g} run {index}: 2-way TVD {row['tvd2']:.4f}  "
                f"{auc}  train {row['train_s']} s, "
                f"{row['train_peak_rss_mb']} MB; sample {row['sample_s']} s",
                flush=True,
            )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        record = {"machine": describe(), "command": " ".join(sys.argv), "results": results}
        args.json.write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
