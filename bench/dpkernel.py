"""Benchmark the DP-Kernel backend: speed, peak memory and downstream quality.

Usage: python -m bench.dpkernel [--quick] [--threads 1] [--paper-steps 20] [--paper-only]
                                [--json bench/results/dpkernel.json]

Runs, each in a fresh process (so peak memory is its own):
- `small` on `digits` at ε = 1, 10 and inf (the non-private baseline), full preset steps;
- `paper-200k` on `mnist-5k` at ε = 1: `--paper-steps` steps (default 20, timing only; the preset's
  200,000 steps need a GPU). With `--paper-steps` ≥ 500 its quality is measured too;
  `--paper-only` runs just `paper-200k`, at ε = 1 and 10.
Quality: 2,000 synthetic images with balanced labels train a classifier (dpsynth's SmallCNN,
mean ± std over 3 seeds, and logistic regression on pixels), tested on the real `:test` split,
beside the same classifiers trained on the real train split. Speed: training steps per
second (Poisson sampling + `trainer.step`, σ calibrated before timing). Memory: the process's
peak resident set size (VmHWM) minus its resident size after loading the data.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import torch

from bench.machine import describe
from dpsynth.data.sources import load_data
from dpsynth.evaluation.downstream import accuracy_over_seeds
from dpsynth.methods.base import PrivacyTarget
from dpsynth.methods.dpkernel.method import DPKernelMethod
from dpsynth.privacy.accounting.calibration import default_delta
from dpsynth.privacy.mechanisms.poisson import PoissonSampler

REPO = Path(__file__).resolve().parents[1]

SYNTHETIC = 2000


def _rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def _quality(images: torch.Tensor, labels: torch.Tensor, data: str) -> dict:
    test = load_data(f"{data}:test")
    classes = test.classes
    out = {}
    for classifier in ("cnn", "logreg"):
        result = accuracy_over_seeds(
            (images, labels), (test.x, test.y), classes, classifier=classifier, seeds=3
        )
        out[classifier] = {"mean": result["mean"], "std": result["std"]}
    return out


def run_one(preset: str, data: str, epsilon: float, steps: int | None, threads: int) -> dict:
    """Train one configuration in this process and measure it."""
    torch.set_num_threads(threads)
    records = load_data(data)
    info = records.info()
    pixels, targets = records.as_float(), records.y
    baseline_kib = _rss_kib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")
    method = DPKernelMethod()
    overrides = {"steps": steps} if steps else {}
    config = method.config(preset, overrides, info)
    plan = method.plan(info, PrivacyTarget(epsilon, default_delta(info.n)), config)
    trainer = method.trainer(info, config, plan, torch.device("cpu"), 0)
    sampler = PoissonSampler(info.n, plan.sampling_rate, torch.Generator().manual_seed(1))
    start = time.perf_counter()
    for _ in range(plan.steps):
        index = sampler.next()
        trainer.step(pixels[index], targets[index])
    elapsed = time.perf_counter() - start
    result = {
        "preset": preset,
        "data": data,
        "epsilon": epsilon if math.isfinite(epsilon) else "inf",
        "epsilon_bound": plan.epsilon_bound if plan.private else "inf",
        "delta": plan.delta,
        "noise_multiplier": plan.noise_multiplier,
        "sampling_rate": plan.sampling_rate,
        "steps": plan.steps,
        "config": {k: config[k] for k in ("batch_size", "generated_points", "bandwidths", "lr")},
        "seconds": elapsed,
        "steps_per_s": plan.steps / elapsed,
        "peak_rss_increase_mib": (_rss_kib("VmHWM") - baseline_kib) / 1024,
    }
    if preset != "paper-200k" or plan.steps >= 500:
        labels = torch.arange(SYNTHETIC) % len(info.classes)
        images = torch.cat(
            list(trainer.generator().sample(labels, 500, torch.Generator().manual_seed(2)))
        )
        result["accuracy_synthetic"] = _quality(images, labels, data)
    return result


def real_baseline(data: str, threads: int) -> dict:
    """The same classifiers trained on the real train split."""
    torch.set_num_threads(threads)
    records = load_data(data)
    return _quality(records.x, records.y, data)


def _child(args: argparse.Namespace, job: dict) -> dict:
    command = [sys.executable, "-m", "bench.dpkernel", "--child", json.dumps(job)]
    command += ["--threads", str(args.threads)]
    done = subprocess.run(command, capture_output=True, text=True, check=True, cwd=REPO)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _fmt_acc(result: dict, key: str) -> str:
    acc = result.get("accuracy_synthetic", result).get(key)
    return f"{acc['mean']:.3f}±{acc['std']:.3f}" if acc else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="200 steps for small (smoke)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--paper-steps", type=int, default=20)
    parser.add_argument(
        "--paper-only", action="store_true", help="skip the small runs; paper at ε = 1 and 10"
    )
    parser.add_argument("--json", type=Path, default=REPO / "bench" / "results" / "dpkernel.json")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        job = json.loads(args.child)
        if job["kind"] == "real":
            print(json.dumps(real_baseline(job["data"], args.threads)))
        else:
            eps = float(job["epsilon"])
            print(json.dumps(run_one(job["preset"], job["data"], eps, job["steps"], args.threads)))
        return
    small_steps = 200 if args.quick else None
    jobs = [
        {"kind": "train", "preset": "small", "data": "digits", "epsilon": e, "steps": small_steps}
        for e in ("1", "10", "inf")
        if not args.paper_only
    ]
    jobs += [
        {"kind": "train", "preset": "paper-200k", "data": "mnist-5k", "epsilon": e}
        | {"steps": args.paper_steps}
        for e in (("1", "10") if args.paper_only else ("1",))
    ]
    runs = []
    for job in jobs:
        runs.append(_child(args, job))
        print(json.dumps(runs[-1]), file=sys.stderr, flush=True)
    real = {data: _child(args, {"kind": "real", "data": data}) for data in ("digits", "mnist-5k")}
    print(
        f"{'preset':7} {'data':9} {'eps':>5} {'sigma':>7} {'steps':>7} {'steps/s':>8} "
        f"{'peak MiB':>9} {'CNN acc':>13} {'logreg acc':>13}"
    )
    for r in runs:
        print(
            f"{r['preset']:7} {r['data']:9} {r['epsilon']!s:>5} {r['noise_multiplier']:7.3f} "
            f"{r['steps']:7d} {r['steps_per_s']:8.2f} {r['peak_rss_increase_mib']:9.1f} "
            f"{_fmt_acc(r, 'cnn'):>13} {_fmt_acc(r, 'logreg'):>13}"
        )
    for data, acc in real.items():
        print(
            f"{'real':7} {data:9} {'-':>5} {'-':>7} {'-':>7} {'-':>8} {'-':>9} "
            f"{_fmt_acc(acc, 'cnn'):>13} {_fmt_acc(acc, 'logreg'):>13}"
        )
    report = {
        "benchmark": "dpkernel",
        "machine": {**describe("cpu"), "threads": args.threads},
        "synthetic_images": SYNTHETIC,
        "runs": runs,
        "real_data_accuracy": real,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
