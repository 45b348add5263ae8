"""What every benchmark records next to its figures: the machine, the software and the date."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any


def cpu_model() -> str:
    """The CPU's model name (from /proc/cpuinfo where there is one)."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def source_commit() -> str | None:
    """The commit of the checkout these scripts run from, with "+dirty" when tracked files
    differ from it; None outside a git checkout (figures are then tied to no commit)."""
    here = Path(__file__).resolve().parent

    def git(*args: str) -> str:
        done = subprocess.run(
            ["git", *args], cwd=here, capture_output=True, text=True, check=True, timeout=30
        )
        return done.stdout.strip()

    try:
        commit = git("rev-parse", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        return None
    return commit + ("+dirty" if dirty else "")


def describe(device: str = "cpu") -> dict[str, Any]:
    """Date (UTC), source commit, CPU model and cores, load, the GPU's name when the run is on
    CUDA, Python, torch and thread counts."""
    out: dict[str, Any] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": source_commit(),
        "cpu": cpu_model(),
        "cpu_cores": os.cpu_count(),
        "load_average_1min": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "device": device,
        "gpu": None,
        "torch": None,
    }
    try:
        import torch
    except ImportError:  # the accounting benchmark needs no torch; record its absence
        return out
    out["torch"] = torch.__version__
    out["torch_threads"] = torch.get_num_threads()
    # A GPU the run does not use is not part of its figures (the leaderboard's header names
    # the GPU when there is one, else the CPU).
    if device.startswith("cuda") and torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name(0)
    return out
