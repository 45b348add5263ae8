"""dpsynth's table methods beside SmartNoise-Synth's MST and AIM (issue 29): marginal fidelity,
downstream ROC-AUC, time and memory, side by side on the same rows.

    OMP_NUM_THREADS=1 python -m bench.tables_peers                  # every cell (hours)
    OMP_NUM_THREADS=1 python -m bench.tables_peers --data german-credit --epsilon 1 10
    OMP_NUM_THREADS=1 python -m bench.tables_peers --data census --methods dpkernel \
        smartnoise-mst --timeout 20
    python -m bench.tables_peers --quick                            # smoke: minutes

Data: `german-credit` (the built-in: 800 train / 200 test rows, its bundled schema, δ = 1e-4)
and `census` (Census-Income KDD from `--shared`: 199,523 train / 99,762 test rows, the schema
`bench/census.schema.json`, δ = 1e-5). For each data set, ε (`--epsilon`, default 1
and 10), tool (`--methods`, default every dpsynth table method in the registry, then
`smartnoise-mst` and `smartnoise-aim`) and run (`--runs`, default 2), in a fresh temporary
folder and ledger:
- a dpsynth method goes through the `dpsynth` CLI with `--json` as bench/leaderboard.py does
  for tables (`train` with the public schema, `--preset auto` unless `--preset`, then
  `sample --n`);
- a SmartNoise peer runs in its own virtual environment (created on first use), given the same
  public bounds and categories as a pre-binned table (bench/smartnoise_peer.py says how);
- both tools' CSVs are scored by the same `dpsynth evaluate --metrics ml,marginals` against
  the real held-out rows: mean TVD of all 1-way, all 2-way and 100 public random 3-way
  marginals (numbers in 10 bins over the schema's public bounds), logistic regression and
  gradient boosting ROC-AUC (trained on the synthetic rows).
Each training (for SmartNoise: fit and sample) may use `--timeout` minutes of CPU time
(default 30) and `--wall-timeout` minutes of wall clock (default 3 × that): on a shared machine
the CPU time is the work done, the wall clock depends on the load. A run past either limit is
killed and recorded as "did not finish in X CPU (or wall) min" (AIM: with the rounds it had
done), and the cell's remaining runs are skipped. The table gives CPU and wall seconds of the
commands (start-up and data loading included) and each command's peak RSS (bench/measure.py
says how they are measured).

The real train rows, evaluated as if synthetic, give each data set's reference row (not
private: the floor of the metrics with that many real rows). Results are merged into
`bench/results/tables-peers-<date>.json` (rows of the same data, ε and tool are replaced; the
commands accumulate) and `.md`, and the table is printed.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import leaderboard, machine, smartnoise_peer
from bench.measure import Finished, mb, run_measured

BENCH = Path(__file__).resolve().parent

REPO = BENCH.parent
RESULTS = BENCH / "results"
SCORES = ("tvd_two_way", "tvd_three_way", "tvd_one_way", "logreg_roc_auc_mean", "gbm_roc_auc_mean")
TIMES = ("train_cpu_seconds", "train_seconds", "sample_seconds")


@dataclass(frozen=True)
class Table:
    """A data set of the bench: train and test specs, its public schema file, δ."""

    name: str
    train: str
    test: str
    schema: Path | None  # None: the built-in table's bundled schema
    delta: float


def tables(shared: Path) -> dict[str, Table]:
    """The bench's data sets (census from `shared`)."""
    return {
        "german-credit": Table("german-credit", "german-credit", "german-credit:test", None, 1e-4),
        "census": Table(
            "census",
            f"csv:{shared / 'census_income_kdd_train.csv.gz'}",
            f"csv:{shared / 'census_income_kdd_test.csv.gz'}",
            BENCH / "census.schema.json",
            1e-5,
        ),
    }


def limits(args: argparse.Namespace) -> tuple[float, float]:
    """(CPU seconds, wall seconds) a training may take: `--timeout`, `--wall-timeout`."""
    wall = args.wall_timeout if args.wall_timeout is not None else 3 * args.timeout
    return args.timeout * 60, wall * 60


def limit_text(killed_by: str | None, args: argparse.Namespace) -> str:
    """'20 CPU min' or '60 wall min': the limit that stopped a run."""
    cpu, wall = limits(args)
    return f"{wall / 60:g} wall min" if killed_by == "wall" else f"{cpu / 60:g} CPU min"


