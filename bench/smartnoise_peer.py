"""SmartNoise-Synth's MST and AIM as peers in bench/tables_peers.py: their own venv, the public
binning of the table they are given, the run under a time limit, and the decoding of their rows.

What SmartNoise is given (the same public facts as dpsynth's table methods, no more):
- its own virtual environment, `bench/.venv-smartnoise` (git-ignored), created on first use
  with `pip install smartnoise-synth==1.0.8`; dpsynth never imports it;
- the training rows pre-binned by the bench with the schema's public domain, the same rule
  as the marginal metric (`dpsynth.evaluation.marginals`): a number is clipped to its public
  [min, max] (the rule dpsynth's codec trains with) and put in one of `BINS` equal-width bins;
  a category becomes its index in the schema's list (a value outside it is an error, as for
  dpsynth). Each column's SmartNoise transformer is fitted on the public code range, never on
  the data, so the domain is the schema's whole domain and `preprocessor_eps` is 0: nothing
  is spent on preprocessing (SmartNoise's own BinTransformer would take the same bounds, but
  its LabelTransformer reads the category list off the data);
- the run's ε and δ (SmartNoise converts them to ρ-zCDP with OpenDP's `cdp_rho`).
Its sampled codes are decoded with the same public rule as dpsynth's binned methods: a
category by its index, a number drawn uniformly inside its bin (an integer column: uniformly
among the integers inside the bin; the bin's rounded centre when it holds none).

Timing: `train_seconds` (and `train_cpu_seconds`) is the bench's binning of the private rows
plus the child process up to the end of `fit` (start-up, import, load, fit); `sample_seconds`
is SmartNoise's `sample`;
peak memory is the child's (the bench's own reading of the CSV is not counted, while
dpsynth's `train` reads its CSV itself: its peak includes that).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bench.measure import run_measured
from dpsynth.data.schema import Schema
from dpsynth.data.table_codec import RawTable
from dpsynth.evaluation.marginals import BINS, category_codes, marginal_columns, numeric_codes

BENCH = Path(__file__).resolve().parent
VENV = BENCH / ".venv-smartnoise"
CHILD = BENCH / "smartnoise_child.py"
PACKAGE = "smartnoise-synth==1.0.8"
PEERS = {"smartnoise-mst": "mst", "smartnoise-aim": "aim"}
# Single-threaded JAX/XLA and BLAS on a shared machine (dpsynth runs get OMP_NUM_THREADS=1).
THREAD_ENV = {
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "JAX_PLATFORMS": "cpu",
    "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1",
}


def venv_python(venv: Path = VENV) -> Path:
    """The SmartNoise venv's Python, creating the venv and installing SmartNoise-Synth first
    when it is not there yet (a few minutes, once)."""
    python = venv / "bin" / "python"
    stamp = venv / ".installed"
    if stamp.is_file() and stamp.read_text().strip() == PACKAGE:
        return python
    print(f"creating {venv} with {PACKAGE} (once)", file=sys.stderr, flush=True)
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", str(venv)], check=True)
    with (venv / "install.log").open("w") as log:  # pip's notes stay out of the bench's output
        done = subprocess.run(
            [str(python), "-m", "pip", "install", PACKAGE], stdout=log, stderr=subprocess.STDOUT
        )
    if done.returncode != 0:
        raise RuntimeError(f"pip install {PACKAGE} failed: see {venv / 'install.log'}")
    stamp.write_text(PACKAGE + "\n")
    return python


def public_codes(raw: RawTable, schema: Schema, bins: int = BINS) -> tuple[np.ndarray, list[int]]:
    """The rows as public bucket codes for SmartNoise (see the module docstring): int32
    [rows, used columns] and each column's domain size (bins, or the category count)."""
    columns = marginal_columns(schema)
    codes = np.empty((raw.n, len(columns)), dtype=np.int32)
    sizes = []
    for j, column in enumerate(columns):
        values = raw.column(column.name)
        if column.is_numeric:
            assert column.min is not None and column.max is not None
            numbers = np.clip(values.astype(np.float64), column.min, column.max)
            codes[:, j] = numeric_codes(numbers, column.min, column.max, bins)
            sizes.append(bins)
        else:
            codes[:, j] = category_codes(values, column)
            if (codes[:, j] >= len(column.categories)).any():
                raise ValueError(f"{column.name}: a value outside the schema's category list")
            sizes.append(len(column.categories))
    return codes, sizes


