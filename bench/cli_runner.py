"""The dpsynth CLI run as a user runs it, for the table benches: timed, measured, its failures
summarised (bench/tables_real.py, bench/tables_units.py, bench/tables_dpmm.py)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench.measure import mb, run_measured

# -P: the children's working folder is not put on sys.path (only PYTHONPATH and the install
# decide which dpsynth runs, as `where` reports)
CLI = [sys.executable, "-P", "-m", "dpsynth.cli"]


def uptime() -> str:
    """`uptime`'s line (the load averages), or the load from os when there is no uptime."""
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "load average: " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def load1(text: str | None) -> float | None:
    """The 1-minute load average in an `uptime` line."""
    found = re.search(r"load averages?:\s*([\d.]+)", text or "")
    return float(found.group(1)) if found else None


class Cli:
    """The dpsynth CLI as a user runs it, in `cwd`, with `source` on PYTHONPATH when given."""

    def __init__(self, cwd: Path, source: Path | None, timeout_min: float) -> None:
        self.cwd = cwd
        self.env = dict(os.environ)
        if source is not None:
            self.env["PYTHONPATH"] = str(source)
        self.limit = timeout_min * 60

    def where(self) -> str:
        """The dpsynth package the children import (its CLI's folder)."""
        done = subprocess.run(
            [CLI[0], "-P", "-c", "import dpsynth.cli as c; print(c.__file__)"],
            capture_output=True,
            text=True,
            env=self.env,
            cwd=self.cwd,
        )
        return done.stdout.strip() or done.stderr.strip()[-300:]

    def run(self, args: list[str]) -> dict[str, Any]:
        """Run `dpsynth ARGS`: exit code, stdout, stderr tail, wall and CPU seconds, peak MB."""
        done = run_measured(
            [*CLI, *args],
            self.limit * (os.cpu_count() or 1),
            env=self.env,
            wall_limit_s=self.limit,
            cwd=self.cwd,
        )
        return {
            "command": "dpsynth " + shlex.join(args),
            "returncode": done.returncode,
            "stdout": done.stdout,
            "stderr": done.stderr.strip()[-3000:],
            "seconds": round(done.seconds, 2),
            "cpu_seconds": round(done.cpu_seconds, 2),
            "peak_rss_mb": mb(done.peak_rss_mb),
            "timed_out": done.timed_out,
        }


def failure(step: str, done: dict[str, Any], limit_min: float) -> str:
    """The error text of a failed step."""
    if done["timed_out"]:
        return f"{step}: did not finish in {limit_min:g} wall min"
    return f"{step} failed (exit {done['returncode']}): {done['stderr'] or done['stdout'][-1500:]}"


def compact(document: dict[str, Any]) -> dict[str, Any]:
    """A command's JSON without its long values (kept: what fits in 2,000 characters)."""
    return {k: v for k, v in document.items() if len(json.dumps(v, default=str)) <= 2000}
