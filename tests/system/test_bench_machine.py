"""bench/machine.py: what every benchmark records beside its figures."""

from __future__ import annotations

import importlib
import subprocess
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def machine():
    return importlib.import_module("bench.machine")


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=BENCH, capture_output=True, text=True, check=True
    ).stdout.strip()


def test_the_commit_is_the_checkouts_head(machine):
    try:
        head = _git("rev-parse", "HEAD")
        dirty = bool(_git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    assert machine.describe("cpu")["commit"] == head + ("+dirty" if dirty else "")


def test_a_cpu_run_names_no_gpu(machine):
    described = machine.describe("cpu")
    assert described["gpu"] is None
    assert described["device"] == "cpu" and described["cpu_cores"] >= 1
