"""What every benchmark records next to its figures: the machine, the software and the date."""

from __future__ import annotations

import os
import platform
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


def describe(device: str = "cpu") -> dict[str, Any]:
    """Date (UTC), CPU model and cores, load, GPU name if any, Python, torch and thread counts."""
    out: dict[str, Any] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
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
    if torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name(0)
    return out
