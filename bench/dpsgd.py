"""Benchmark one DP-SGD step of a small MNIST CNN: non-private vs ours vs Opacus.

Usage: python bench/dpsgd.py [--device auto|cpu|cuda] [--batch-size 256] [--steps 30]
                             [--json bench/results/dpsgd.json]

Each variant trains the same `SmallCNN` (tests/dpsgd_models.py) on the same random batch
(inputs N(0,1), random labels; the data's content does not change the cost):
- `non-private`: plain forward, mean cross-entropy, backward, SGD step;
- `dpsynth`: `PrivateGradient.compute` (vmap per-record grads, clip, noise) + SGD step;
- `dpsynth-micro64`: the same with micro-batches of 64 (bounded memory);
- `opacus`: `GradSampleModule` + `DPOptimizer` (no Poisson sampling, same batch) + step.
Time: the variants run round-robin in one process, `--steps` rounds after `--warmup`
steps each; reported are each variant's median time per step and the median over rounds
of its time divided by that round's non-private time ("x non-private", the paired figure
the goals are judged on).
Memory, measured in a fresh process per variant over 3 steps: on CUDA the rise of
`torch.cuda.max_memory_allocated` over the allocation before the first step; on the CPU the
rise of the process's peak resident set size (VmHWM in /proc/self/status, reset through
/proc/self/clear_refs) over the resident size before the first step.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

from dpsgd_models import SmallCNN  # noqa: E402
from machine import describe  # noqa: E402

from dpsynth.privacy.dpsgd import PrivateGradient  # noqa: E402

NOISE_MULTIPLIER = 1.0
MAX_GRAD_NORM = 1.0
VARIANTS = ("non-private", "dpsynth", "dpsynth-micro64", "opacus")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--channels", type=int, default=16)
    parser.add_argument(
        "--norm-before-pool",
        action="store_true",
        help="SmallCNN in the conv → GroupNorm → ReLU → pool order (GroupNorm at full size)",
    )
    parser.add_argument(
        "--threads", type=int, default=0, help="torch CPU threads (0: torch's default)"
    )
    parser.add_argument("--json", type=Path, default=REPO / "bench" / "results" / "dpsgd.json")
    parser.add_argument("--only", choices=VARIANTS, help=argparse.SUPPRESS)
    return parser.parse_args()


def pick_device(choice: str) -> torch.device:
    if choice == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if choice == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: CUDA is not available")
    return torch.device(choice)


def cross_entropy_of_record(model: nn.Module) -> Callable[..., Tensor]:
    def loss_fn(params: dict, buffers: dict, x: Tensor, y: Tensor) -> Tensor:
        logits = functional_call(model, (params, buffers), (x.unsqueeze(0),))
        return F.cross_entropy(logits, y.unsqueeze(0))

    return loss_fn


def make_step(variant: str, model: nn.Module, batch_size: int, device: torch.device):
    """A closure running one training step of `variant` on a batch (x, y)."""
    if variant == "non-private":
        opt = torch.optim.SGD(model.parameters(), lr=0.01)

        def step(x: Tensor, y: Tensor) -> None:
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
            opt.step()

        return step
    if variant.startswith("dpsynth"):
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        micro = int(variant.removeprefix("dpsynth-micro")) if "micro" in variant else None
        dp = PrivateGradient(
            model,
            cross_entropy_of_record(model),
            noise_multiplier=NOISE_MULTIPLIER,
            max_grad_norm=MAX_GRAD_NORM,
            expected_batch_size=float(batch_size),
            generator=torch.Generator(device=device).manual_seed(0),
            micro_batch_size=micro,
        )

        def step(x: Tensor, y: Tensor) -> None:
            dp.compute(x, y)
            opt.step()

        return step
    if variant == "opacus":
        import warnings

        from opacus import GradSampleModule
        from opacus.optimizers import DPOptimizer

        warnings.filterwarnings("ignore", message=".*Full backward hook.*")
        warnings.filterwarnings("ignore", message=".*Secure RNG.*")
        gsm = GradSampleModule(model)
        opt = DPOptimizer(
            torch.optim.SGD(gsm.parameters(), lr=0.01),
            noise_multiplier=NOISE_MULTIPLIER,
            max_grad_norm=MAX_GRAD_NORM,
            expected_batch_size=batch_size,
        )

        def step(x: Tensor, y: Tensor) -> None:
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(gsm(x), y).backward()
            opt.step()

        return step
    raise ValueError(variant)


def _status_kib(field: str) -> int:
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
    if device.type == "cuda":
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated()
    return _status_kib("VmHWM") * 1024


def setup(variant: str, args: argparse.Namespace, device: torch.device):
    """A fresh model and step closure for `variant`, and the batch (x, y) it trains on."""
    torch.manual_seed(0)
    model = small_cnn(args).to(device)
    data = torch.Generator().manual_seed(1)
    x = torch.randn(args.batch_size, 1, 28, 28, generator=data).to(device)
    y = torch.randint(0, 10, (args.batch_size,), generator=data).to(device)
    return make_step(variant, model, args.batch_size, device), x, y


def small_cnn(args: argparse.Namespace) -> SmallCNN:
    return SmallCNN(channels=args.channels, norm_after_pool=not args.norm_before_pool)


def timed(step, x: Tensor, y: Tensor, device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    step(x, y)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def time_interleaved(args: argparse.Namespace, device: torch.device) -> list[dict]:
    """Time all variants round-robin (rotating the order), so load drift hits all alike.

    Besides each variant's median, the ratio to the non-private step is taken per round
    and its median reported: a paired figure that shared-machine noise disturbs less.
    """
    setups = {v: setup(v, args, device) for v in VARIANTS}
    for step, x, y in setups.values():
        for _ in range(args.warmup):
            step(x, y)
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for round_ in range(args.steps):
        order = VARIANTS[round_ % len(VARIANTS) :] + VARIANTS[: round_ % len(VARIANTS)]
        for v in order:
            times[v].append(timed(*setups[v], device))
    rows = []
    for v in VARIANTS:
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
    step, x, y = setup(variant, args, device)
    before = reset_peak(device)
    for _ in range(3):
        step(x, y)
    return max(peak_since_reset(device) - before, 0) / 2**20


def memory_in_fresh_process(variant: str, args: argparse.Namespace) -> float:
    """Measure one variant's memory in its own process, so that peaks and caches do not mix."""
    cmd = [sys.executable, __file__, "--only", variant, "--device", args.device]
    for flag in ("batch_size", "channels", "threads"):
        cmd += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    if args.norm_before_pool:
        cmd.append("--norm-before-pool")
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return float(json.loads(done.stdout.strip().splitlines()[-1])["peak_memory_mib"])


