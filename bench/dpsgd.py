"""Benchmark one DP-SGD step: non-private vs dpsynth's modes vs Opacus's modes.

Usage: python -m bench.dpsgd [--model smallcnn|psg|rdpgan-d|dpaf-c] [--device auto|cpu|cuda]
                             [--batch-size B] [--steps 30] [--variants a,b,...] [--compile]
                             [--json bench/results/dpsgd-MODEL-DEVICE.json]

Models (`--batch-size` defaults to the size each is trained at):
- `smallcnn`: `SmallCNN` of tests/dpsgd_models.py, MNIST 1×28×28, cross-entropy, batch 256;
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
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call

from bench.dpsgd_models import SmallCNN
from bench.machine import describe
from dpsynth.privacy.mechanisms.dpsgd import PrivateGradient

REPO = Path(__file__).resolve().parents[1]

NOISE_MULTIPLIER = 1.0
MAX_GRAD_NORM = 1.0
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


@dataclass
class Task:
    """A network, how to draw a batch for it, and its per-record loss."""

    name: str
    build: Callable[[], nn.Module]
    batch_size: int
    inputs: Callable[[int, torch.Generator], tuple[Tensor, ...]]  # model inputs
    targets: Callable[[int, torch.Generator], tuple[Tensor, ...]]  # loss-only tensors
    loss: Callable[..., Tensor]  # loss(output, *targets) -> per-record losses [B]


def _images(b: int, g: torch.Generator) -> tuple[Tensor, ...]:
    return (torch.randn(b, 1, 28, 28, generator=g),)


def _labels(b: int, g: torch.Generator) -> tuple[Tensor, ...]:
    return (torch.randint(0, 10, (b,), generator=g),)


def _images_and_onehot(b: int, g: torch.Generator) -> tuple[Tensor, ...]:
    onehot = F.one_hot(torch.randint(0, 10, (b,), generator=g), 10).float()
    return torch.randn(b, 1, 28, 28, generator=g), onehot


def _no_targets(b: int, g: torch.Generator) -> tuple[Tensor, ...]:
    return ()


def _ce(out: Tensor, y: Tensor) -> Tensor:
    return F.cross_entropy(out, y, reduction="none")


def _real_term(out: Tensor) -> Tensor:
    return F.softplus(-out)


def task(args: argparse.Namespace) -> Task:
    """The benchmark task of `--model`."""
    if args.model == "smallcnn":
        return Task(
            "smallcnn",
            lambda: SmallCNN(channels=args.channels, norm_after_pool=not args.norm_before_pool),
            256,
            _images,
            _labels,
            _ce,
        )
    if args.model == "psg":
        from dpsynth.methods.psg.model import ConvNet
        from dpsynth.methods.psg.presets import PRESETS

        paper = PRESETS["quick"]
        return Task(
            "psg",
            lambda: ConvNet((1, 28, 28), 10, paper["width"], paper["depth"], paper["norm"]),
            int(paper["batch_size"]),
            _images,
            _labels,
            _ce,
        )
    if args.model == "rdpgan-d":
        from dpsynth.methods.rdpgan.nets import ConvDiscriminator, init_weights
        from dpsynth.methods.rdpgan.presets import PRESETS

        paper = PRESETS["paper"]

        def build() -> nn.Module:
            return ConvDiscriminator((1, 28, 28), 10, int(paper["width"])).apply(init_weights)

        return Task(
            "rdpgan-d", build, int(paper["batch_size"]), _images_and_onehot, _no_targets, _real_term
        )
    if args.model == "dpaf-c":
        from dpsynth.methods.dpaf.model import Classifier, Features
        from dpsynth.methods.dpaf.presets import PRESETS

        paper = PRESETS["paper"]

        def build() -> nn.Module:
            features = Features(
                (1, 28, 28),
                10,
                int(paper["width"]),
                int(paper["conv1_layers"]),
                int(paper["conv2_layers"]),
            )
            return Classifier(features, int(paper["fc_hidden"]))

        batch = int(paper["batch_size"]) * int(paper["window"])
        return Task("dpaf-c", build, batch, _images_and_onehot, _labels, _ce)
    raise ValueError(args.model)


def parse_args() -> argparse.Namespace:
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


def pick_device(choice: str) -> torch.device:
    if choice == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if choice == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: CUDA is not available")
    return torch.device(choice)


def record_loss(model: nn.Module, spec: Task, inputs: int) -> Callable[..., Tensor]:
    """The per-record loss `loss_fn(params, buffers, *record)` of the vmap path."""

    def loss_fn(params: dict, buffers: dict, *record: Tensor) -> Tensor:
        xs = tuple(t.unsqueeze(0) for t in record[:inputs])
        out = functional_call(model, (params, buffers), xs)
        return spec.loss(out, *(t.unsqueeze(0) for t in record[inputs:])).sum()

    return loss_fn


class _Criterion(nn.Module):
    """The task's loss as an Opacus criterion (with the `reduction` it switches)."""

    def __init__(self, loss: Callable[..., Tensor]) -> None:
        super().__init__()
        self.loss = loss
        self.reduction = "mean"

    def forward(self, out: Tensor, *targets: Tensor) -> Tensor:
        per_record = self.loss(out, *targets)
        return per_record if self.reduction == "none" else per_record.mean()