def decode_codes(
    codes: np.ndarray, schema: Schema, rng: np.random.Generator, bins: int = BINS
) -> pd.DataFrame:
    """Sampled codes → a frame with the schema's header (ignored columns empty): categories by
    index, numbers uniformly inside their bin (integers: among the integers in the bin)."""
    decoded: dict[str, Any] = {}
    for j, column in enumerate(marginal_columns(schema)):
        code = codes[:, j].astype(np.int64)
        if not column.is_numeric:
            decoded[column.name] = np.asarray(column.categories, dtype=object)[code]
            continue
        assert column.min is not None and column.max is not None
        low, width = column.min, (column.max - column.min) / bins
        left = low + code * width
        if column.type == "numeric":
            decoded[column.name] = np.clip(
                left + rng.uniform(0.0, 1.0, len(code)) * width, column.min, column.max
            )
            continue
        first = np.ceil(left - 1e-9)
        last = np.where(code == bins - 1, np.floor(column.max), np.ceil(left + width - 1e-9) - 1)
        empty = first > last
        draw = first + np.floor(rng.uniform(0.0, 1.0, len(code)) * (last - first + 1))
        centre = np.round(left + width / 2)
        values = np.clip(np.where(empty, centre, draw), column.min, column.max)
        decoded[column.name] = values.astype(np.int64)
    return pd.DataFrame({c.name: decoded.get(c.name, "") for c in schema.columns})


def run_peer(
    peer: str,
    raw: RawTable,
    schema: Schema,
    epsilon: float,
    delta: float,
    n: int,
    folder: Path,
    limits: tuple[float, float],
    aim_rounds: int | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """Fit and sample one SmartNoise peer on `raw`; write `folder/synth.csv` (same header as
    the schema). `limits`: CPU and wall seconds for the child (fit and sample). Returns the
    timings, or `timed_out` (`killed_by` the limit) with AIM's progress at the limit."""
    python = venv_python()
    start, start_cpu = time.perf_counter(), time.process_time()
    codes, sizes = public_codes(raw, schema)
    np.save(folder / "codes.npy", codes)
    (folder / "sizes.json").write_text(json.dumps(sizes))
    binning_s, binning_cpu = time.perf_counter() - start, time.process_time() - start_cpu
    del codes
    command = [
        str(python), "-u", str(CHILD), "--synth", PEERS[peer],
        "--codes", str(folder / "codes.npy"), "--sizes", str(folder / "sizes.json"),
        "--epsilon", repr(epsilon), "--delta", repr(delta), "--n", str(n),
        "--out", str(folder / "synth.npy"), "--timing", str(folder / "timing.json"),
    ]  # fmt: skip
    if aim_rounds:
        command += ["--rounds", str(aim_rounds)]
    done = run_measured(command, limits[0], env=os.environ | THREAD_ENV, wall_limit_s=limits[1])
    rounds = re.findall(r"Budget Used ([0-9.eE+-]+)", done.stdout)
    progress = {"rounds_done": len(rounds), "budget_used": float(rounds[-1]) if rounds else None}
    if done.timed_out:
        return {"timed_out": True, "killed_by": done.killed_by} | progress
    if done.returncode != 0:
        raise RuntimeError(f"{peer} failed (exit {done.returncode}): {done.stderr.strip()[-1500:]}")
    timing = json.loads((folder / "timing.json").read_text())
    sampled = np.load(folder / "synth.npy")
    frame = decode_codes(sampled, schema, np.random.default_rng(seed))
    frame.to_csv(folder / "synth.csv", index=False)
    return {
        "train_seconds": round(
            binning_s + timing["startup_and_load_seconds"] + timing["fit_seconds"], 1
        ),
        "train_cpu_seconds": round(
            binning_cpu + timing["startup_and_load_cpu_seconds"] + timing["fit_cpu_seconds"], 1
        ),
        "sample_seconds": round(timing["sample_seconds"], 1),
        "sample_cpu_seconds": round(timing["sample_cpu_seconds"], 1),
        "wall_seconds": round(done.seconds, 1),
        "peak_rss_mb": None if np.isnan(done.peak_rss_mb) else round(done.peak_rss_mb),
        "fit_seconds": round(timing["fit_seconds"], 1),
        "versions": timing["versions"],
        "aim_rounds": aim_rounds if peer == "smartnoise-aim" else None,
    } | (progress if peer == "smartnoise-aim" else {})