def main() -> None:
    args = parse_args()
    device = pick_device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.only:
        print(json.dumps({"peak_memory_mib": measure_memory(args.only, args, device)}))
        return
    rows = time_interleaved(args, device)
    for row in rows:
        row["peak_memory_mib"] = memory_in_fresh_process(row["variant"], args)
    by_name = {r["variant"]: r for r in rows}
    goals = {
        "dpsynth_le_2x_non_private": by_name["dpsynth"]["x_non_private"] <= 2.0,
        "dpsynth_faster_than_opacus": by_name["dpsynth"]["x_non_private"]
        < by_name["opacus"]["x_non_private"],
    }
    result = {
        "benchmark": "dpsgd-step",
        "machine": describe(str(device)),
        "model": f"SmallCNN(channels={args.channels}, norm_after_pool={not args.norm_before_pool})",
        "parameters": sum(p.numel() for p in small_cnn(args).parameters()),
        "batch_size": args.batch_size,
        "steps": args.steps,
        "warmup": args.warmup,
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else platform.processor() or platform.machine(),
        "torch_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "load_average_1min_at_end": os.getloadavg()[0],
        "torch": torch.__version__,
        "memory_measure": "cuda max_memory_allocated delta"
        if device.type == "cuda"
        else "CPU peak RSS (VmHWM) rise over RSS before the variant",
        "rows": rows,
        "goals": goals,
    }
    render(result)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.json}")


def render(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"DP-SGD step, {result['model']}, batch {result['batch_size']}, "
        f"{result['device']} ({result['torch_threads']} threads), median of {result['steps']}"
    )
    for col in ("variant", "ms/step", "min ms", "steps/s", "x non-private", "peak mem MiB"):
        table.add_column(col, justify="left" if col == "variant" else "right")
    for r in result["rows"]:
        table.add_row(
            r["variant"],
            f"{1000 * r['median_step_s']:.1f}",
            f"{1000 * r['min_step_s']:.1f}",
            f"{r['steps_per_s']:.1f}",
            f"{r['x_non_private']:.2f}",
            f"{r['peak_memory_mib']:.1f}",
        )
    console = Console()
    console.print(table)
    console.print(f"memory: {result['memory_measure']}")
    load = result["load_average_1min_at_end"]
    console.print(f"machine: {result['cpu_count']} CPUs, 1-min load average {load:.1f}")
    for goal, ok in result["goals"].items():
        console.print(f"{goal}: {'yes' if ok else 'NO'}")


if __name__ == "__main__":
    main()
