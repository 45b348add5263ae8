"""How `python -m bench.dpsgd` measures a variant: time per step, round-robin against the
non-private step, and the peak memory a few steps add (CUDA allocator or the CPU's peak RSS)."""

from __future__ import annotations

import argparse
import re
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor

from bench.dpsgd_steps import make_step
from bench.dpsgd_tasks import task


def pick_device(choice: str) -> torch.device:
    """`--device`: auto is CUDA when available; cuda without CUDA stops."""
    if choice == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if choice == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: CUDA is not available")
    return torch.device(choice)


def _status_kib(field: str) -> int:
    """A KiB field of /proc/self/status (VmRSS, VmHWM)."""
    text = Path("/proc/self/status").read_text()
    return int(re.search(rf"{field}:\s+(\d+)", text).group(1))


def reset_peak(device: torch.device) -> int:
    """Reset the peak-memory counter; return the current usage in bytes."""
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        return torch.cuda.memory_allocated()
    Path("/proc/self/clear_refs").write_text("5")
    return _status_kib("VmRSS") * 1024


def peak_since_reset(device: torch.device) -> int:
    """The peak memory in bytes since `reset_peak`."""
    if device.type == "cuda":
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated()
    return _status_kib("VmHWM") * 1024


def setup(
    variant: str, args: argparse.Namespace, device: torch.device
) -> tuple[Callable[..., None], tuple[Tensor, ...]]:
    """A fresh model and step closure for `variant`, and the batch it trains on."""
    spec = task(args)
    torch.manual_seed(0)
    model = spec.build().to(device)
    data = torch.Generator().manual_seed(1)
    size = args.batch_size or spec.batch_size
    xs = spec.inputs(size, data)
    batch = tuple(t.to(device) for t in (*xs, *spec.targets(size, data)))
    return make_step(variant, model, spec, size, len(xs), device), batch


def timed(step: Callable[..., None], batch: tuple[Tensor, ...], device: torch.device) -> float:
    """Seconds of one step (CUDA synchronised before and after)."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    step(*batch)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def time_interleaved(args: argparse.Namespace, device: torch.device) -> list[dict]:
    """Time all variants round-robin (rotating the order), so load drift hits all alike.

    Besides each variant's median, the ratio to the non-private step is taken per round
    and its median reported: a paired figure that shared-machine noise disturbs less.
    """
    variants = args.variant_list
    setups = {v: setup(v, args, device) for v in variants}
    for step, batch in setups.values():
        for _ in range(args.warmup):
            step(*batch)
    times: dict[str, list[float]] = {v: [] for v in variants}
    for round_ in range(args.steps):
        order = variants[round_ % len(variants) :] + variants[: round_ % len(variants)]
        for v in order:
            times[v].append(timed(*setups[v], device))
    rows = []
    for v in variants:
        median = statistics.median(times[v])
        ratios = [t / b for t, b in zip(times[v], times["non-private"], strict=True)]
        rows.append(
            {
                "variant": v,
                "median_step_s": median,
                "steps_per_s": 1.0 / median,
                "min_step_s": min(times[v]),
                "max_step_s": max(times[v]),
                "x_non_private": statistics.median(ratios),
            }
        )
    return rows


def measure_memory(variant: str, args: argparse.Namespace, device: torch.device) -> float:
    """Peak memory (MiB) that a few steps of `variant` add to what its setup holds."""
    step, batch = setup(variant, args, device)
    step(*batch)  # first-call work (vmap/compile set-up, lazy state) is not the step's memory
    before = reset_peak(device)
    for _ in range(args.memory_steps):
        step(*batch)
    return max(peak_since_reset(device) - before, 0) / 2**20
