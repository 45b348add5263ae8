"""The peer dpmm's MST and AIM, with its own DP preprocessing, on bench/tables_real.py's tables.

Issue 68: the same splits, scored with the same metrics as dpsynth's runs there.

    python -m bench.tables_dpmm                                  # the WIDE tables, mst aim, ε 1
    python -m bench.tables_dpmm --data loans --methods mst       # quick
    python -m bench.tables_dpmm --data ames --epsilon 1 10 --timeout 30

Data: the tables of bench/real_tables.py (default WIDE: loans, ames, reddit-finance,
labor-market, hhs-breaches), split by the same function as bench/tables_real.py into the same
WORK/NAME/{train,holdout}.csv (default WORK /tmp/dpsynth-tables-real, shared with it).

dpmm (pip `dpmm==0.1.9`) pins numpy 1.26, pandas 2.1 and Python < 3.12, so it gets its own
virtual environment, ~/.cache/dpsynth-bench/dpmm-venv (`--venv`), created on first use with a
python3.11 or python3.10 found on PATH and `pip install dpmm==0.1.9` (from the package
registry; `--no-install` refuses instead). Per table, method and ε, one at a time, a child
process in that venv (bench/dpmm_child.py) reads the training CSV as a dpmm user would and
runs dpmm's pipeline with its defaults, no domain given: no bounds, no category lists
(dpmm's PrivTree binner finds the numbers' bounds and bins with DP; it reads category lists,
the columns with empty cells and the constant columns off the data, which no ε covers: dpmm
logs a "PrivacyLeakage" warning per category list). What the child drops: the columns the
bench counts as identifiers, free text or excluded (a user would not hand them to a marginal
model; they are written empty). Dates are given as datetimes, the target as labels. The
pipelines' other defaults stay: domain compression on, `n_jobs` −1 (cores − 1: one process on
a 2-core machine), MST's 5,000 and AIM's 1,000 inference iterations, AIM's 16 rounds per
column and no model-size limit for AIM (the pipeline passes max_model_size=None, where AIM's
own class defaults to 80 MB; `--max-model-size` sets one). `--seed` seeds dpmm's RandomState,
but the binner's Laplace noise comes from OpenDP, unseeded: reruns differ, down to whether the
bounds are found.

Budget: the total ε of a cell is `--epsilon`, split as dpmm splits it, by sequential
composition: `proc_epsilon` = share × ε for the binner (pure ε-DP, dpmm's default share of
0.1 at ε = 1; divided over the numeric columns) and ε − proc_epsilon for the model (zCDP
converted to (ε, δ) by dpmm's cdp_rho), at δ = dpsynth's default for the training rows
(dpsynth.privacy.accounting.calibration.default_delta: the largest power of ten ≤ 1/(10 N)).
When the binner finds no bounds for a column (too little ε per column: dpmm's approx_bounds
returns None, and the binner fails with "int() argument must be ... not 'NoneType'" for an
integer column, or takes NaN bounds for a float column and fails with "Bin labels must be one
fewer than the number of bin edges"), the cell is retried with the next preprocessing share of
`--proc-shares` (default 0.1, 0.5, 0.9), as a user would raise proc_epsilon; every attempt is
recorded.

The child generates as many rows as the training split (`--n`), timed (start-up and load, fit,
generate: wall and CPU seconds; the whole child's wall, CPU and peak RSS), under `--timeout`
wall minutes (killed past it: recorded as a timeout). The synthetic rows are scored here with
bench/tables_real.py's `score` (bench/real_metrics.py: missing rates, 1- and 2-way TVD against
the held-out rows with the real training rows' floor, logistic regression and gradient
boosting ROC-AUC with the real-train baseline, identifier and free-text matches, the worst
"(other)" share, which is 0 for dpmm: it has no other category). A failure's text is the
cell's record. Results are merged (a cell of the same table, method and ε replaced) into
OUT/dpmm.json and written as OUT/dpmm.md (default OUT: bench/results/<date>-tables-wide), with
the date, machine, commit and command (`--rewrite` writes the page again from the JSON).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import machine, real_tables
from bench.cli_runner import uptime
from bench.measure import mb, run_measured
from bench.tables_dpmm_report import NO_BOUNDS, markdown
from bench.tables_real_cells import describe_table, real_facts, score
from dpsynth.privacy.accounting.calibration import default_delta

BENCH = Path(__file__).resolve().parent
RESULTS = BENCH / "results"
CHILD = BENCH / "dpmm_child.py"
VENV = Path.home() / ".cache" / "dpsynth-bench" / "dpmm-venv"
PACKAGE = "dpmm==0.1.9"
PYTHONS = ("python3.11", "python3.10")


def base_python() -> str:
    """A Python dpmm installs on (3.10 or 3.11), found on PATH."""
    for name in PYTHONS:
        found = shutil.which(name)
        if not found:
            continue
        done = subprocess.run(
            [found, "-c", "import sys; print(sys.version_info[:2] < (3, 12))"],
            capture_output=True,
            text=True,
        )
        if done.returncode == 0 and done.stdout.strip() == "True":
            return found
    raise RuntimeError(f"dpmm needs Python 3.10 or 3.11: none of {', '.join(PYTHONS)} on PATH")


def venv_python(venv: Path, install: bool) -> Path:
    """The dpmm venv's Python, creating the venv and installing dpmm first when it is not
    there yet (once, a minute or two) unless `install` is false."""
    python = venv / "bin" / "python"
    done = subprocess.run(
        [str(python), "-c", "from importlib.metadata import version; print(version('dpmm'))"],
        capture_output=True,
        text=True,
    ) if python.is_file() else None  # fmt: skip
    if done is not None and done.returncode == 0 and done.stdout.strip() == PACKAGE.split("==")[1]:
        return python
    command = f"{base_python()} -m venv {venv} && {python} -m pip install {PACKAGE}"
    if not install:
        raise RuntimeError(f"no {PACKAGE} in {venv}: run `{command}` (or drop --no-install)")
    print(f"creating {venv} with {PACKAGE} (once)", file=sys.stderr, flush=True)
    subprocess.run([base_python(), "-m", "venv", str(venv)], check=True)
    with (venv / "install.log").open("w") as log:  # pip's notes stay out of the bench's output
        installed = subprocess.run(
            [str(python), "-m", "pip", "install", PACKAGE], stdout=log, stderr=subprocess.STDOUT
        )
    if installed.returncode != 0:
        raise RuntimeError(f"pip install {PACKAGE} failed: see {venv / 'install.log'}")
    return python


def child_env() -> dict[str, str]:
    """The environment of the child: this one without PYTHONPATH (the venv stays alone)."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}


