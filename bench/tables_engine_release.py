"""Issue 68, item 5: the DP schema release on an out-of-core engine, on a big partitioned table.

    OMP_NUM_THREADS=1 python -m bench.tables_engine_release --rows 5000000 --out /tmp/dpsynth-5m

The table is bench/big_table.py's partitioned Parquet folder (census-based, 50 columns, 1M rows a
file; generated once under `--out`). Its schema is drafted by `dpsynth data schema` on the
folder (a uniform sample of 200,000 rows: every entry marked read off the data), and `train
--method mst --engine duckdb --epsilon 1` runs with that schema and no `--schema-public`: the
check pass, the DP release's two rounds (a pass each), then mst's counting pass. Writes the
wall and CPU times, the peak memory of train's process group, each pass and the release's
lines to `bench/results/<date>-tables-engines-release/results.json`.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from bench import big_table, machine
from bench.leaderboard import CLI
from bench.measure import mb
from bench.tables_peers import cli_json
from bench.tables_scale import PASS_LINE, GroupPeak

BENCH = Path(__file__).resolve().parent


def main(argv: list[str] | None = None) -> None:
    """Draft, train, record (see the module)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--out", type=Path, default=Path("/tmp/dpsynth-5m"))
    parser.add_argument("--shared", type=Path, default=BENCH.parents[1] / "shared" / "data")
    parser.add_argument("--epsilon", default="1")
    parser.add_argument("--engine", default="duckdb")
    parser.add_argument("--timeout", type=float, default=60.0, help="CPU minutes for train")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    started = machine.describe()
    folder, _ = big_table.make_big_parquet(args.out, args.shared, args.rows)
    data = f"parquet:{folder}"
    schema = args.out / "drafted.schema.json"
    draft = [*CLI, "data", "schema", data, "--target", "income"]
    begun = time.perf_counter()
    drafted = subprocess.run(draft, capture_output=True, text=True, check=True)
    draft_seconds = time.perf_counter() - begun
    schema.write_text(drafted.stdout)
    marked = [c["name"] for c in json.loads(drafted.stdout)["columns"] if "source" in c]
    with tempfile.TemporaryDirectory(prefix="dpsynth-release-") as tmp:
        run, ledger = Path(tmp) / "run", Path(tmp) / "ledger.jsonl"
        command = [
            "train", "--method", "mst", "--engine", args.engine, "--data", data,
            "--schema", str(schema), "--epsilon", args.epsilon, "--out", str(run),
            "--ledger", str(ledger), "--device", "cpu",
        ]  # fmt: skip
        limit = (args.timeout * 60, args.timeout * 60 * 3)
        with GroupPeak(str(run)) as group:
            trained, train = cli_json(command, limit)
        entries = [json.loads(line) for line in ledger.read_text().splitlines()]
    release = trained.get("schema_release", {})
    result = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": started,
        "commands": [
            f"python -m bench.tables_engine_release --rows {args.rows}",
            shlex.join(["dpsynth", *draft[len(CLI) :]]),
            shlex.join(["dpsynth", *command]),
        ],
        "table": {"rows": args.rows, "columns": 50, "files": len(list(folder.glob("*.parquet")))},
        "draft_seconds": round(draft_seconds, 1),
        "drafted_entries_marked_read_off_the_data": len(marked),
        "train_seconds": round(train.seconds, 1),
        "train_cpu_seconds": round(train.cpu_seconds, 1),
        "train_peak_rss_mb": mb(train.peak_rss_mb),
        "train_peak_rss_all_mb": mb(group.peak_mb),
        "preset": trained.get("preset"),
        "epsilon_bound": trained.get("epsilon"),
        "engine": trained.get("engine"),
        "counting_passes": trained.get("passes"),
        "passes": [
            {"pass": int(m[1]), "what": m[2], "rows": int(m[3].replace(",", "")), "s": float(m[4])}
            for m in PASS_LINE.finditer(train.stderr)
        ],
        "ledger": [
            {"seq": e.get("seq"), "command": e.get("command"), "status": e.get("status")}
            for e in entries
        ],
        "schema_release": {
            key: release.get(key)
            for key in ("ledger_seq", "default_share", "released_columns", "warnings", "columns")
        },
        "load_average_1min_after": machine.describe()["load_average_1min"],
    }
    path = args.json or (
        BENCH / "results" / f"{datetime.now(UTC):%Y-%m-%d}-tables-engines-release" / "results.json"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{path}: train {result['train_seconds']} s, passes {result['passes']}")


if __name__ == "__main__":
    main()
