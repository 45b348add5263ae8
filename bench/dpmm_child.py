"""One dpmm run (MST or AIM pipeline) on a training CSV, inside dpmm's own venv.

bench/tables_dpmm.py starts this script with the Python of the dpmm venv
(~/.cache/dpsynth-bench/dpmm-venv: dpmm==0.1.9, numpy 1.26, pandas 2.1, Python 3.11), so it
imports nothing from dpsynth or the bench. What it does is what a dpmm user does with a CSV:

- read it with pandas (numbers become numbers; only an empty cell is missing, as the bench
  wrote them), drop the columns the bench names with `--drop` (identifiers and free text,
  which a user would not hand to a marginal model), parse the `--dates` columns to datetimes
  and read the `--target` column as labels (the one fact the user declares, as with dpsynth's
  `data schema --target`);
- fit dpmm's pipeline (`MSTPipeline` / `AIMPipeline`) with its defaults: its TableBinner
  (PrivTree binning at `--proc-epsilon`, split over the numeric columns, with DP bounds since
  no bounds are given), a missing indicator column per column with empty cells, categories
  read off the data (dpmm logs "PrivacyLeakage" for each: no domain is given), domain
  compression on; the model at `--epsilon`, `--delta`;
- generate `--n` rows, map dates back to the file's format, write the dropped columns empty
  and the columns in the file's order (`--out`, CSV, empty cells empty).

Progress goes to stdout, one line per inference of the graphical model ("estimate K start
T s": MST runs two, AIM one per round), so that a run killed at the time limit shows how far
it came. `--info` gets a JSON: start-up and load, fit and generate seconds (wall and CPU), peak RSS,
versions, the preprocessing's facts (bins per numeric column, categories per categorical, the
missing-indicator and constant columns, ε spent per column), the model's cliques, and the
warnings dpmm logged. `--domain` gets the columns as dpmm saw them ({"columns": [...]}), for
the bench's "(other)" metric (dpmm has no "other" category).
"""

from __future__ import annotations

import time

START = time.perf_counter()

import argparse  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import resource  # noqa: E402
from importlib.metadata import version  # noqa: E402


def cpu_seconds() -> float:
    """User + system seconds of this process so far (all its threads)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class Recorder(logging.Handler):
    """Keeps dpmm's log records (its PrivacyLeakage warnings among them)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.levelname}: {record.getMessage()}")


