"""A fast in-process DPAF trial (digits by default, CPU): train, sample, CNN accuracy.

    python -m bench.dpaf_trial --epsilon 10 --set windows=300 --seeds 1

Not the leaderboard (no CLI, no ledger, no run dir); the same method code, Poisson batches
at the plan's rate, the same CNN evaluation. For tuning on the public digits set only.
"""

from __future__ import annotations

import argparse
import math
import time

import torch

from dpsynth.data.sources import load_data
from dpsynth.evaluation.downstream import accuracy_over_seeds
from dpsynth.methods.registry import get_method
from dpsynth.privacy.accounting.plan import PrivacyTarget
from dpsynth.privacy.mechanisms.randomness import PrivateRandomness


def _value(text: str):
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text, text)


def main() -> None:
    """Parse, train, evaluate, print one line."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", default="digits")
    parser.add_argument("--epsilon", type=float, default=10.0)
    parser.add_argument("--preset", default="small")
    parser.add_argument("--set", action="append", default=[])
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--grid", default="")
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    data = load_data(args.data)
    test = load_data(f"{args.data}:test")
    info = data.info()
    method = get_method("dpaf")
    overrides = dict(item.split("=", 1) for item in args.set)
    overrides = {k: _value(v) for k, v in overrides.items()}
    config = method.config(args.preset, overrides, info)
    plan = method.plan(info, PrivacyTarget(args.epsilon, 1e-5), config)
    trainer = method.trainer(
        info, config, plan, torch.device("cpu"), args.seed, PrivateRandomness.fresh()
    )
    pixels, labels = data.as_float(), data.y
    start = time.perf_counter()
    stats = {}
    for _ in range(plan.steps):
        index = torch.nonzero(torch.rand(info.n) < plan.sampling_rate).squeeze(1)
        stats = trainer.step(pixels[index], labels[index])
    train_s = time.perf_counter() - start
    gen = trainer.generator()
    n_classes = len(info.classes)
    wanted = torch.arange(args.n) % n_classes
    images = torch.cat(list(gen.sample(wanted, 500, torch.Generator().manual_seed(1))))
    if args.grid:
        from torchvision.utils import save_image

        save_image(images[:100].float() / 255, args.grid, nrow=10)
    result = accuracy_over_seeds((images, wanted), (test.x, test.y), info.classes, seeds=args.seeds)
    sigma = plan.noise_multiplier
    last = {k: round(v, 3) for k, v in stats.items() if not math.isnan(v)}
    print(
        f"eps={args.epsilon} sets={' '.join(args.set)} sigma_w={sigma:.3g} q_w="
        f"{plan.sampling_rate:.3g} steps={plan.steps} train_s={train_s:.0f} "
        f"cnn={result['mean']:.3f}±{result['std']:.3f} last={last}"
    )


if __name__ == "__main__":
    main()
