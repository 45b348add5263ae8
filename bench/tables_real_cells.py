"""One cell of bench/tables_real.py: the schema drafted, `train` with the schema flags the CLI
asks for, `sample`, and the scores against the real held-out rows."""

from __future__ import annotations

import argparse
import json
import re
import shlex
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd

from bench import real_metrics as rm
from bench import real_tables
from bench.cli_runner import Cli, compact, failure, uptime

REFUSED = re.compile(r"schema-epsilon|schema-public", re.I)
REFUSED_TARGET = re.compile(r"target .*(label set|declare it public)", re.I)
DECLARED_TARGET = "schema-target-declared.json"
TOO_SMALL = re.compile(r"too small to release the schema entries", re.I)


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
        "outside_range": rm.outside_range(synthetic, train, kinds),
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
