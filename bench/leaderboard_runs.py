"""The leaderboard's plumbing: which methods and presets run, and the `dpsynth` CLI they run
through (one process per command, `--json`), with the fields every row shares."""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
CLI = [sys.executable, "-c", "from dpsynth.cli import main; main()"]


def registered_methods() -> list[str]:
    """Every backend the registry knows, in its order."""
    from dpsynth.methods.registry import method_names

    return list(method_names())


def data_info(data: str) -> Any:
    """The public description of a data set (record count, shape, label set)."""
    from dpsynth.data.sources import load_data

    return load_data(data).info()


def is_table(data: str) -> bool:
    """A table spec (a built-in table or csv:FILE) rather than images."""
    from dpsynth.data.sources import is_table_spec

    return is_table_spec(data)


def methods_for(modality: str) -> list[str]:
    """The registered backends that take `modality` (`Method.modalities`), in registry order."""
    from dpsynth.methods.registry import get_method

    return [name for name in registered_methods() if modality in get_method(name).modalities]


def table_methods() -> list[str]:
    """The registered backends that take tables, in registry order."""
    return methods_for("table")


def preset_for(method: str, info: Any, epsilon: str, wanted: str | None) -> str:
    """`wanted` if given (`small` when the method lacks it; a tier, `auto` or `quality`, as
    `train` resolves it, UsageError for a method without that tier), else the method's
    recommendation.

    The recommendation comes from the backend (`Method.recommended_preset`), so a new
    backend or preset needs no edit here.
    """
    from dpsynth.methods.recommend import TIERS, resolve_preset
    from dpsynth.methods.registry import get_method

    backend = get_method(method)
    if wanted in TIERS:
        return resolve_preset(backend, wanted, info, float(epsilon))
    if wanted:
        return wanted if wanted in backend.presets_for(info) else "small"
    return backend.recommended_preset(info, float(epsilon))


def default_synthetic_n(data: str) -> int:
    """10,000 synthetic images, 2,000 for digits (its test split has 360); 20,000 table rows."""
    if is_table(data):
        return 20_000
    return 2000 if data.split(":")[0] == "digits" else 10_000


def run_cli(args: list[str]) -> tuple[dict, float]:
    """Run `dpsynth ARGS --json`: its JSON and wall-clock seconds; RuntimeError if it fails."""
    start = time.perf_counter()
    done = subprocess.run([*CLI, *args, "--json"], capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(
            f"dpsynth {shlex.join(args)} failed (exit {done.returncode}): "
            f"{done.stderr.strip()[-2000:]}"
        )
    return json.loads(done.stdout), seconds


def test_spec(args: argparse.Namespace) -> str:
    """The held-out split: --test, else `DATA:test` (the built-in data sets)."""
    return args.test or f"{args.data}:test"


def _run_row(
    method: str,
    preset: str,
    epsilon: str,
    args: argparse.Namespace,
    train: tuple[dict[str, Any], float],
    sample: tuple[dict[str, Any], float],
) -> dict[str, Any]:
    """The fields every leaderboard row shares: the run's settings, its privacy and its times
    (`train` and `sample` are the commands' JSON and seconds)."""
    (trained, train_s), (sampled, sample_s) = train, sample
    return {
        "method": method,
        "preset": preset,
        "overrides": list(args.set or []),
        "epsilon": trained["epsilon"],
        "epsilon_target": epsilon,
        "delta": trained["delta"],
        "private": trained["private"],
        "noise_multiplier": trained["noise_multiplier"],
        "sampling_rate": trained["sampling_rate"],
        "steps": trained["steps"],
        "train_seconds": round(train_s, 1),
        "n": sampled["n"],
        "sample_seconds": round(sample_s, 1),
    }