def make_step(variant: str, model: nn.Module, spec: Task, batch_size: int, inputs: int, device):
    """A closure running one training step of `variant` on a batch (*inputs, *targets)."""
    if variant == "non-private":
        opt = torch.optim.SGD(model.parameters(), lr=0.01)

        def step(*batch: Tensor) -> None:
            opt.zero_grad(set_to_none=True)
            spec.loss(model(*batch[:inputs]), *batch[inputs:]).mean().backward()
            opt.step()

        return step
    if variant.startswith("dpsynth"):
        from dpsynth.privacy.mechanisms import ghost_layers

        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        dp = PrivateGradient(
            model,
            record_loss(model, spec, inputs),
            noise_multiplier=NOISE_MULTIPLIER,
            max_grad_norm=MAX_GRAD_NORM,
            expected_batch_size=float(batch_size),
            generator=torch.Generator(device=device).manual_seed(0),
            micro_batch_size=64 if variant == "dpsynth-micro64" else None,
            batch_loss_fn=lambda *b: spec.loss(model(*b[:inputs]), *b[inputs:]),
            grad_mode="ghost" if variant.startswith("dpsynth-ghost") else "vmap",
            compile_vmap=variant == "dpsynth-compile",
        )
        conv = "unfold" if variant == "dpsynth-ghost-unfold" else "grouped"

        def step(*batch: Tensor) -> None:
            ghost_layers.CONV_PER_RECORD = conv  # the variants share a process while timed
            dp.compute(*batch)
            opt.step()

        return step
    if variant.startswith("opacus"):
        import warnings

        from opacus import GradSampleModule
        from opacus.grad_sample import GradSampleModuleFastGradientClipping
        from opacus.optimizers import DPOptimizer, DPOptimizerFastGradientClipping
        from opacus.utils.fast_gradient_clipping_utils import DPLossFastGradientClipping

        warnings.filterwarnings("ignore", message=".*Full backward hook.*")
        warnings.filterwarnings("ignore", message=".*Secure RNG.*")
        settings = {
            "noise_multiplier": NOISE_MULTIPLIER,
            "max_grad_norm": MAX_GRAD_NORM,
            "expected_batch_size": batch_size,
        }
        if variant == "opacus-ghost":
            gsm = GradSampleModuleFastGradientClipping(
                model, max_grad_norm=MAX_GRAD_NORM, use_ghost_clipping=True
            )
            opt = DPOptimizerFastGradientClipping(
                torch.optim.SGD(gsm.parameters(), lr=0.01), **settings
            )
            criterion = DPLossFastGradientClipping(gsm, opt, _Criterion(spec.loss))

            def step(*batch: Tensor) -> None:
                opt.zero_grad(set_to_none=True)
                criterion(gsm(*batch[:inputs]), *batch[inputs:]).backward()
                opt.step()

            return step
        gsm = GradSampleModule(model, force_functorch=variant == "opacus-functorch")
        opt = DPOptimizer(torch.optim.SGD(gsm.parameters(), lr=0.01), **settings)

        def step(*batch: Tensor) -> None:
            opt.zero_grad(set_to_none=True)
            spec.loss(gsm(*batch[:inputs]), *batch[inputs:]).mean().backward()
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
    """A fresh model and step closure for `variant`, and the batch it trains on."""
    spec = task(args)
    torch.manual_seed(0)
    model = spec.build().to(device)
    data = torch.Generator().manual_seed(1)
    size = args.batch_size or spec.batch_size
    xs = spec.inputs(size, data)
    batch = tuple(t.to(device) for t in (*xs, *spec.targets(size, data)))
    return make_step(variant, model, spec, size, len(xs), device), batch


def timed(step, batch: tuple[Tensor, ...], device: torch.device) -> float:
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


def model_detail(args: argparse.Namespace) -> str:
    if args.model == "smallcnn":
        return f"SmallCNN(channels={args.channels}, norm_after_pool={not args.norm_before_pool})"
    return {
        "psg": "PSG ConvNet, paper preset (width 128, depth 3, instance norm), 1x28x28",
        "rdpgan-d": "RDP-GAN conv discriminator, paper preset (width 64), 1x28x28, 10 classes",
        "dpaf-c": "DPAF phase-1 classifier C, paper preset (C2-C1, FC 512), 1x28x28",
    }[args.model]


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
