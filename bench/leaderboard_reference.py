"""The leaderboard's reference row "DP-SGD classifier on the real records": what a data owner
who only needs a classifier would get at the same ε, with a schedule fixed a priori."""

from __future__ import annotations

import math
import time
from typing import Any

DPSGD_METHOD = "DP-SGD classifier on the real records"
# The reference classifier's schedule, fixed a priori (issue 28: the setting of the Opacus row
# it quotes), never tuned on a test split: expected batch 256, 15 epochs, Adam 5e-3, clip 1.
DPSGD_SCHEDULE = {"batch_size": 256, "epochs": 15.0, "lr": 5e-3, "max_grad_norm": 1.0}
# With --public: the DP teacher's default public pretraining (`public_teacher_steps`).
PUBLIC_PRETRAIN_STEPS = 300


def dpsgd_row(
    data: str,
    epsilon: str,
    seeds: int,
    device: str = "cpu",
    test: str | None = None,
    public: str | None = None,
) -> dict[str, Any]:
    """What a data owner who only needs a classifier would do instead: the evaluation's
    SmallCNN trained with dpsynth's own DP-SGD (`dpsynth.privacy.releases.classifier`: Poisson
    batches, per-record clipping, noise calibrated by the PRV accountant to ε at the CLI's default
    δ) on the train split, tested on `DATA:test`; final model, mean ± std over `seeds` training
    runs (seed s initialises the network; each run draws fresh secret batches and noise). With
    `public` (labelled images in the data's classes and shape) the network first takes
    `PUBLIC_PRETRAIN_STEPS` Adam steps on them, as the DP teacher does (no privacy cost)."""
    import numpy as np
    import torch

    from dpsynth.data.sources import load_data
    from dpsynth.evaluation.downstream import SmallCNN, predict_cnn
    from dpsynth.methods.blocks.teacher import fit_steps
    from dpsynth.privacy.accounting.calibration import default_delta
    from dpsynth.privacy.accounting.compose import compose_epsilon
    from dpsynth.privacy.mechanisms.randomness import PrivateRandomness
    from dpsynth.privacy.releases.classifier import (
        ClassifierSchedule,
        plan_classifier,
        train_private_classifier,
    )

    train, test = load_data(data), load_data(test or f"{data}:test")
    schedule = ClassifierSchedule(**DPSGD_SCHEDULE)
    delta = default_delta(train.n)
    plan = plan_classifier(float(epsilon), delta, train.n, schedule)
    x, y = train.as_float().to(device), train.y.to(device)
    pretrain = _public_images(public, train) if public else None
    accuracies, seconds = [], []
    for seed in range(seeds):
        randomness = PrivateRandomness.fresh()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = SmallCNN(train.shape[0], len(train.classes), *train.shape[1:]).to(device)
        start = time.perf_counter()
        if pretrain is not None:
            fit_steps(model, *(t.to(device) for t in pretrain), PUBLIC_PRETRAIN_STEPS, seed)
        train_private_classifier(
            model,
            x,
            y,
            plan,
            schedule,
            sampling_generator=randomness.generator("reference/batches", device),
            noise_generator=randomness.generator("reference/noise", device),
        )
        seconds.append(time.perf_counter() - start)
        predicted = predict_cnn(model, test.x, device)
        accuracies.append(float((predicted == test.y.numpy()).mean()))
    bound = compose_epsilon([plan.event()], delta).epsilon if plan.private else math.inf
    return {
        "method": DPSGD_METHOD,
        "preset": "B 256, 15 epochs, Adam 5e-3, C 1",  # the table adds "+ public"
        "public": public,
        "epsilon": bound,
        "epsilon_target": epsilon,
        "delta": delta,
        "noise_multiplier": plan.noise_multiplier,
        "sampling_rate": plan.sampling_rate,
        "steps": plan.steps,
        "train_seconds": round(float(np.mean(seconds)), 1),
        "n": train.n,
        "cnn_mean": float(np.mean(accuracies)),
        "cnn_std": float(np.std(accuracies, ddof=1)) if seeds > 1 else 0.0,
        "cnn_per_seed": accuracies,
        # a classifier releases no images: FID, precision and recall do not apply to this row
        "fidelity": "not applicable: a DP classifier, not a generator",
    }


def _public_images(spec: str, train: Any) -> tuple[Any, Any]:
    """Declared-public labelled images for the reference's pretraining, read as `train --public`
    reads them (`load_public`: the data's shape, labels mapped onto its classes), in [-1, 1]."""
    from dpsynth.data.public import load_public

    public = load_public(spec, tuple(train.shape), tuple(train.classes))
    if public.y is None:
        raise SystemExit(f"--public {spec}: the DP-SGD reference needs the data's classes")
    return public.as_float(), public.y
