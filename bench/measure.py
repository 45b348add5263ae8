"""Running a benchmark's child command under time limits, with its wall time, CPU time and peak
memory (bench/tables_peers.py, bench/tables_scale.py).

On a shared machine the wall clock depends on everybody else's load, so a command gets two
limits: CPU seconds of its process group (the work it did, what `--timeout` means in the table
benchmarks) and a wall-clock cap (a safety net against a command that waits or is starved).
A watchdog thread reads the group's CPU time from /proc every `POLL_S` seconds and kills the
whole group (SIGKILL) at either limit.

Peak RSS comes from `/usr/bin/time -f %M` wrapped around the command: a child forked by the
(large) benchmark process would inherit the benchmark's own high-water mark in `ru_maxrss`,
while the command that `time` forks starts from `time`'s few MB. Without `/usr/bin/time` the
`wait4` figure (an upper bound) is used. A killed command has no peak (NaN).
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

POLL_S = 2.0
TIME = Path("/usr/bin/time")


@dataclass
class Finished:
    """A child command's outcome: exit code, output, wall and CPU seconds, peak RSS (MB), and
    which limit killed it ("cpu", "wall" or None)."""

    returncode: int
    stdout: str
    stderr: str
    seconds: float
    cpu_seconds: float
    peak_rss_mb: float
    killed_by: str | None

    @property
    def timed_out(self) -> bool:
        """True when a limit killed the command."""
        return self.killed_by is not None


def group_cpu_seconds(pgid: int) -> float:
    """User + system seconds of the live processes in a process group (and of the children
    they have reaped), from /proc/PID/stat."""
    ticks = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # the process ended meanwhile
            continue
        fields = text[text.rindex(")") + 2 :].split()
        if int(fields[2]) == pgid:  # pgrp; utime, stime, cutime, cstime follow at 11..14
            ticks += sum(int(x) for x in fields[11:15])
    return ticks / os.sysconf("SC_CLK_TCK")


def run_measured(
    command: list[str],
    cpu_limit_s: float,
    env: dict[str, str] | None = None,
    wall_limit_s: float | None = None,
    cwd: Path | None = None,
) -> Finished:
    """Run `command` in its own process group; kill the group when its CPU time passes
    `cpu_limit_s` or the wall clock passes `wall_limit_s` (default 3 × `cpu_limit_s`), in the
    folder `cwd` (default: this process's)."""
    wall_limit_s = wall_limit_s if wall_limit_s is not None else 3 * cpu_limit_s
    wrapped = TIME.is_file()
    done = threading.Event()
    killed: list[str] = []
    with (
        tempfile.TemporaryFile() as out,
        tempfile.TemporaryFile() as err,
        tempfile.NamedTemporaryFile("r", suffix=".rss") as rss,
    ):
        full = [str(TIME), "-f", "%M", "-o", rss.name, *command] if wrapped else command
        start = time.perf_counter()
        child = subprocess.Popen(
            full, stdout=out, stderr=err, env=env, cwd=cwd, start_new_session=True
        )

        def watch() -> None:
            while not done.wait(POLL_S):
                if time.perf_counter() - start > wall_limit_s:
                    killed.append("wall")
                elif group_cpu_seconds(child.pid) > cpu_limit_s:
                    killed.append("cpu")
                else:
                    continue
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.pid, signal.SIGKILL)
                return

        watchdog = threading.Thread(target=watch, daemon=True)
        watchdog.start()
        _, status, usage = os.wait4(child.pid, 0)
        done.set()
        watchdog.join()
        child.returncode = os.waitstatus_to_exitcode(status)
        seconds = time.perf_counter() - start
        peak = usage.ru_maxrss / 1024
        if wrapped:
            found = [x for x in rss.read().split() if x.isdigit()]
            peak = int(found[-1]) / 1024 if found else math.nan
        out.seek(0)
        err.seek(0)
        return Finished(
            child.returncode,
            out.read().decode(errors="replace"),
            err.read().decode(errors="replace"),
            seconds,
            usage.ru_utime + usage.ru_stime,
            peak,
            killed[0] if killed else None,
        )


def mb(value: float) -> int | None:
    """A peak RSS in whole MB, None when unknown (a killed command)."""
    return None if math.isnan(value) else round(value)