def attempt(
    python: Path,
    args: argparse.Namespace,
    table: real_tables.RealTable,
    real: dict[str, Any],
    method: str,
    epsilon: float,
    delta: float,
    share: float,
    folder: Path,
) -> dict[str, Any]:
    """One child run at one preprocessing share: its timings, or its error text."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    kinds = real["kinds"]
    dropped = [c for c, k in kinds.kind.items() if k in ("id", "text", "exclude")]
    proc_epsilon = share * epsilon
    command = [
        str(python), "-u", str(CHILD), "--train", str(real["train_path"]), "--method", method,
        "--epsilon", repr(epsilon - proc_epsilon), "--proc-epsilon", repr(proc_epsilon),
        "--delta", repr(delta), "--n", str(real["n"]), "--target", table.target,
        "--drop", json.dumps(dropped), "--dates", json.dumps(kinds.dates),
        "--seed", str(args.seed), "--n-jobs", str(args.n_jobs),
        "--out", str(folder / "synth.csv"), "--info", str(folder / "info.json"),
        "--domain", str(folder / "domain.json"),
    ]  # fmt: skip
    if args.max_model_size is not None:
        command += ["--max-model-size", repr(args.max_model_size)]
    limit = args.timeout * 60
    load = uptime()
    label = f"[{table.name} dpmm-{method} ε={epsilon:g} proc share {share:g}]"
    print(f"{label} {load}", file=sys.stderr, flush=True)
    done = run_measured(command, limit * (os.cpu_count() or 1), env=child_env(), wall_limit_s=limit)
    out: dict[str, Any] = {
        "proc_share": share,
        "proc_epsilon": proc_epsilon,
        "model_epsilon": epsilon - proc_epsilon,
        "dropped": dropped,
        "command": shlex.join(command),
        "uptime_before": load,
        "seconds": round(done.seconds, 1),
        "cpu_seconds": round(done.cpu_seconds, 1),
        "peak_rss_mb": mb(done.peak_rss_mb),
        "timed_out": done.timed_out,
        "uptime_after": uptime(),
    }
    progress = re.findall(r"estimate (\d+) start (\d+) s", done.stdout)
    if progress:
        out["progress"] = {"inferences_started": int(progress[-1][0]),
                           "last_started_at_s": int(progress[-1][1])}  # fmt: skip
    if done.timed_out:
        return out | {"error": f"dpmm-{method}: did not finish in {args.timeout:g} wall min"}
    if done.returncode != 0:
        text = done.stderr.strip()
        lines = [x for x in text.splitlines() if "PrivacyLeakage" not in x]
        last = lines[-1] if lines else ""
        return out | {
            "error": f"dpmm-{method} failed (exit {done.returncode}): {last}",
            "traceback": "\n".join(lines)[-1500:],
            "no_bounds": bool(NO_BOUNDS.search(text)),
        }
    info = json.loads((folder / "info.json").read_text())
    out["info"] = {k: v for k, v in info.items() if k != "log"}
    out["log_tail"] = [x for x in info.get("log", []) if "PrivacyLeakage" not in x][-10:]
    for key in ("startup_and_load", "fit", "generate"):
        out[f"{key}_seconds"] = round(info[f"{key}_seconds"], 1)
        out[f"{key}_cpu_seconds"] = round(info[f"{key}_cpu_seconds"], 1)
    return out


def run_cell(
    python: Path,
    args: argparse.Namespace,
    table: real_tables.RealTable,
    real: dict[str, Any],
    method: str,
    epsilon: str,
) -> dict[str, Any]:
    """One method at one ε on one table: the attempts up the preprocessing shares until one
    fits, then its synthetic rows scored; errors become the cell's record."""
    eps = float(epsilon)
    delta = default_delta(len(real["train"]))
    cell: dict[str, Any] = {
        "data": table.name,
        "method": f"dpmm-{method}",
        "epsilon": epsilon,
        "delta": delta,
        "attempts": [],
    }
    folder = args.work / table.name / "dpmm" / f"{method}-eps{epsilon}"
    for share in args.proc_shares:
        tried = attempt(python, args, table, real, method, eps, delta, share, folder)
        keys = ("proc_share", "seconds", "error", "no_bounds")
        cell["attempts"].append({k: tried.get(k) for k in keys})
        if not tried.get("no_bounds"):
            break
    cell |= {k: v for k, v in tried.items() if k != "no_bounds"}
    if "error" in tried:
        return cell
    try:
        synthetic = real_tables.read_strings(folder / "synth.csv")
        schema = {"path": str(folder / "domain.json")}
        cell["metrics"] = score(real, synthetic, schema, args)
    except Exception as exc:  # a metric's failure is the cell's record
        cell["error"] = f"metrics failed: {type(exc).__name__}: {exc}"
    return cell


