"""One SmartNoise-Synth run (MST or AIM) on a pre-binned table, inside SmartNoise's own venv.

bench/tables_peers.py starts this script with the Python of `bench/.venv-smartnoise` (which
has smartnoise-synth and no dpsynth): it must import nothing from dpsynth. Input: an int32
matrix of public bucket codes (`--codes`, .npy, one column per schema column, code < size) and
the domain sizes (`--sizes`, JSON list). Each column gets a SmartNoise `LabelTransformer`
fitted on the public code range 0..size-1, not on the data, so the synthesizer's domain is the
schema's whole public domain and no budget goes to preprocessing (`preprocessor_eps=0`).
Output: the sampled codes (`--out`, .npy) and a timing JSON (`--timing`): start-up and
loading, fit and sample seconds (wall and CPU), peak RSS, versions. Run with `python -u` so
that AIM's per-round lines (`verbose`) survive a kill at the time limit.
"""

from __future__ import annotations

import time

START = time.perf_counter()

import argparse  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
from importlib.metadata import version  # noqa: E402


def cpu_seconds() -> float:
    """User + system seconds of this process so far (all its threads)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    """Fit, sample, write codes and timings (see the module docstring)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--synth", choices=("mst", "aim"), required=True)
    parser.add_argument("--codes", required=True)
    parser.add_argument("--sizes", required=True)
    parser.add_argument("--epsilon", type=float, required=True)
    parser.add_argument("--delta", type=float, required=True)
    parser.add_argument("--n", type=int, required=True)
    parser.add_argument("--rounds", type=int, default=None, help="AIM rounds [16 × columns]")
    parser.add_argument("--out", required=True)
    parser.add_argument("--timing", required=True)
    args = parser.parse_args()

    import numpy as np
    import pandas as pd
    from snsynth import Synthesizer
    from snsynth.transform import LabelTransformer, TableTransformer

    codes = np.load(args.codes)
    with open(args.sizes) as handle:
        sizes = json.load(handle)
    frame = pd.DataFrame(codes, columns=[f"c{j}" for j in range(codes.shape[1])])
    columns = []
    for size in sizes:
        column = LabelTransformer(nullable=False)
        column.fit(list(range(size)))  # the public domain, not the data
        columns.append(column)
    transformer = TableTransformer(columns)
    options: dict = {"verbose": True}
    if args.synth == "aim" and args.rounds:
        options["rounds"] = args.rounds
    synth = Synthesizer.create(args.synth, epsilon=args.epsilon, delta=args.delta, **options)
    loaded, loaded_cpu = time.perf_counter(), cpu_seconds()
    synth.fit(frame, transformer=transformer, preprocessor_eps=0.0)
    fitted, fitted_cpu = time.perf_counter(), cpu_seconds()
    rows = synth.sample(args.n)
    values = rows.to_numpy() if hasattr(rows, "to_numpy") else np.asarray(rows)
    np.save(args.out, values.astype(np.int32))
    sampled, sampled_cpu = time.perf_counter(), cpu_seconds()
    timing = {
        "startup_and_load_seconds": loaded - START,
        "fit_seconds": fitted - loaded,
        "sample_seconds": sampled - fitted,
        "startup_and_load_cpu_seconds": loaded_cpu,
        "fit_cpu_seconds": fitted_cpu - loaded_cpu,
        "sample_cpu_seconds": sampled_cpu - fitted_cpu,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "epsilon_left_for_training": synth.epsilon,
        "versions": {p: version(p) for p in ("smartnoise-synth", "mbi", "jax", "numpy")},
    }
    with open(args.timing, "w") as handle:
        json.dump(timing, handle)


if __name__ == "__main__":
    main()
