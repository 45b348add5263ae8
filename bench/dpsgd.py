"""Benchmark one DP-SGD step: non-private vs dpsynth's modes vs Opacus's modes.

Usage: python -m bench.dpsgd [--model smallcnn|psg|rdpgan-d|dpaf-c] [--device auto|cpu|cuda]
                             [--batch-size B] [--steps 30] [--variants a,b,...] [--compile]
                             [--json bench/results/dpsgd-MODEL-DEVICE.json]

Models (`--batch-size` defaults to the size each is trained at):
- `smallcnn`: `SmallCNN` of bench/dpsgd_models.py, MNIST 1×28×28, cross-entropy, batch 256;
- `psg`: PSG's matching ConvNet at `paper` (width 128, depth 3, instance norm), batch 256;
- `rdpgan-d`: RDP-GAN's conditional conv discriminator at `paper` (width 64), loss
  softplus(−D(x, y)) of the real term, batch 64;
- `dpaf-c`: DPAF's phase-1 classifier C at `paper` (C2-C1, FC 512), cross-entropy, batch 192
  (the union of μ = 8 Poisson batches of 24).
(PGE's score network is not here: its loss differentiates w.r.t. the input, so only the
vmap path applies, which `bench/pge.py` times.)

Each variant trains the same model on the same random batch (inputs N(0,1), random labels;
the data's content does not change the cost):
- `non-private`: plain forward, mean loss, backward, SGD step;
- `dpsynth-vmap`: `PrivateGradient.compute` with `grad_mode="vmap"` (per-record gradients by
  vmap, clip, one noise draw) + SGD step;
- `dpsynth-ghost`: the same with `grad_mode="ghost"` (`dpsynth.privacy.mechanisms.ghost`: norms from
  activations and output gradients, book-keeping clipped sum; no per-record gradients);
- `dpsynth-ghost-unfold`: ghost with a convolution's per-record gradients (where the Gram
  trick is not cheaper) by unfold + matmul instead of the grouped weight-gradient kernel;
- `dpsynth-micro64`: vmap with micro-batches of 64 (bounded memory);
- `dpsynth-compile` (only with `--compile`): vmap wrapped in `torch.compile`;
- `opacus-hooks`, `opacus-functorch`: `GradSampleModule` (hooks / functorch per-sample
  gradients) + `DPOptimizer` (no Poisson sampling, same batch) + step;
- `opacus-ghost`: Opacus's ghost clipping (`GradSampleModuleFastGradientClipping`, two
  backward passes) + `DPOptimizerFastGradientClipping` + step.
Time: the variants run round-robin in one process, `--steps` rounds after `--warmup`
steps each; reported are each variant's median time per step and the median over rounds
of its time divided by that round's non-private time ("x non-private", the paired figure
the goals are judged on).
Memory, measured in a fresh process per variant over `--memory-steps` steps: on CUDA the
rise of `torch.cuda.max_memory_allocated` over the allocation before the first step; on the
CPU the rise of the process's peak resident set size (VmHWM in /proc/self/status, reset
through /proc/self/clear_refs) over the resident size before the first step.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import torch

from bench.dpsgd_measure import measure_memory, pick_device, time_interleaved
from bench.dpsgd_tasks import model_detail, task
from bench.machine import describe

REPO = Path(__file__).resolve().parents[1]

VARIANTS = (
    "non-private",
    "dpsynth-vmap",
    "dpsynth-ghost",
    "dpsynth-ghost-unfold",
    "dpsynth-micro64",
    "dpsynth-compile",
    "opacus-hooks",
    "opacus-functorch",
    "opacus-ghost",
)
DEFAULT_VARIANTS = tuple(v for v in VARIANTS if v != "dpsynth-compile")


def parse_args() -> argparse.Namespace:
    """The command line (see the module docstring); `variant_list` in the variants' order."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model", choices=["smallcnn", "psg", "rdpgan-d", "dpaf-c"], default="smallcnn"
    )
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument("--batch-size", type=int, default=0, help="0: the model's own")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--memory-steps", type=int, default=3)
    parser.add_argument("--variants", default=",".join(DEFAULT_VARIANTS))
    parser.add_argument("--compile", action="store_true", help="add dpsynth-compile")
    parser.add_argument("--channels", type=int, default=16, help="SmallCNN's width")
    parser.add_argument(
        "--norm-before-pool",
        action="store_true",
        help="SmallCNN in the conv → GroupNorm → ReLU → pool order (GroupNorm at full size)",
    )
    parser.add_argument(
        "--threads", type=int, default=0, help="torch CPU threads (0: torch's default)"
    )
    parser.add_argument(
        "--json", type=Path, default=None, help="default bench/results/dpsgd-MODEL-DEVICE.json"
    )
    parser.add_argument("--only", choices=VARIANTS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    variants = [v for v in args.variants.split(",") if v]
    if args.compile and "dpsynth-compile" not in variants:
        variants.append("dpsynth-compile")
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown or "non-private" not in variants:
        parser.error(f"--variants: unknown {unknown} (or non-private missing); known: {VARIANTS}")
    args.variant_list = tuple(v for v in VARIANTS if v in variants)
    return args


def memory_in_fresh_process(variant: str, args: argparse.Namespace) -> float:
    """Measure one variant's memory in its own process, so that peaks and caches do not mix."""
    cmd = [sys.executable, "-m", "bench.dpsgd", "--only", variant, "--device", args.device]
    cmd += ["--model", args.model]
    for flag in ("batch_size", "channels", "threads", "memory_steps"):
        cmd += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    if args.norm_before_pool:
        cmd.append("--norm-before-pool")
    done = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=REPO)
    return float(json.loads(done.stdout.strip().splitlines()[-1])["peak_memory_mib"])


def main() -> None:
    """Time and measure every variant, print the table and write the JSON."""
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
    spec = task(args)
    result = {
        "benchmark": "dpsgd-step",
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": describe(str(device)),
        "model": args.model,
        "model_detail": model_detail(args),
        "parameters": sum(p.numel() for p in spec.build().parameters()),
        "batch_size": args.batch_size or spec.batch_size,
        "steps": args.steps,
        "warmup": args.warmup,
        "memory_steps": args.memory_steps,
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
        "goals": goals(rows),
    }
    render(result)
    out = args.json or REPO / "bench" / "results" / f"dpsgd-{args.model}-{device.type}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")


def goals(rows: list[dict]) -> dict[str, bool]:
    """Issue 17's goals, judged on the fastest dpsynth and the fastest Opacus mode measured."""
    ours = [r["x_non_private"] for r in rows if r["variant"].startswith("dpsynth")]
    theirs = [r["x_non_private"] for r in rows if r["variant"].startswith("opacus")]
    out: dict[str, bool] = {}
    if ours:
        out["dpsynth_le_1.5x_non_private"] = min(ours) <= 1.5
    if ours and theirs:
        out["dpsynth_1.5x_faster_than_fastest_opacus"] = min(ours) * 1.5 <= min(theirs)
    return out


def render(result: dict) -> None:
    """Print the result as a table, with the memory measure, the machine's load and the goals."""
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"DP-SGD step, {result['model_detail']}, batch {result['batch_size']}, "
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