def place(cell: dict[str, Any]) -> tuple[str, str, float]:
    return cell["data"], cell["method"], float(cell["epsilon"])


def write(report: dict[str, Any], folder: Path) -> dict[str, Any]:
    """Merge into folder/dpmm.json (a cell of the same place replaced); write dpmm.md."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "dpmm.json"
    merged = dict(report)
    if path.is_file():
        old = json.loads(path.read_text())
        mine = {place(c) for c in report["cells"]}
        merged["cells"] = [c for c in old["cells"] if place(c) not in mine] + report["cells"]
        merged["tables"] = old["tables"] | report["tables"]
        merged["commands"] = list(dict.fromkeys(old["commands"] + report["commands"]))
    merged["cells"] = sorted(merged["cells"], key=place)
    path.write_text(json.dumps(merged, indent=1, default=str) + "\n")
    (folder / "dpmm.md").write_text(markdown(merged))
    return merged


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    known = real_tables.tables()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", nargs="+", choices=sorted(known), default=list(real_tables.WIDE))
    parser.add_argument("--methods", nargs="+", choices=("mst", "aim"), default=["mst", "aim"])
    parser.add_argument("--epsilon", nargs="+", default=["1"], help="total ε per run [1]")
    parser.add_argument(
        "--proc-shares",
        nargs="+",
        type=float,
        default=[0.1, 0.5, 0.9],
        help="the binner's share of ε, the next tried when it finds no bounds [0.1 0.5 0.9]",
    )
    parser.add_argument("--n", default="train", help="synthetic rows: train | holdout | N")
    parser.add_argument("--timeout", type=float, default=15.0, help="wall minutes per run [15]")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--n-jobs", type=int, default=-1, help="dpmm's n_jobs [-1: cores − 1]")
    parser.add_argument(
        "--max-model-size", type=float, default=None, help="MB (the pipelines' default: none)"
    )
    parser.add_argument("--clf-rows", type=int, default=50_000, help="classifier training rows")
    parser.add_argument("--work", type=Path, default=Path("/tmp/dpsynth-tables-real"))
    parser.add_argument("--venv", type=Path, default=VENV)
    parser.add_argument("--out", type=Path, default=None, help="results folder")
    parser.add_argument("--no-install", action="store_true", help="never pip-install anything")
    parser.add_argument(
        "--rewrite", action="store_true", help="only write OUT/dpmm.md again from OUT/dpmm.json"
    )
    args = parser.parse_args(argv)
    if args.n not in ("train", "holdout") and not args.n.isdigit():
        parser.error("--n: train, holdout or a number")
    if not all(0 < s < 1 for s in args.proc_shares):
        parser.error("--proc-shares: each between 0 and 1")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    args.work = args.work.resolve()
    args.work.mkdir(parents=True, exist_ok=True)
    now = datetime.now(UTC)
    folder = args.out or RESULTS / f"{now:%Y-%m-%d}-tables-wide"
    if args.rewrite:
        if not (folder / "dpmm.json").is_file():
            raise SystemExit(f"--rewrite: no {folder / 'dpmm.json'}")
        (folder / "dpmm.md").write_text(markdown(json.loads((folder / "dpmm.json").read_text())))
        print(f"wrote {folder / 'dpmm.md'}")
        return
    python = venv_python(args.venv, not args.no_install)
    version = subprocess.run(
        [str(python), "-c", "import sys; print(sys.version.split()[0])"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    report: dict[str, Any] = {
        "date": now.isoformat(timespec="seconds"),
        "machine": machine.describe("cpu"),
        "package": PACKAGE,
        "venv": str(args.venv),
        "venv_python": version,
        "commands": [shlex.join(["python", "-m", "bench.tables_dpmm", *(argv or sys.argv[1:])])],
        "settings": {k: str(v) for k, v in vars(args).items()},
        "split": {"seed": real_tables.SPLIT_SEED, "holdout_share": real_tables.HOLDOUT_SHARE},
        "tables": {},
        "cells": [],
    }
    known = real_tables.tables()
    for name in args.data:
        table = known[name]
        try:
            real = real_facts(table, args)
        except Exception as exc:  # a table that cannot be read is a record
            report["cells"] += [
                {"data": name, "method": f"dpmm-{m}", "epsilon": e, "delta": 0.0,
                 "error": f"data: {exc}"}
                for m in args.methods
                for e in args.epsilon
            ]  # fmt: skip
            write(report, folder)
            continue
        report["tables"][name] = describe_table(table, real)
        for method in args.methods:
            for epsilon in args.epsilon:
                cell = run_cell(python, args, table, real, method, epsilon)
                report["cells"].append(cell)
                brief = {k: cell.get(k) for k in ("data", "method", "epsilon", "seconds")}
                brief["proc_epsilon"] = cell.get("proc_epsilon")
                brief["error"] = (cell.get("error") or "")[-300:] or None
                if "metrics" in cell:
                    m = cell["metrics"]
                    brief |= {"tvd_1": m["tvd_one_way"], "tvd_2": m["tvd_two_way"]}
                    brief["auc"] = {
                        k: v.get("roc_auc")
                        for k, v in m["classifiers"].items()
                        if isinstance(v, dict)
                    }
                print(json.dumps(brief, default=str), file=sys.stderr, flush=True)
                write(report, folder)
    merged = write(report, folder)
    print(markdown(merged))
    print(f"wrote {folder / 'dpmm.json'} and {folder / 'dpmm.md'}")


if __name__ == "__main__":
    main()
