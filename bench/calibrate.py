"""Benchmark: time and tightness of `calibrate` against Opacus and dp-accounting.

For each setting it times one noise calibration by
- dpsynth (PRV upper bound, coarse-to-fine search),
- Opacus `get_noise_multiplier` with its PRV and RDP accountants,
- dp-accounting `calibrate_dp_mechanism` with the PLD accountant,
and checks every σ found against the PLD accountant (ε at that σ). Prints a table and writes
JSON (default bench/results/calibrate.json).

    python bench/calibrate.py [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
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

from dpsynth.privacy import accounting

SETTINGS = [
    # (epsilon, delta, q, steps)
    (1.0, 1e-5, 0.004, 1_000),
    (1.0, 1e-5, 0.004, 20_000),
    (8.0, 1e-5, 256 / 60_000, 14_000),
    (3.0, 1e-5, 0.01, 100_000),
]


def pld_accountant() -> pld_privacy_accountant.PLDAccountant:
    return pld_privacy_accountant.PLDAccountant(
        neighboring_relation=dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
    )


def pld_epsilon(sigma: float, q: float, steps: int, delta: float) -> float:
    accountant = pld_accountant()
    event = dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(sigma))
    accountant.compose(event, steps)
    return accountant.get_epsilon(delta)


def timed(func: Callable[[], float]) -> tuple[float, float]:
    start = time.perf_counter()
    value = func()
    return value, time.perf_counter() - start


def tools_for(epsilon: float, delta: float, q: float, steps: int) -> dict[str, Callable[[], float]]:
    """The calibrations to time for one setting, each returning σ."""

    def ours() -> float:
        return accounting.calibrate_noise(epsilon, delta, q, steps).noise_multiplier

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
        "dpsynth (PRV)": ours,
        "opacus prv": opacus("prv"),
        "opacus rdp": opacus("rdp"),
        "dp-accounting pld": pld,
    }


def run(settings: list[tuple[float, float, float, int]]) -> list[dict]:
    """Time every tool on every setting; check each σ with the PLD accountant."""
    rows = []
    for epsilon, delta, q, steps in settings:
        base = {"epsilon": epsilon, "delta": delta, "q": q, "steps": steps}
        for name, func in tools_for(epsilon, delta, q, steps).items():
            accounting._compose_cached.cache_clear()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                try:
                    sigma, seconds = timed(func)
                except Exception as exc:  # a reference tool failing is a result too
                    rows.append({**base, "tool": name, "error": f"{type(exc).__name__}: {exc}"})
                    continue
            rows.append(
                {
                    **base,
                    "tool": name,
                    "sigma": sigma,
                    "seconds": seconds,
                    "pld_epsilon_at_sigma": pld_epsilon(sigma, q, steps, delta),
                }
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="Only the two smallest settings.")
    parser.add_argument("--json", type=Path, default=Path("bench/results/calibrate.json"))
    args = parser.parse_args()
    rows = run(SETTINGS[:2] if args.quick else SETTINGS)
    table = Table(title="noise calibration (one call each)")
    for column in ("ε", "δ", "q", "T", "tool", "σ", "seconds", "PLD ε at σ"):
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
        )
    Console().print(table)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(rows, indent=2) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
