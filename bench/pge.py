"""Benchmark the PGE backend: training speed, peak memory, sampling speed, downstream quality.

Usage: python -m bench.pge [--preset small] [--data digits] [--epsilon 1 10]
                           [--device cpu|cuda|auto] [--steps N] [--threads 2] [--synthetic 2000]
                           [--json bench/results/pge.json]

For each ε: calibrate σ (PRV accountant, before timing), train the preset with Poisson batches
(`trainer.step`, as the training loop does; no ledger is written), then sample `--synthetic`
images with balanced labels from the EMA score network (annealed HMC). Reported:
- training steps/s and sampling images/s;
- peak memory: CUDA `max_memory_allocated`, or on CPU the process's peak resident set (VmHWM)
  minus its resident size after loading the data;
- downstream accuracy on the real `:test` split of a classifier trained on the synthetic
  images only (dpsynth's SmallCNN, mean ± std over 3 seeds, and logistic regression on
  pixels), beside the same classifiers trained on the real train split.
`--steps` shortens the run (timing only; the quality then is not the preset's).
`paper` on `mnist-5k` needs a GPU:
    python -m bench.pge --preset paper --data mnist-5k --device cuda --epsilon 1 10
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch

from bench.machine import describe
from dpsynth.data.sources import load_data
from dpsynth.evaluation.downstream import accuracy_over_seeds
from dpsynth.methods.base import PrivacyTarget
from dpsynth.methods.pge.method import PGEMethod
from dpsynth.privacy.accounting.calibration import default_delta
from dpsynth.privacy.mechanisms.poisson import PoissonSampler
from dpsynth.privacy.releases.central import central_plan_in, release_central_images

REPO = Path(__file__).resolve().parents[1]


def _rss_kib(field: str) -> int:
    status = Path("/proc/self/status")
    if not status.exists():
        return 0
    for line in status.read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def _quality(train: tuple[torch.Tensor, torch.Tensor], data: str, classes: tuple) -> dict:
    test = load_data(f"{data}:test")
    out = {}
    for classifier in ("cnn", "logreg"):
        result = accuracy_over_seeds(
            train, (test.x, test.y), classes, classifier=classifier, seeds=3
        )
        out[classifier] = {"mean": round(result["mean"], 4), "std": round(result["std"], 4)}
    return out


def run_one(args: argparse.Namespace, epsilon: float, device: torch.device) -> dict:
    """Train, time and evaluate one (preset, data, ε)."""
    data = load_data(args.data)
    info = data.info()
    method = PGEMethod()
    overrides = {"steps": args.steps} if args.steps else {}
    config = method.config(args.preset, overrides, info)
    delta = default_delta(info.n)
    plan = method.plan(info, PrivacyTarget(epsilon, delta), config)
    trainer = method.trainer(info, config, plan, device, args.seed)
    sampler = PoissonSampler(info.n, plan.sampling_rate, torch.Generator().manual_seed(args.seed))
    pixels, labels = data.as_float().to(device), data.y.to(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    base_rss = _rss_kib("VmRSS")
    losses = []
    start = time.perf_counter()
    release = central_plan_in(plan.events)
    if release is not None:  # the warm start, as the training loop does it (timed with it)
        central_rng = torch.Generator().manual_seed(args.seed + 2)
        trainer.warm_start(
            release_central_images(
                pixels.cpu(), labels.cpu(), len(info.classes), release, central_rng
            )
        )
    for _ in range(plan.steps):
        index = sampler.next().to(device)
        losses.append(trainer.step(pixels[index], labels[index])["loss"])
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    train_s = time.perf_counter() - start
    if device.type == "cuda":
        peak_mib = torch.cuda.max_memory_allocated(device) / 2**20
    else:
        peak_mib = (_rss_kib("VmHWM") - base_rss) / 1024

    generator = trainer.generator()
    wanted = torch.arange(len(info.classes)).repeat(math.ceil(args.synthetic / len(info.classes)))
    wanted = wanted[: args.synthetic]
    rng = torch.Generator(device=device).manual_seed(args.seed + 1)
    start = time.perf_counter()
    images = torch.cat(list(generator.sample(wanted, args.sample_batch, rng)))
    sample_s = time.perf_counter() - start
    quality = _quality((images, wanted), args.data, info.classes)
    return {
        "preset": args.preset,
        "data": args.data,
        "epsilon": epsilon if math.isfinite(epsilon) else "inf",
        "epsilon_bound": plan.epsilon_bound if math.isfinite(plan.epsilon_bound) else "inf",
        "delta": delta,
        "noise_multiplier": plan.noise_multiplier,
        "sampling_rate": plan.sampling_rate,
        "steps": plan.steps,
        "expected_batch": plan.expected_batch_size,
        "train_seconds": round(train_s, 1),
        "train_steps_per_s": round(plan.steps / train_s, 3),
        "peak_memory_mib": round(peak_mib, 1),
        "peak_memory_kind": "cuda max_memory_allocated" if device.type == "cuda" else "CPU VmHWM",
        "sample_images_per_s": round(len(wanted) / sample_s, 1),
        "sample_seconds": round(sample_s, 1),
        "acceptance_last_batch": [round(a, 3) for a in generator.last_acceptance],
        "final_loss_mean_last10": sum(losses[-10:]) / max(1, len(losses[-10:])),
        "synthetic": quality,
    }


def main() -> None:
    """Parse flags, run every ε, print a table and write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="small")
    parser.add_argument("--data", default="digits")
    parser.add_argument("--epsilon", nargs="+", type=float, default=[1.0, 10.0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steps", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--synthetic", type=int, default=2000)
    parser.add_argument("--sample-batch", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=str(REPO / "bench" / "results" / "pge.json"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    name = args.device
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(name)

    data = load_data(args.data)
    real = _quality((data.x, data.y), args.data, data.classes)
    results = [run_one(args, eps, device) for eps in args.epsilon]

    print(f"PGE bench: preset {args.preset}, data {args.data}, device {device}")
    print(f"real train -> test: cnn {real['cnn']['mean']:.3f}, logreg {real['logreg']['mean']:.3f}")
    header = "eps   sigma   steps  steps/s  peak MiB  img/s   cnn acc        logreg acc"
    print(header)
    for r in results:
        cnn, lr = r["synthetic"]["cnn"], r["synthetic"]["logreg"]
        print(
            f"{r['epsilon']!s:<5} {r['noise_multiplier']:<7.3f} {r['steps']:<6} "
            f"{r['train_steps_per_s']:<8} {r['peak_memory_mib']:<9} {r['sample_images_per_s']:<7} "
            f"{cnn['mean']:.3f}±{cnn['std']:.3f}    {lr['mean']:.3f}"
        )
    out = {
        "bench": "pge",
        "machine": {**describe(str(device)), "threads": args.threads},
        "real_train": real,
        "runs": results,
    }
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    existing = json.loads(path.read_text()) if path.exists() else {}
    key = f"{args.preset}/{args.data}/{device.type}"
    existing[key] = out
    path.write_text(json.dumps(existing, indent=2) + "\n")
    print(f"wrote {path} [{key}]")


if __name__ == "__main__":
    main()
