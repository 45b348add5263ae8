"""What the default DP schema release keeps of each column, without training (issue 68).

    python -m bench.schema_release_checks                       # the wide tables, 3 releases
    python -m bench.schema_release_checks --data loans ames --seeds 5 --json F

Per table (bench/real_tables.py's WIDE and UNSEEN_WIDE tables by default, split as
bench/tables_real.py splits them) and per secret seed: `dpsynth data schema --target T`
drafts the schema, then the release `train --epsilon E` would spend by default (its share for
`mst`) runs on the training rows, as `train` runs it (`read_table_input`,
`release_table_schema`), and nothing is trained. Scored against the exact training rows, which
only this bench reads:

- `clipped`: per number, the share of its present values beyond the released [min, max];
- `over_2pct`: the numbers clipping more than 2% (the issue's target: none);
- `empty`: the columns written empty (type `ignored`) that real rows fill in ≥ 10% of cells;
- `false_missing_flags`: numbers and booleans with no empty cell released with a missing bin
  (the model then writes some empty); `lost_missing_flags`: those over 2% empty released
  without one (their empty cells are written as values);
- `ranges`: per number, the real [min, max] beside the released one, and `junk`: the share of
  values drawn from the release's own 1-way histogram (its noisy counts summed into the model's
  bins, clipped at 0: what mst's 1-way marginal starts from) and placed in their bins as
  `sample` places them (end bins by their tails), that fall outside the real [min, max]
  (issue 68's junk values).

Results (with date, machine, commit and command) go to `--json` or stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from bench import machine, real_tables
from bench.cli_runner import Cli
from bench.tables_real_cells import draft_schema
from dpsynth.errors import DpsynthError

PRESENT_SHARE = 0.10  # a column written empty counts when real rows fill this share of cells
LOST_FLAG_SHARE = 0.02  # a number or boolean this share empty released without a missing bin
DRAFT_MINUTES = 10.0  # wall limit of `data schema`


SAMPLED = 20_000  # values drawn per number for the junk share


def junk_shares(schema: Any, one_ways: dict[str, Any], n: int, real: dict[str, tuple]) -> dict:
    """Per number with a reused 1-way histogram: the share of values drawn from it (bins by
    the clipped noisy counts, values inside a bin as `sample` draws them) outside the real
    [min, max] (`real`)."""
    from dpsynth.data.discrete import schema_domain
    from dpsynth.methods.marginal.domain import bin_values
    from dpsynth.methods.marginal.one_ways import released_measurements
    from dpsynth.methods.marginal.presets import MST_PRESETS
    from dpsynth.methods.marginal.tails import end_tails, tail_positions

    preset = MST_PRESETS["small"]
    domain = schema_domain(schema, int(preset["bins"]), bool(preset["bound_bins"]))
    measured = released_measurements(domain, schema, one_ways, float(n))
    rng = np.random.default_rng(0)
    out: dict[str, float] = {}
    for index, measurement in measured.items():
        attribute = domain.attributes[index]
        if attribute.kind in ("categorical", "target") or attribute.name not in real:
            continue
        counts = np.clip(np.asarray(measurement.values, dtype=np.float64), 0.0, None)
        counts = counts[: attribute.present_size]
        if counts.sum() <= 0:
            continue
        codes = rng.choice(len(counts), size=SAMPLED, p=counts / counts.sum())
        tails = end_tails(attribute, counts)
        values = bin_values(
            codes, attribute, tail_positions(codes, rng.random(SAMPLED), attribute, tails)
        )
        low, high = real[attribute.name]
        out[attribute.name] = round(float(np.mean((values < low) | (values > high))), 4)
    return out


def release_checks(train: Path, schema: Path, epsilon: float, seed: int) -> dict[str, Any]:
    """One default release on `train`: per number its clipped share, and the lost columns."""
    from dpsynth.data.column_values import column_numbers
    from dpsynth.ledger import Ledger
    from dpsynth.privacy.mechanisms.randomness import PrivateRandomness
    from dpsynth.training.table_prepare import spend_release
    from dpsynth.training.table_schema import RowsInMemory, read_table_input, schema_share

    with tempfile.TemporaryDirectory() as folder:
        ledger = Ledger(Path(folder) / "ledger.jsonl")
        table = read_table_input(
            spec=f"csv:{train}",
            schema_path=schema,
            schema_public=False,
            schema_epsilon=None,
            dataset_id=None,
            ledger=ledger,
            delta=None,
            public_size=None,
            target_epsilon=epsilon,
            share=schema_share(True),
        )
        engine = RowsInMemory(table)  # as `train` runs it on rows in memory
        randomness = PrivateRandomness(seed)
        released = engine.for_release(table, randomness)
        schema_out, release = spend_release(
            released, ledger, "mst", "bench", randomness, engine.release_run(released)
        )
        data = engine.released(released, schema_out)
    clipped: dict[str, float] = {}
    ranges: dict[str, list[float]] = {}
    real: dict[str, tuple[float, float]] = {}
    empty: list[str] = []
    false_flags: list[str] = []
    lost_flags: dict[str, float] = {}
    for column in data.schema.columns:
        if column.name not in table.raw.header:
            continue
        cells = np.asarray(table.raw.column(column.name), dtype=str)
        filled = float(np.mean(np.char.strip(cells) != ""))
        if column.type == "ignored" and filled >= PRESENT_SHARE:
            empty.append(f"{column.name} ({filled:.0%} filled)")
        if column.is_numeric or column.type == "boolean":
            if column.missing and filled == 1.0:
                false_flags.append(column.name)
            elif not column.missing and filled < 1.0 - LOST_FLAG_SHARE:
                lost_flags[column.name] = round(1.0 - filled, 4)
        if column.is_numeric and column.min is not None and column.max is not None:
            values = column_numbers(table.raw, column, lenient=True)
            values = values[np.isfinite(values)]
            if len(values):
                beyond = (values < column.min) | (values > column.max)
                clipped[column.name] = round(float(np.mean(beyond)), 4)
                real[column.name] = (float(values.min()), float(values.max()))
                ranges[column.name] = [*real[column.name], column.min, column.max]
    junk = junk_shares(data.schema, (release or {}).get("one_ways", {}), table.raw.n, real)
    over = {name: share for name, share in clipped.items() if share > 0.02}
    return {
        "seed": seed,
        "numbers": len(clipped),
        "median_clipped": float(np.median(list(clipped.values()))) if clipped else 0.0,
        "over_2pct": over,
        "empty": empty,
        "clipped": clipped,
        "junk": junk,
        "median_junk": float(np.median(list(junk.values()))) if junk else 0.0,
        "junk_over_5pct": {name: share for name, share in junk.items() if share > 0.05},
        "ranges": ranges,
        "false_missing_flags": false_flags,
        "lost_missing_flags": lost_flags,
    }


def _worst(shares: dict[str, float], count: int = 4) -> str:
    top = sorted(shares.items(), key=lambda item: -item[1])[:count]
    return ", ".join(f"{name} {share:.0%}" for name, share in top)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    every = [*real_tables.WIDE, *real_tables.UNSEEN_WIDE]
    parser.add_argument("--data", nargs="+", default=every)
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--work", type=Path, default=Path("/tmp/dpsynth-tables-real"))
    parser.add_argument("--no-install", action="store_true", help="never pip-install packages")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    known = real_tables.tables()
    report: dict[str, Any] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine.describe(),
        "commit": machine.source_commit(),
        "command": "python -m bench.schema_release_checks " + " ".join(argv or sys.argv[1:]),
        "epsilon": args.epsilon,
        "tables": {},
    }
    for name in args.data:
        table = known[name]
        train, _ = real_tables.prepare(table, args.work, install=not args.no_install)
        drafted = draft_schema(Cli(args.work, None, DRAFT_MINUTES), table, train, train.parent)
        if "error" in drafted:
            report["tables"][name] = {"error": drafted["error"]}
            continue
        schema = Path(drafted["path"])
        try:
            runs = [release_checks(train, schema, args.epsilon, seed) for seed in range(args.seeds)]
        except DpsynthError as exc:  # refused before any spend (too small for its columns)
            report["tables"][name] = {"refused": str(exc)}
            print(f"{name}: refused: {exc}", file=sys.stderr)
            continue
        report["tables"][name] = runs
        for run in runs:
            print(
                f"{name} seed {run['seed']}: {len(run['over_2pct'])}/{run['numbers']} numbers "
                f"clip > 2% (median {run['median_clipped']:.2%}); written empty: {run['empty']}; "
                f"{len(run['junk_over_5pct'])}/{len(run['junk'])} draw > 5% outside the real "
                f"range (median {run['median_junk']:.2%}); worst: {_worst(run['junk'])}; "
                f"missing flags false: {run['false_missing_flags']}, lost: "
                f"{run['lost_missing_flags']}",
                file=sys.stderr,
            )
    text = json.dumps(report, indent=1)
    if args.json:
        args.json.write_text(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
