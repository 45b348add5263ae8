"""How many CPU threads dpsynth's numeric work may use, and when to advise fewer.

torch starts one compute thread per core. On a machine that other jobs keep busy, those threads
wait for each other at every parallel operation: measured on the 2-core development machine,
dpkernel's digits training took 31 minutes with torch's two threads beside four other
processes, against under 2 minutes alone (docs/leaderboard.md, "The demo"). One thread per job
is then much faster, so the CLI offers `--threads` (and `$DPSYNTH_THREADS`) and `train` advises
it when the machine is already busy. The number of threads changes no privacy guarantee: the
noise and the accounting do not depend on it.
"""

from __future__ import annotations

import contextlib
import os

from dpsynth.errors import UsageError

THREADS_ENV = "DPSYNTH_THREADS"


def limit_threads(threads: int) -> None:
    """Use at most `threads` CPU threads for torch and for the BLAS/OpenMP pools of numpy and
    scipy in this process, and in the processes it starts (through OMP_NUM_THREADS)."""
    if threads < 1:
        raise UsageError(f"{{threads}} must be at least 1, got {threads}", parameter="threads")
    import torch
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(threads)
    # torch allows this once, before any inter-op work has started; later calls keep its pool.
    with contextlib.suppress(RuntimeError):
        torch.set_num_interop_threads(threads)
    threadpool_limits(limits=threads)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    os.environ["MKL_NUM_THREADS"] = str(threads)


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the system reports it)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # macOS and Windows have no affinity call
        return max(1, os.cpu_count() or 1)


def busy_machine_advice(
    threads: int, load: float | None = None, cores: int | None = None
) -> str | None:
    """A line advising `--threads 1` when other work already fills the cores (the 1-minute load
    average at least the number of usable cores) and this process would use several threads;
    None otherwise, or where the system reports no load average."""
    if threads <= 1:
        return None
    if load is None:
        try:
            load = os.getloadavg()[0]
        except (AttributeError, OSError):  # Windows, or no /proc/loadavg
            return None
    cores = usable_cores() if cores is None else cores
    if load < cores:
        return None
    return (
        f"the machine is busy (load {load:.1f} on {cores} cores) and torch would use {threads} "
        f"threads, which then wait on each other; --threads 1 (or {THREADS_ENV}=1) is often "
        "several times faster"
    )