def main() -> None:
    """Read, fit, generate, write (see the module docstring)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--train", required=True)
    parser.add_argument("--method", choices=("mst", "aim"), required=True)
    parser.add_argument("--epsilon", type=float, required=True, help="the model's ε")
    parser.add_argument("--proc-epsilon", type=float, required=True, help="the binner's ε")
    parser.add_argument("--delta", type=float, required=True)
    parser.add_argument("--n", type=int, required=True)
    parser.add_argument("--target", required=True)
    parser.add_argument("--drop", default="[]", help="JSON list of columns not given to dpmm")
    parser.add_argument("--dates", default="{}", help="JSON {column: strftime format or null}")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--n-jobs", type=int, default=-1, help="dpmm's n_jobs [-1: its default]")
    parser.add_argument("--max-model-size", type=float, default=None, help="MB [pipeline: none]")
    parser.add_argument("--out", required=True)
    parser.add_argument("--info", required=True)
    parser.add_argument("--domain", required=True)
    args = parser.parse_args()

    import numpy as np
    import pandas as pd
    from dpmm.models.base.mbi import FactoredInference
    from dpmm.pipelines import AIMPipeline, MSTPipeline

    # Progress on stdout (run with -u, so a kill at the time limit keeps it): one line per
    # inference (MST: two; AIM: one after the 1-way marginals, then one per round), with the
    # seconds so far.
    estimate = FactoredInference.estimate
    calls = [0]

    def traced(self, *a, **k):
        calls[0] += 1
        print(f"estimate {calls[0]} start {time.perf_counter() - START:.0f} s", flush=True)
        return estimate(self, *a, **k)

    FactoredInference.estimate = traced
    recorder = Recorder()
    logging.getLogger("dpmm").addHandler(recorder)
    logging.getLogger("dpmm").setLevel(logging.INFO)

    drop = json.loads(args.drop)
    dates: dict[str, str | None] = json.loads(args.dates)
    frame = pd.read_csv(args.train, keep_default_na=False, na_values=[""], low_memory=False)
    order = list(frame.columns)
    frame = frame.drop(columns=[c for c in drop if c in frame.columns])
    for name, fmt in dates.items():
        if name in frame.columns:
            parsed = pd.to_datetime(frame[name], format=fmt or "ISO8601", errors="coerce", utc=True)
            frame[name] = parsed.dt.tz_localize(None)
    if args.target in frame.columns:
        target = frame[args.target]
        frame[args.target] = target.where(target.isna(), target.astype(str)).astype(object)
    given = {c: str(t) for c, t in frame.dtypes.items()}

    pipeline_class = {"mst": MSTPipeline, "aim": AIMPipeline}[args.method]
    pipeline = pipeline_class(
        epsilon=args.epsilon,
        delta=args.delta,
        proc_epsilon=args.proc_epsilon,
        n_jobs=args.n_jobs,
        max_model_size=args.max_model_size,
    )
    loaded, loaded_cpu = time.perf_counter(), cpu_seconds()
    pipeline.fit(frame, random_state=args.seed)
    fitted, fitted_cpu = time.perf_counter(), cpu_seconds()
    synth = pipeline.generate(n_records=args.n, random_state=args.seed + 1)
    generated, generated_cpu = time.perf_counter(), cpu_seconds()

    for name, fmt in dates.items():
        if name in synth.columns:
            values = pd.to_datetime(synth[name], errors="coerce")
            text = values.dt.strftime(fmt) if fmt else values.map(lambda v: v.isoformat())
            synth[name] = text.where(values.notna(), "")
    out = pd.DataFrame({c: synth[c] if c in synth.columns else "" for c in order})
    out.to_csv(args.out, index=False, na_rep="")

    proc = pipeline.proc
    gen = pipeline.gen.generator
    categories = {c: len(v) for c, v in proc.categories.items()}
    bins = {c: int(b.n_bins) for c, b in proc.binners.items()}
    info = {
        "startup_and_load_seconds": loaded - START,
        "fit_seconds": fitted - loaded,
        "generate_seconds": generated - fitted,
        "startup_and_load_cpu_seconds": loaded_cpu,
        "fit_cpu_seconds": fitted_cpu - loaded_cpu,
        "generate_cpu_seconds": generated_cpu - fitted_cpu,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "versions": {p: version(p) for p in ("dpmm", "numpy", "pandas", "opendp", "scipy")},
        "columns_given": given,
        "rows_given": len(frame),
        "numeric_bins": bins,
        "categorical_levels": categories,
        "missing_indicators": sorted(proc.nan_columns),
        "constant_columns_dropped": sorted(str(c) for c in proc.static_columns),
        "binner_epsilon_spent": {
            c: (None if v is None else float(v)) for c, v in proc.spent_epsilon.items()
        },
        "model_epsilon": float(gen.epsilon),
        "model_delta": float(gen.delta),
        "model_rho": float(gen.rho),
        "n_jobs": int(gen.n_jobs),
        "max_model_size": args.max_model_size,
        "cliques": [list(map(str, c)) for c in (gen.cliques or [])],
        "inferences": calls[0],
        "privacy_leakage_warnings": sum("PrivacyLeakage" in line for line in recorder.lines),
        "log": recorder.lines[-50:],
        "synthetic_rows": len(out),
        "synthetic_empty_share": float(np.mean(synth.isna().to_numpy())) if len(synth) else None,
    }
    with open(args.info, "w") as handle:
        json.dump(info, handle, indent=1, default=str)
    domain = [
        {"name": c, "type": "categorical", "levels": categories[c]}
        if c in categories
        else {"name": c, "type": "numeric", "bins": bins.get(c)}
        for c in frame.columns
    ]
    with open(args.domain, "w") as handle:
        json.dump({"source": "dpmm TableBinner", "columns": domain}, handle, indent=1)


if __name__ == "__main__":
    main()
