"""Benchmark: docs/privacy.md's audit table — each mechanism sound and with a deliberate error.

Each row is one mechanism audited through its own code (`dpsynth.auditing`, white-box) at
`--epsilon`, sound and under `--break noise:F` and `--break sensitivity:F`, with `canaries`
per run × `runs` runs (the multiple-run audit pools them into one trials test). Writes JSON
(default bench/results/audit.json): per row and variant the claimed ε, the lower bound, the
judging test, the parts' bounds against their own claims, the verdict and the wall time.

    OMP_NUM_THREADS=1 python -m bench.audit_table [--epsilon 1] [--factor 2] [--rows a,b]
        [--variants sound,noise,sensitivity] [--scale 1.0] [--json PATH]

`--scale` multiplies every row's run count (0.2 for a quick look).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from bench.machine import describe
from dpsynth import api

# name: (method, preset, data, canaries per run, runs): 100,000 trials each, 4,000,000 on a
# table (its selections' ε_s is small, 0.04 for mst: a 2× error moves a rate by 7%).
ROWS: dict[str, tuple[str, str, str, int, int]] = {
    "dpsgd": ("pge", "tiny", "digits", 5000, 20),
    "functional": ("dpkernel", "tiny", "digits", 1000, 100),
    "frequency-pooled": ("freq", "small", "digits", 20000, 5),
    "frequency-class": ("freq", "mnist", "mnist-5k", 20000, 5),
    "central-images": ("psg", "small", "digits", 5000, 20),
    # psg's 8×8 ε ≤ 1 preset gives the central images half of ε: their own part audited near
    # ε = 1 at --epsilon 2.
    "central-images-half": ("psg", "small-eps1", "digits", 5000, 20),
    "teacher": ("freq", "mnist-teacher", "mnist-5k", 5000, 20),
    "dpaf-windows": ("dpaf", "small", "digits", 5000, 20),
    "dpaf-once": ("dpaf", "mnist", "mnist-5k", 5000, 20),
    "marginal-mst": ("mst", "small", "german-credit", 20000, 200),
    "marginal-aim": ("aim", "small", "german-credit", 20000, 200),
}


def audit_row(
    name: str, epsilon: float, break_mode: str | None, scale: float, seed: int
) -> dict[str, Any]:
    """One audit of row `name`, timed, as JSON."""
    method, preset, data, canaries, runs = ROWS[name]
    runs = max(1, round(runs * scale))
    start = time.perf_counter()
    result = api.audit(
        method, epsilon, preset=preset, data=data, canaries=canaries, runs=runs, seed=seed,
        break_mode=break_mode,
    )  # fmt: skip
    return {
        "row": name,
        "break": break_mode,
        "seconds": round(time.perf_counter() - start, 1),
        **result.to_json(),
    }


def main(argv: list[str] | None = None) -> int:
    """Run the rows and variants asked for; write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--factor", type=float, default=2.0)
    parser.add_argument("--rows", default=",".join(ROWS))
    parser.add_argument("--variants", default="sound,noise,sensitivity")
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=Path("bench/results/audit.json"))
    args = parser.parse_args(argv)
    runs: list[dict[str, Any]] = []
    out = {"machine": describe(), "command": " ".join(sys.argv), "runs": runs}
    for name in args.rows.split(","):
        for variant in args.variants.split(","):
            mode = None if variant == "sound" else f"{variant}:{args.factor:g}"
            row = audit_row(name, args.epsilon, mode, args.scale, args.seed)
            runs.append(row)
            parts = "; ".join(
                f"{p['mechanism']}: {p['lower_bound']:.3f} / {p['claimed_epsilon']:.3f}"
                for p in row["parts"]
            )
            print(
                f"{name:18} {variant:11} claim {row['claimed_epsilon']:.3f} bound "
                f"{row['lower_bound']:.3f} ({row['test']}) {row['verdict']:4} "
                f"{row['seconds']:7.1f} s  {parts}",
                flush=True,
            )
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(out, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