def cli_json(args: list[str], limit: tuple[float, float]) -> tuple[dict[str, Any], Finished]:
    """`dpsynth ARGS --json` under (CPU, wall) limits: its JSON ({} when killed), the outcome."""
    threads = {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    command = [*leaderboard.CLI, *args, "--json"]
    done = run_measured(command, limit[0], env=os.environ | threads, wall_limit_s=limit[1])
    if done.timed_out:
        return {}, done
    if done.returncode != 0:
        raise RuntimeError(
            f"dpsynth {shlex.join(args[:3])} failed (exit {done.returncode}): "
            f"{done.stderr.strip()[-1500:]}"
        )
    return json.loads(done.stdout), done


def namespace(table: Table, args: argparse.Namespace) -> argparse.Namespace:
    """The fields bench/leaderboard.py's table helpers read."""
    return argparse.Namespace(
        data=table.train, test=table.test, schema=table.schema, schema_public=False,
        set=args.set, device="cpu", preset=args.preset,
    )  # fmt: skip


def dpsynth_run(
    method: str, table: Table, epsilon: str, args: argparse.Namespace, root: Path
) -> dict[str, Any]:
    """Train and sample one dpsynth method through its CLI; writes root/synth.csv."""
    ledger = root / "ledger.jsonl"
    command = [
        "train", "--method", method, "--data", table.train, "--epsilon", epsilon,
        "--delta", repr(table.delta), "--out", str(root / "run"), "--device", "cpu",
        "--ledger", str(ledger), "--quiet",
    ]  # fmt: skip
    if args.preset:
        command += ["--preset", args.preset]
    if table.schema:
        command += ["--schema", str(table.schema)]
    for item in args.set or []:
        command += ["--set", item]
    trained, train = cli_json(command, limits(args))
    if train.timed_out:
        # one_run turns `killed_by` into the limit's text, as for a SmartNoise peer.
        return {"timed_out": True, "killed_by": train.killed_by}
    sample = ["sample", str(root / "run"), "--n", str(args.n), "--out", str(root / "synth.csv"),
              "--device", "cpu", "--ledger", str(ledger), "--quiet"]  # fmt: skip
    if args.labels:
        sample += ["--labels", args.labels]
    _, sampled = cli_json(sample, limits(args))
    if sampled.timed_out:
        raise RuntimeError(f"sample did not finish in {limit_text(sampled.killed_by, args)}")
    return {
        "preset": trained["preset"],
        "epsilon_bound": trained["epsilon"],
        "steps": trained["steps"],
        "noise_multiplier": trained["noise_multiplier"],
        "train_seconds": round(train.seconds, 1),
        "train_cpu_seconds": round(train.cpu_seconds, 1),
        "sample_seconds": round(sampled.seconds, 1),
        "sample_cpu_seconds": round(sampled.cpu_seconds, 1),
        "peak_rss_mb": mb(max(train.peak_rss_mb, sampled.peak_rss_mb)),
        "train_peak_rss_mb": mb(train.peak_rss_mb),
        "sample_peak_rss_mb": mb(sampled.peak_rss_mb),
    }


def one_run(
    tool: str, table: Table, epsilon: str, args: argparse.Namespace, run: int
) -> dict[str, Any]:
    """One training run of one tool, scored; errors and time-outs become the run's record."""
    with tempfile.TemporaryDirectory(prefix=f"peers-{tool}-") as tmp:
        root = Path(tmp)
        try:
            if tool in smartnoise_peer.PEERS:
                from dpsynth.data.schema_file import read_schema
                from dpsynth.data.sources import read_table

                raw, _, bundled = read_table(table.train)
                schema = read_schema(table.schema) if table.schema else bundled
                record = smartnoise_peer.run_peer(
                    tool, raw, schema, float(epsilon), table.delta, args.n, root,
                    limits(args), aim_rounds=args.aim_rounds, seed=run,
                )  # fmt: skip
                del raw
            else:
                record = dpsynth_run(tool, table, epsilon, args, root)
            if record.get("timed_out"):
                return record | {"limit": limit_text(record.pop("killed_by", None), args)}
            evaluation = leaderboard._evaluate_table(
                root / "synth.csv", namespace(table, args), root / "ledger.jsonl", args.seeds,
                "ml,marginals",
            )  # fmt: skip
            return record | leaderboard._table_scores(evaluation)
        except (RuntimeError, ValueError, subprocess.CalledProcessError) as exc:
            return {"error": str(exc)[-2000:]}


def combine(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """A cell from its runs: each score's values, mean, min and max over the finished runs."""
    finished = [r for r in runs if "error" not in r and not r.get("timed_out")]
    cell: dict[str, Any] = {"per_run": runs, "finished": len(finished)}
    for key in (*SCORES, *TIMES, "peak_rss_mb"):
        values = [r[key] for r in finished if r.get(key) is not None]
        if values:
            cell[key] = {"mean": sum(values) / len(values), "min": min(values), "max": max(values)}
    return cell


def fmt_range(value: dict[str, Any] | None, spec: str) -> str:
    """`min–max` (or the one value) of a cell's score."""
    if not value:
        return "–"
    low, high = format(value["min"], spec), format(value["max"], spec)
    return low if low == high else f"{low}–{high}"


def status(row: dict[str, Any]) -> str | None:
    """Why a cell has no scores (every run failed or timed out), else None."""
    if row["finished"]:
        return None
    runs = row["per_run"]
    timed = [r for r in runs if r.get("timed_out")]
    if timed:
        text = f"did not finish in {timed[0]['limit']}"
        rounds = [r["rounds_done"] for r in timed if r.get("rounds_done") is not None]
        if rounds:
            used = [r["budget_used"] for r in timed if r.get("budget_used") is not None]
            text += f" ({'/'.join(map(str, rounds))} rounds done"
            text += f", {max(used):.0%} of ρ)" if used else ")"
        return text
    return "failed: " + runs[0].get("error", "?").splitlines()[-1][:100]


def tool_label(row: dict[str, Any]) -> str:
    """The tool column: dpsynth METHOD (preset) or SmartNoise MST/AIM (rounds)."""
    tool = row["tool"]
    if tool == "real":
        return "real train rows (not private)"
    if tool in smartnoise_peer.PEERS:
        name = "SmartNoise " + smartnoise_peer.PEERS[tool].upper()
        return name + (f" ({row['aim_rounds']} rounds)" if row.get("aim_rounds") else "")
    presets = sorted({r["preset"] for r in row["per_run"] if r.get("preset")})
    labels = [f"--labels {row['labels']}"] if row.get("labels") else []
    details = ", ".join(presets + labels)
    return f"dpsynth {tool}" + (f" ({details})" if details else "")


def markdown(report: dict[str, Any]) -> str:
    """The side-by-side table, one line per (data, ε, tool), real rows first."""
    lines = [
        "| data | ε | tool | 2-way TVD | 3-way TVD | 1-way TVD | logreg AUC | GBM AUC "
        "| train CPU s | train wall s | sample wall s | peak MB | runs |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in report["rows"]:
        head = f"| {row['data']} | {row['epsilon'] or '–'} | {tool_label(row)} |"
        why = status(row)
        if why:
            lines.append(f"{head} {why} | | | | | | | | | {len(row['per_run'])} |")
            continue
        cells = [fmt_range(row.get(k), ".3f") for k in SCORES]
        cells += [fmt_range(row.get(k), ".0f") for k in TIMES]
        cells.append(fmt_range(row.get("peak_rss_mb"), ".0f"))
        runs = f"{row['finished']}/{len(row['per_run'])}"
        lines.append(f"{head} {' | '.join(cells)} | {runs} |")
    return "\n".join(lines) + "\n"


def row_key(row: dict[str, Any]) -> tuple:
    """What a re-measured row replaces: the same data, ε, tool, AIM rounds and dpsynth labels."""
    return (row["data"], row["epsilon"], row["tool"], row.get("aim_rounds"), row.get("labels"))


def write(meta: dict[str, Any], mine: list[dict[str, Any]], json_path: Path) -> dict[str, Any]:
    """Merge this process's rows (`mine`) and facts (`meta`) into the results file under a lock
    (another bench process may write the same day's file), then write the Markdown page.
    A row replaces the file's row of the same data, ε, tool and AIM rounds. Returns the merged
    report."""
    json_path.parent.mkdir(parents=True, exist_ok=True)
    with open(json_path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        report: dict[str, Any] = {"rows": [], "commands": [], "tables": {}}
        if json_path.is_file():
            report = json.loads(json_path.read_text())
        mine_keys = {row_key(r) for r in mine}
        rows = [r for r in report["rows"] if row_key(r) not in mine_keys] + mine
        commands = report["commands"] + [c for c in meta["commands"] if c not in report["commands"]]
        tables_seen = report.get("tables", {}) | meta["tables"]
        report |= meta | {"rows": rows, "commands": commands, "tables": tables_seen}
        order = {name: i for i, name in enumerate(report["order"])}
        report["rows"].sort(
            key=lambda r: (
                r["data"], r["epsilon"] is not None, float(r["epsilon"] or 0),
                order.get(r["tool"], 99), r.get("aim_rounds") or 0, r.get("labels") or "",
            )
        )  # fmt: skip
        json_path.write_text(json.dumps(report, indent=2) + "\n")
    host = report["machine"]
    head = [
        f"# dpsynth table methods beside SmartNoise-Synth ({report['date'][:10]})",
        "",
        f"{host['cpu']}, {host['cpu_cores']} cores, OMP_NUM_THREADS={host['omp_num_threads']}, "
        f"load {host['load_average_1min']:.1f} at the start (a shared machine: times are "
        f"noisy) · {report['synthetic_n']:,} synthetic rows per run · classifiers "
        f"{report['seeds']} seed(s) · TVD: 10 public bins per number, 100 public random "
        "3-way subsets · ranges are min–max over the finished runs",
        "",
        *[f"`{c}`" for c in report["commands"]],
        "",
    ]
    json_path.with_suffix(".md").write_text("\n".join(head) + "\n" + markdown(report))
    return report


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", nargs="+", choices=("german-credit", "census"), default=None)
    parser.add_argument("--epsilon", nargs="+", default=None)
    parser.add_argument("--methods", nargs="+", default=None, help="dpsynth methods, smartnoise-*")
    parser.add_argument("--runs", type=int, default=None, help="training runs per cell [2]")
    parser.add_argument("--timeout", type=float, default=None, help="CPU min per training [30]")
    parser.add_argument("--wall-timeout", type=float, default=None, help="wall min [3×timeout]")
    parser.add_argument("--n", type=int, default=None, help="synthetic rows per run [20,000]")
    parser.add_argument("--seeds", type=int, default=1, help="classifier seeds")
    parser.add_argument("--preset", default=None, help="dpsynth preset [auto]")
    parser.add_argument("--set", action="append", help="key=value for every dpsynth method")
    parser.add_argument("--labels", default=None, help="dpsynth `sample --labels` [its default]")
    parser.add_argument("--aim-rounds", type=int, default=None, help="[SmartNoise: 16 × columns]")
    parser.add_argument("--no-real", action="store_true", help="skip the real-rows reference")
    parser.add_argument("--shared", type=Path, default=REPO.parent / "shared" / "data")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--quick", action="store_true", help="smoke: german-credit, ε 10, tiny")
    args = parser.parse_args(argv)
    quick = args.quick
    args.data = args.data or (["german-credit"] if quick else ["german-credit", "census"])
    args.epsilon = args.epsilon or (["10"] if quick else ["1", "10"])
    args.runs = args.runs or (1 if quick else 2)
    args.timeout = args.timeout or (10.0 if quick else 30.0)
    args.n = args.n or (2000 if quick else 20_000)
    if quick:
        args.preset = args.preset or "tiny"
        args.methods = args.methods or [leaderboard.table_methods()[0], "smartnoise-mst"]
    known = [*leaderboard.table_methods(), *smartnoise_peer.PEERS]
    unknown = sorted(set(args.methods or []) - set(known))
    if unknown:
        parser.error(f"--methods: unknown {', '.join(unknown)}; choose from {', '.join(known)}")
    return args


def main(argv: list[str] | None = None) -> None:
    """Run the cells, merging them into the day's results, and print the table."""
    args = parse_args(argv)
    command = shlex.join(["python", "-m", "bench.tables_peers", *(argv or sys.argv[1:])])
    methods = args.methods or [*leaderboard.table_methods(), *smartnoise_peer.PEERS]
    json_path = args.json or RESULTS / f"tables-peers-{datetime.now(UTC):%Y-%m-%d}.json"
    meta: dict[str, Any] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine.describe("cpu"),
        "synthetic_n": args.n,
        "seeds": args.seeds,
        "order": [*leaderboard.table_methods(), *smartnoise_peer.PEERS],
        "commands": [command],
        "tables": {},
    }
    mine: list[dict[str, Any]] = []
    known = tables(args.shared)
    for name in args.data:
        table = known[name]
        meta["tables"][name] = {
            "train": table.train, "test": table.test, "delta": table.delta,
            "schema": str(table.schema.relative_to(REPO)) if table.schema else "bundled",
        }  # fmt: skip
        if not args.no_real:
            real = leaderboard.real_table_row(namespace(table, args), args.seeds, "ml,marginals")
            mine.append({"data": name, "epsilon": None, "tool": "real"} | combine([real]))
            write(meta, mine, json_path)
        for epsilon in args.epsilon:
            for tool in methods:
                rounds = args.aim_rounds if tool == "smartnoise-aim" else None
                labels = None if tool in smartnoise_peer.PEERS else args.labels
                runs = []
                for run in range(args.runs):
                    runs.append(one_run(tool, table, epsilon, args, run))
                    print(json.dumps({"data": name, "epsilon": epsilon, "tool": tool} | {
                        k: v for k, v in runs[-1].items() if k != "tvd_per_column"
                    }), file=sys.stderr, flush=True)  # fmt: skip
                    if runs[-1].get("timed_out"):
                        break  # another run would hit the same limit: its time is better spent
                row = {"data": name, "epsilon": epsilon, "tool": tool, "aim_rounds": rounds}
                row["labels"] = labels
                mine.append(row | combine(runs))
                write(meta, mine, json_path)
    report = write(meta, mine, json_path)
    print(markdown(report))
    print(f"wrote {json_path} and {json_path.with_suffix('.md')}")


if __name__ == "__main__":
    main()
