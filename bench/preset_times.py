"""Train and sample times of image presets as a user sees them (issue 45's time target): each
`METHOD:PRESET` is trained through the CLI with torch's default threads (OMP_NUM_THREADS is
removed from the environment), then 10,000 images are sampled, one command after the other.

    python -m bench.preset_times --data mnist-5k --epsilon 10 \
        --runs dpkernel:mnist pge:mnist psg:mnist

Each command's wall clock, CPU seconds of its process group and peak RSS come from
bench/measure.py; the 1-minute load average is read before and after it, so a run on a busy
machine says so. Nothing is evaluated here (the leaderboard does that). Writes
`bench/results/preset-times-<data>.json` and `.md` (or `--json`/`--markdown`) and prints each
entry as it finishes. `--device cuda` trains and samples on the GPU. `--threads N` passes the
CLI's `--threads N` to both commands, to compare torch's default with one thread on a machine
other work keeps busy.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench import leaderboard, machine
from bench.measure import mb, run_measured

RESULTS = Path(__file__).resolve().parent / "results"
LIMIT_S = 3 * 3600.0  # CPU and wall clock, a safety net only


def _timed(args: list[str]) -> dict[str, Any]:
    """Run `dpsynth ARGS --json` with default threads: wall, CPU, peak MB and load averages."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    load_before = os.getloadavg()[0]
    done = run_measured([*leaderboard.CLI, *args, "--json"], LIMIT_S, env=env, wall_limit_s=LIMIT_S)
    if done.returncode != 0:
        raise RuntimeError(f"dpsynth {args[0]} failed: {done.stderr.strip()[-1500:]}")
    return {
        "wall_s": round(done.seconds, 1),
        "cpu_s": round(done.cpu_seconds, 1),
        "peak_mb": mb(done.peak_rss_mb),
        "load_before": round(load_before, 2),
        "load_after": round(os.getloadavg()[0], 2),
    }


def time_preset(method: str, preset: str, args: argparse.Namespace) -> dict[str, Any]:
    """Train METHOD's PRESET on --data at --epsilon, then sample --n images; both timed."""
    with tempfile.TemporaryDirectory(prefix=f"preset-times-{method}-") as tmp:
        root = Path(tmp)
        ledger = str(root / "ledger.jsonl")
        train = [
            "train", "--method", method, "--data", args.data, "--epsilon", args.epsilon,
            "--preset", preset, "--out", str(root / "run"), "--device", args.device,
            "--ledger", ledger, "--quiet",
        ]  # fmt: skip
        for item in args.set or []:
            train += ["--set", item]
        if args.public:  # declared-public images (a preset such as dpkernel's mnist-eps1-public)
            train += ["--public", args.public]
        threads = ["--threads", str(args.threads)] if args.threads else []
        trained = _timed([*train, *threads])
        sampled = _timed(
            ["sample", str(root / "run"), "--n", str(args.n), "--out", str(root / "synth"),
             "--device", args.device, "--ledger", ledger, "--quiet", *threads]
        )  # fmt: skip
    return {"method": method, "preset": preset, "epsilon": float(args.epsilon), "n": args.n,
            "device": args.device, "threads": args.threads or "default",
            "overrides": args.set or [], "public": args.public,
            "train": trained, "sample": sampled}  # fmt: skip


def markdown(report: dict[str, Any]) -> str:
    """The entries as a Markdown table (minutes for training, seconds for sampling)."""
    gpu = report["machine"].get("gpu")
    lines = [
        f"Preset times on {report['machine']['cpu']} ({report['machine']['cpu_cores']} cores"
        f"{', ' + str(gpu) if gpu else ''}), "
        f"{report['machine']['date']} at {report['machine']['commit']}: `{report['command']}`",
        "",
        "| method | preset | ε | threads | train (min) | train CPU (min) | load before/after | "
        f"sample {report['n']} (s) | sample load before/after |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for e in report["entries"]:
        t, s = e["train"], e["sample"]
        lines.append(
            f"| {e['method']} | {e['preset']} | {e['epsilon']:g} | {e.get('threads', 'default')} | "
            f"{t['wall_s'] / 60:.1f} | "
            f"{t['cpu_s'] / 60:.1f} | {t['load_before']}/{t['load_after']} | {s['wall_s']:.0f} | "
            f"{s['load_before']}/{s['load_after']} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default="mnist-5k")
    parser.add_argument("--epsilon", default="10")
    parser.add_argument("--runs", nargs="+", required=True, help="METHOD:PRESET ...")
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--set", action="append", help="key=value for every run")
    parser.add_argument("--threads", type=int, help="the CLI's --threads [default: torch's]")
    parser.add_argument("--public", help="train's --public SPEC for every run")
    parser.add_argument("--device", default="cpu", help="train's and sample's --device (cpu, cuda)")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args(argv)
    stem = f"preset-times-{args.data.replace(':', '-').replace('/', '-')}"
    json_path = args.json or RESULTS / f"{stem}.json"
    md_path = args.markdown or RESULTS / f"{stem}.md"
    report: dict[str, Any] = {
        "machine": machine.describe(args.device),
        "command": "python -m bench.preset_times " + " ".join(argv or sys.argv[1:]),
        "n": args.n,
        "entries": [],
    }
    for item in args.runs:
        method, preset = item.split(":", 1)
        entry = time_preset(method, preset, args)
        report["entries"].append(entry)
        print(json.dumps(entry), flush=True)
        json_path.write_text(json.dumps(report, indent=2) + "\n")
        md_path.write_text(markdown(report))


if __name__ == "__main__":
    main()
