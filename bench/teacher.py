"""How good is a run's DP teacher, and would another DP-SGD schedule do better at the same ε?

Usage: python -m bench.teacher RUN [--data mnist-5k] [--test mnist-5k:test] [--seeds 2]
                               [--variant NAME:key=value,key=value ...]
                               [--json bench/results/teacher-....json]

RUN is a trained run directory whose plan has a teacher (`--set teacher_share=S`). The script
scores the teacher saved in the run on the test split, then, for each `--variant`, trains a
fresh teacher (`TeacherNet`) `--seeds` times under the variant's schedule with the noise
calibrated (PRV) so that the run's other events plus this teacher compose to the run's target ε
(as `plan_with_classifier` would) and scores it. The student's accuracy (the CNN trained on the
release) is the leaderboard's; this measures the labeller it learns from.

Variant keys: batch, epochs, lr, clip, augment (copies), width, pretrain (images of the run's
generator fitted without privacy first; 0: none), pretrain_epochs. A variant with no keys is
the run's own schedule. The records are read only through `dpsynth.privacy.releases.classifier`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

from bench.machine import describe
from dpsynth.data.sources import load_data
from dpsynth.methods.blocks.teacher import TeacherNet, balanced_samples, fit_to_samples
from dpsynth.privacy.mechanisms.randomness import PrivateRandomness
from dpsynth.privacy.releases.classifier import (
    ClassifierSchedule,
    plan_classifier,
    train_private_classifier,
)
from dpsynth.sampling.trained_run import load_generator

KEYS = ("batch", "epochs", "lr", "clip", "augment", "width", "pretrain", "pretrain_epochs")


def run_settings(config: dict[str, Any]) -> dict[str, Any]:
    """The run's own teacher settings under this script's variant keys."""
    return {
        "batch": int(config["teacher_batch"]),
        "epochs": float(config["teacher_epochs"]),
        "lr": float(config["teacher_lr"]),
        "clip": float(config["teacher_clip"]),
        "augment": int(config["teacher_augment"]),
        "width": int(config["teacher_width"]),
        "pretrain": int(config["teacher_pretrain"]),
        "pretrain_epochs": int(config["teacher_pretrain_epochs"]),
    }


def parse_variant(text: str, base: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """NAME:key=value,... over the run's settings."""
    name, _, body = text.partition(":")
    settings = dict(base)
    for item in filter(None, body.split(",")):
        key, _, value = item.partition("=")
        if key not in KEYS:
            raise SystemExit(f"unknown variant key {key!r}; choose from {', '.join(KEYS)}")
        settings[key] = type(base[key])(float(value))
    return name, settings


def accuracy(net: torch.nn.Module, test: Any) -> float:
    """Top-1 accuracy of `net` on the test split."""
    net.eval()
    with torch.no_grad():
        return float((net(test.as_float()).argmax(1) == test.y).float().mean())


def train_variant(
    settings: dict[str, Any], seed: int, train: Any, plan: Any, sched: Any, pre: Any
) -> torch.nn.Module:
    """One teacher: public initialisation, optional fit to the generator, then DP-SGD."""
    torch.manual_seed(seed + 7919)
    c, h, w = train.shape
    net = TeacherNet(c, len(train.classes), h, w, settings["width"])
    if settings["pretrain"]:
        images, labels = pre
        fit_to_samples(net, images, labels, settings["pretrain_epochs"], seed)
    secret = PrivateRandomness.fresh()
    return train_private_classifier(
        net,
        train.as_float(),
        train.y,
        plan,
        sched,
        sampling_generator=secret.generator("bench/batches"),
        noise_generator=secret.generator("bench/noise"),
        augment_generator=secret.generator("bench/augment"),
    )


def main(argv: list[str] | None = None) -> None:
    """Score the run's teacher and each variant; print a table, write JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--data", default="mnist-5k")
    parser.add_argument("--test", default=None)
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--variant", action="append", default=[])
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)

    generator, run_config, _ = load_generator(args.run, "cpu")
    config, privacy = run_config["config"], run_config["privacy"]
    train, test = load_data(args.data), load_data(args.test or f"{args.data}:test")
    others = [e for e in privacy["events"] if e.get("mechanism") != "dp_classifier"]
    base = run_settings(config)
    if not hasattr(generator, "teacher"):
        raise SystemExit(f"{args.run}: the run has no trained teacher (--set teacher_share=S)")
    # `load_generator` puts the run's saved teacher in front of its generator.
    saved = accuracy(generator.teacher, test)
    rows: list[dict[str, Any]] = [{"variant": "saved", "settings": base, "accuracy": [saved]}]
    pre_cache: dict[int, Any] = {}
    for text in args.variant:
        name, settings = parse_variant(text, base)
        sched = ClassifierSchedule(
            batch_size=settings["batch"],
            epochs=settings["epochs"],
            lr=settings["lr"],
            max_grad_norm=settings["clip"],
            augment_copies=settings["augment"],
        )
        plan = plan_classifier(privacy["target_epsilon"], privacy["delta"], train.n, sched, others)
        if settings["pretrain"] and settings["pretrain"] not in pre_cache:
            pre_cache[settings["pretrain"]] = balanced_samples(
                generator.base, settings["pretrain"], 104729
            )
        start = time.perf_counter()
        pre = pre_cache.get(settings["pretrain"])
        scores = [
            accuracy(train_variant(settings, seed, train, plan, sched, pre), test)
            for seed in range(args.seeds)
        ]
        seconds = (time.perf_counter() - start) / args.seeds
        rows.append(
            {
                "variant": name,
                "settings": settings,
                "sigma": plan.noise_multiplier,
                "steps": plan.steps,
                "accuracy": scores,
                "seconds_per_teacher": round(seconds, 1),
            }
        )
    print("| variant | settings | σ | steps | teacher accuracy |\n|---|---|---|---|---|")
    for row in rows:
        changed = {k: v for k, v in row["settings"].items() if v != base[k]}
        mean = sum(row["accuracy"]) / len(row["accuracy"])
        spread = " / ".join(f"{a:.3f}" for a in row["accuracy"])
        sigma = f"{row['sigma']:.3f}" if "sigma" in row else "–"
        steps = row.get("steps", "–")
        print(
            f"| {row['variant']} | {changed or 'run'} | {sigma} | {steps} | {mean:.3f} ({spread}) |"
        )
    if args.json:
        report = {
            "machine": describe("cpu"),
            "command": " ".join(sys.argv),
            "run": str(args.run),
            "target_epsilon": privacy["target_epsilon"],
            "rows": rows,
        }
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
