"""Benchmark: docs/privacy.md's audit table — each mechanism sound and with a deliberate error.

Each row is one mechanism audited through its own code (`dpsynth.auditing`, white-box) at
`--epsilon`, sound and under `--break noise:F`, `--break sensitivity:F` and `--break
noise:1.4142`, with `canaries` per run × `runs` runs (the multiple-run audit pools them into
the trials and family tests). Writes JSON
(default bench/results/audit.json): per row and variant the claimed ε, the lower bound, the
judging test, the parts' bounds against their own claims, the verdict and the wall time.

    OMP_NUM_THREADS=1 python -m bench.audit_table [--epsilon 1] [--factor 2] [--rows a,b]
        [--variants sound,noise,sensitivity,noise:1.4142] [--scale 1.0] [--json PATH]

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

# name: (method, preset, data, canaries per run, runs[, train's --set overrides]): the runs of
# docs/privacy.md's table, each about 1–2 minutes on one thread of this 2-core CPU.
ROWS: dict[str, tuple[Any, ...]] = {
    "dpsgd": ("pge", "tiny", "digits", 5000, 2000),
    "marginal-mst": ("mst", "small", "german-credit", 1_000_000, 12),
    "marginal-aim": ("aim", "small", "german-credit", 1_000_000, 12),
    "dpaf-once": ("dpaf", "mnist", "mnist-5k", 5000, 500),
    "functional": ("dpkernel", "tiny", "digits", 5000, 120),
    # the same mechanism's code and preset with every record in every step (q = 1): its noise
    # and sensitivity without subsampling, where a tight audit needs some 10^5 canaries, not 10^7
    "functional-full-batch": ("dpkernel", "tiny", "digits", 5000, 80, {"batch_size": "1437"}),
    # psg's 8×8 ε ≤ 1 preset gives the central images half of ε
    "central-images-half": ("psg", "small-eps1", "digits", 5000, 120),
    "frequency-class": ("freq", "mnist", "mnist-5k", 20000, 20),
    "teacher": ("freq", "mnist-teacher", "mnist-5k", 5000, 45),
    "dpaf-windows": ("dpaf", "small", "digits", 5000, 50),
    # several times dearer a canary: the pooled frequency model (one release per canary) and
    # the central images at a fifth of ε
    "frequency-pooled": ("freq", "small", "digits", 20000, 5),
    "central-images": ("psg", "small", "digits", 5000, 55),
}


def audit_row(
    name: str, epsilon: float, break_mode: str | None, scale: float, seed: int
) -> dict[str, Any]:
    """One audit of row `name`, timed, as JSON."""
    method, preset, data, canaries, runs, *rest = ROWS[name]
    overrides = rest[0] if rest else None
    runs = max(1, round(runs * scale))
    start = time.perf_counter()
    result = api.audit(
        method, epsilon, preset=preset, data=data, canaries=canaries, runs=runs, seed=seed,
        break_mode=break_mode, overrides=overrides,
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
    # a variant is "sound", a break mode (at --factor) or MODE:FACTOR
    parser.add_argument("--variants", default="sound,noise,sensitivity,noise:1.4142")
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=Path("bench/results/audit.json"))
    args = parser.parse_args(argv)
    runs: list[dict[str, Any]] = []
    out = {"machine": describe(), "command": " ".join(sys.argv), "runs": runs}
    for name in args.rows.split(","):
        for variant in args.variants.split(","):
            mode = None if variant == "sound" else variant
            if mode is not None and ":" not in mode:
                mode = f"{mode}:{args.factor:g}"
            row = audit_row(name, args.epsilon, mode, args.scale, args.seed)
            runs.append(row)
            parts = "; ".join(
                f"{p['mechanism']}: {p['lower_bound']:.3f} / {p['claimed_epsilon']:.3f}"
                for p in row["parts"]
            )
            family = (row.get("composition") or {}).get("family_lower_bound")
            print(
                (f"composed family {family:.3f}  " if family else "")
                + f"{name:18} {variant:11} claim {row['claimed_epsilon']:.3f} bound "
                f"{row['lower_bound']:.3f} ({row['test']}) {row['verdict']:4} "
                f"{row['seconds']:7.1f} s  {parts}",
                flush=True,
            )
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(out, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
