"""Training time of the marginal table methods on census (issue 44, item 4), with the utility.

    python -m bench.tables_speed --methods aim mst --epsilon 10 [--runs 1] [--set key=value]

For each method, ε and run: `dpsynth train` on Census-Income KDD train (199,523 rows, δ = 1e-5,
the declared schema bench/census.schema.json, preset `small`) in a fresh process with
dpsynth's default threads (the environment's OMP_NUM_THREADS, unset unless the caller sets
it), timed (wall and CPU seconds, peak RSS) with the machine's load average before and after;
then `sample` of `--n` rows (default 20,000, the labels from the model) and `evaluate
--metrics ml,marginals --seeds 1` against the real test file (99,762 rows): 1-, 2- and 3-way
TVD, logistic regression and gradient boosting ROC-AUC. A training past `--timeout` wall
minutes is killed and recorded so. Runs go one at a time. Writes one JSON file (`--json`,
default bench/results/tables-speed-<date>.json): the date, the machine (bench/machine.py, with
the commit of the checkout), the command and one row per run.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import leaderboard, machine
from bench.measure import mb, run_measured

BENCH = Path(__file__).resolve().parent

RESULTS = BENCH / "results"
SCHEMA = BENCH / "census.schema.json"


def data_folder(given: Path | None) -> Path:
    """Where the census files are: `--shared`, `$DPSYNTH_DATA`, ../shared/data or /work/shared."""
    for candidate in (given, os.environ.get("DPSYNTH_DATA"), BENCH.parents[1] / "shared" / "data"):
        if candidate and (Path(candidate) / "census_income_kdd_train.csv.gz").is_file():
            return Path(candidate)
    return Path("/work/shared/data")


def cli(args: list[str], limit_s: float) -> tuple[dict[str, Any], Any]:
    """`dpsynth ARGS --json` with the caller's environment (default threads)."""
    done = run_measured([*leaderboard.CLI, *args, "--json"], limit_s, wall_limit_s=limit_s)
    if done.timed_out:
        return {}, done
    if done.returncode != 0:
        raise RuntimeError(f"dpsynth {shlex.join(args[:3])} failed: {done.stderr[-1500:]}")
    return json.loads(done.stdout), done


def one_run(
    method: str, epsilon: str, index: int, args: argparse.Namespace, folder: Path
) -> dict[str, Any]:
    """Train, sample and score one run; the row of the JSON."""
    data = data_folder(args.shared)
    run, ledger = folder / "run", folder / "ledger.jsonl"
    command = [
        "train", "--method", method, "--data", f"csv:{data / 'census_income_kdd_train.csv.gz'}",
        "--schema", str(SCHEMA), "--epsilon", epsilon, "--delta", "1e-5", "--preset", "small",
        "--out", str(run), "--ledger", str(ledger), "--device", "cpu", "--seed", str(index),
        "--quiet",
    ]  # fmt: skip
    for item in args.set or []:
        command += ["--set", item]
    row: dict[str, Any] = {"method": method, "epsilon": float(epsilon), "run": index}
    row["load_before"] = os.getloadavg()[0]
    trained, train = cli(command, args.timeout * 60)
    row["load_after"] = os.getloadavg()[0]
    row["train_peak_rss_mb"] = mb(train.peak_rss_mb)
    if train.timed_out:
        return row | {"timed_out": f"train killed after {args.timeout:g} wall minutes"}
    row |= {
        "train_seconds": round(train.seconds, 1),
        "train_cpu_seconds": round(train.cpu_seconds, 1),
        "epsilon_bound": trained["epsilon"],
        "steps": trained["steps"],
        "noise_multiplier": trained.get("noise_multiplier"),
    }
    synthetic = folder / "synth.csv"
    _, sampled = cli(
        ["sample", str(run), "--n", str(args.n), "--out", str(synthetic), "--device", "cpu",
         "--ledger", str(ledger), "--quiet"],
        args.timeout * 60,
    )  # fmt: skip
    row["sample_seconds"] = round(sampled.seconds, 1)
    report, _ = cli(
        ["evaluate", "--synthetic", str(synthetic), "--real",
         f"csv:{data / 'census_income_kdd_test.csv.gz'}", "--schema", str(SCHEMA),
         "--metrics", "ml,marginals", "--seeds", "1", "--ledger", str(ledger), "--quiet"],
        args.timeout * 60,
    )  # fmt: skip
    metrics = report["metrics"]
    marginals, classifiers = metrics["marginals"], metrics["classifiers"]
    row |= {f"tvd_{k}": round(marginals[k]["mean"], 4) for k in ("one_way", "two_way", "three_way")}
    row |= {f"{k}_roc_auc": round(v["roc_auc"]["mean"], 4) for k, v in classifiers.items()}
    return row


def main(argv: list[str] | None = None) -> None:
    """Run every setting one at a time and write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", nargs="+", default=["aim", "mst"])
    parser.add_argument("--epsilon", nargs="+", default=["10"])
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--set", action="append")
    parser.add_argument("--timeout", type=float, default=30.0, help="wall minutes per command")
    parser.add_argument("--shared", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    command = shlex.join(["python", "-m", "bench.tables_speed", *(argv or sys.argv[1:])])
    path = args.json or RESULTS / f"tables-speed-{datetime.now(UTC):%Y-%m-%d}.json"
    report: dict[str, Any] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine.describe("cpu"),
        "command": command,
        "data": "census-income-kdd: 199,523 train rows, 99,762 test rows, 41 attributes",
        "rows": [],
    }
    for method in args.methods:
        for epsilon in args.epsilon:
            for index in range(args.runs):
                with tempfile.TemporaryDirectory(prefix=f"speed-{method}-") as tmp:
                    row = one_run(method, epsilon, index, args, Path(tmp))
                print(json.dumps(row), flush=True)
                report["rows"].append(row)
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
