"""Benchmark: time and tightness of `calibrate` against Opacus and dp-accounting.

For each setting it times one noise calibration by
- dpsynth (PRV upper bound, coarse-to-fine search), in process (caches cleared),
- the `dpsynth calibrate --json` command as a fresh process (start-up and imports included),
- Opacus `get_noise_multiplier` with its PRV and RDP accountants,
- dp-accounting `calibrate_dp_mechanism` with the PLD accountant,
and checks every σ found against the PLD accountant (ε at that σ); where the PLD calibration
ran, each row also gives its σ's gap to PLD's σ. `--repeat N` times each call N times and
reports the median. Prints a table and writes JSON (default bench/results/calibrate.json) with
the machine and the date.

    OMP_NUM_THREADS=1 python -m bench.calibrate [--quick] [--long] [--repeat N]
        [--tools dpsynth,dpsynth-cli,opacus-prv,opacus-rdp,pld] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import dp_accounting
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant
from opacus.accountants.utils import get_noise_multiplier
from rich.console import Console
from rich.table import Table

from bench.machine import describe
from dpsynth.privacy.accounting import calibration
from dpsynth.privacy.accounting import compose as accounting

SETTINGS = [
    # (epsilon, delta, q, steps)
    (1.0, 1e-5, 0.004, 1_000),
    (1.0, 1e-5, 0.004, 20_000),
    (8.0, 1e-5, 256 / 60_000, 14_000),
    (3.0, 1e-5, 0.01, 100_000),
]
# With --long: T = 10^6 (the reference tools take minutes there; time them with --tools).
LONG_SETTINGS = [(1.0, 1e-5, 0.004, 1_000_000)]
TOOLS = {
    "dpsynth": "dpsynth (PRV)",
    "dpsynth-cli": "dpsynth CLI process",
    "opacus-prv": "opacus prv",
    "opacus-rdp": "opacus rdp",
    "pld": "dp-accounting pld",
}
REPO = Path(__file__).resolve().parents[1]


def pld_accountant() -> pld_privacy_accountant.PLDAccountant:
    return pld_privacy_accountant.PLDAccountant(
        neighboring_relation=dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
    )


def pld_epsilon(sigma: float, q: float, steps: int, delta: float) -> float:
    accountant = pld_accountant()
    event = dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(sigma))
    accountant.compose(event, steps)
    return accountant.get_epsilon(delta)


def clear_caches() -> None:
    """Empty every memoised function of dpsynth's privacy package (a cold call each time)."""
    for name, module in list(sys.modules.items()):
        if name.startswith("dpsynth.privacy"):
            for value in vars(module).values():
                if callable(getattr(value, "cache_clear", None)):
                    value.cache_clear()


def timed(func: Callable[[], float], repeat: int = 1) -> tuple[float, float]:
    """The value of `func()` and the median of `repeat` timings (caches cleared each time)."""
    seconds = []
    for _ in range(repeat):
        clear_caches()
        start = time.perf_counter()
        value = func()
        seconds.append(time.perf_counter() - start)
    return value, statistics.median(seconds)


def tools_for(epsilon: float, delta: float, q: float, steps: int) -> dict[str, Callable[[], float]]:
    """The calibrations to time for one setting, each returning σ."""

    def ours() -> float:
        return calibration.calibrate_noise(epsilon, delta, q, steps).noise_multiplier

    def ours_cli() -> float:
        command = [sys.executable, "-m", "dpsynth.cli", "calibrate", "--json"]
        command += ["--epsilon", repr(epsilon), "--delta", repr(delta)]
        command += ["--sampling-rate", repr(q), "--steps", str(steps)]
        path = [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
        done = subprocess.run(command, capture_output=True, text=True, check=True, env=env)
        return float(json.loads(done.stdout)["noise_multiplier"])

    def opacus(kind: str) -> Callable[[], float]:
        return lambda: get_noise_multiplier(
            target_epsilon=epsilon,
            target_delta=delta,
            sample_rate=q,
            steps=steps,
            accountant=kind,
        )

    def pld() -> float:
        return dp_accounting.calibrate_dp_mechanism(
            pld_accountant,
            lambda s: dp_event.SelfComposedDpEvent(
                dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(s)), steps
            ),
            epsilon,
            delta,
        )

    return {
        TOOLS["dpsynth"]: ours,
        TOOLS["dpsynth-cli"]: ours_cli,
        TOOLS["opacus-prv"]: opacus("prv"),
        TOOLS["opacus-rdp"]: opacus("rdp"),
        TOOLS["pld"]: pld,
    }


def run(
    settings: list[tuple[float, float, float, int]], tools: list[str], repeat: int
) -> list[dict]:
    """Time the chosen tools on every setting; check each σ with the PLD accountant."""
    rows = []
    for epsilon, delta, q, steps in settings:
        base = {"epsilon": epsilon, "delta": delta, "q": q, "steps": steps}
        group = []
        for name, func in tools_for(epsilon, delta, q, steps).items():
            if name not in tools:
                continue
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                try:
                    sigma, seconds = timed(func, repeat)
                except Exception as exc:  # a reference tool failing is a result too
                    group.append({**base, "tool": name, "error": f"{type(exc).__name__}: {exc}"})
                    continue
            group.append(
                {
                    **base,
                    "tool": name,
                    "sigma": sigma,
                    "seconds": seconds,
                    "pld_epsilon_at_sigma": pld_epsilon(sigma, q, steps, delta),
                }
            )
        pld_sigma = next((r.get("sigma") for r in group if r["tool"] == TOOLS["pld"]), None)
        for row in group:
            if pld_sigma is not None and "sigma" in row:
                row["sigma_gap_to_pld"] = row["sigma"] / pld_sigma - 1.0
        rows += group
    return rows


def git_commit() -> str | None:
    """The commit of the code measured (None outside a git checkout)."""
    done = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    return done.stdout.strip() or None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="Only the two smallest settings.")
    parser.add_argument("--long", action="store_true", help="Add T = 10^6.")
    parser.add_argument("--repeat", type=int, default=1, help="Median of N timings per call.")
    parser.add_argument("--tools", default=",".join(TOOLS), help="Comma-separated subset.")
    parser.add_argument("--json", type=Path, default=Path("bench/results/calibrate.json"))
    args = parser.parse_args()
    tools = [TOOLS[name.strip()] for name in args.tools.split(",")]
    settings = SETTINGS[:2] if args.quick else list(SETTINGS)
    rows = run(settings + (LONG_SETTINGS if args.long else []), tools, args.repeat)
    table = Table(title=f"noise calibration (median of {args.repeat} calls each)")
    for column in ("ε", "δ", "q", "T", "tool", "σ", "seconds", "PLD ε at σ", "σ vs PLD"):
        table.add_column(column)
    for row in rows:
        table.add_row(
            f"{row['epsilon']:g}",
            f"{row['delta']:g}",
            f"{row['q']:.4g}",
            str(row["steps"]),
            row["tool"],
            f"{row['sigma']:.4f}" if "sigma" in row else row["error"][:40],
            f"{row['seconds']:.2f}" if "seconds" in row else "-",
            f"{row['pld_epsilon_at_sigma']:.4f}" if "sigma" in row else "-",
            f"{row['sigma_gap_to_pld']:+.2%}" if "sigma_gap_to_pld" in row else "-",
        )
    Console().print(table)
    report = {
        "benchmark": "calibrate",
        "machine": describe("cpu"),
        "command": " ".join(["python", *sys.argv]),
        "accountant": accounting.ACCOUNTANT_PRV,
        "git_commit": git_commit(),
        "repeat": args.repeat,
        "rows": rows,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
