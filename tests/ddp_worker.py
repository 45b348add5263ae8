"""Checks run by each of 2 gloo processes in tests/training/test_distributed.py, and in one process
without a group (the single-process reference): every function here is deterministic given
its fixed seeds, so the two runs can be compared value by value."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.func import functional_call
from torch.nn import functional as F

from dpsynth.data.sources import load_data
from dpsynth.methods.dpkernel.kernel import raw_embedding_gradient
from dpsynth.methods.registry import get_method
from dpsynth.privacy.accounting.plan import ClippedGaussianSum, PrivacyPlan
from dpsynth.privacy.mechanisms.aggregation import noisy_feature_sum, private_gradient_sum
from dpsynth.privacy.mechanisms.distributed import shard
from dpsynth.privacy.mechanisms.dpsgd import PrivateGradient
from dpsynth.privacy.mechanisms.functional import privatize_embedding_gradient
from dpsynth.privacy.mechanisms.poisson import PoissonSampler
from dpsynth.privacy.mechanisms.randomness import PrivateRandomness

SECRET = 0x00112233445566778899AABBCCDDEEFF
NOISE = {"sigma": 1.3, "clip": 0.8, "expected": 4.0}


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3))


def _record_loss(model: nn.Module):
    def loss(params, buffers, x, y):
        logits = functional_call(model, (params, buffers), (x[None],))
        return F.cross_entropy(logits, y[None])

    return loss


def _dpsgd(sigma: float, private: bool = True, mode: str = "vmap") -> dict[str, Any]:
    """One DP-SGD gradient of a fixed 13-record batch (micro-batches of 4) in `mode`."""
    model = _mlp()
    data = torch.Generator().manual_seed(1)
    x = torch.randn(13, 6, generator=data) * 3
    y = torch.randint(0, 3, (13,), generator=data)
    gradient = PrivateGradient(
        model,
        _record_loss(model),
        noise_multiplier=sigma,
        max_grad_norm=0.5,
        expected_batch_size=10.0,
        generator=torch.Generator().manual_seed(5),
        micro_batch_size=4,
        private=private,
        batch_loss_fn=lambda x, y: F.cross_entropy(model(x), y, reduction="none"),
        grad_mode=mode,
    )
    stats = gradient.compute(x, y)
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    return {"grads": grads, "stats": stats}


def _noise() -> torch.Tensor:
    """The released gradient of an EMPTY batch × qN: the noise alone (10,100 coordinates)."""
    torch.manual_seed(0)
    model = nn.Linear(100, 100)
    gradient = PrivateGradient(
        model,
        _record_loss(model),
        noise_multiplier=NOISE["sigma"],
        max_grad_norm=NOISE["clip"],
        expected_batch_size=NOISE["expected"],
        generator=torch.Generator().manual_seed(7),
    )
    gradient.compute(torch.zeros(0, 100), torch.zeros(0, dtype=torch.int64))
    flat = torch.cat([p.grad.flatten() for p in model.parameters()])
    return flat * NOISE["expected"]


def _dpaf_mechanisms() -> dict[str, Any]:
    data = torch.Generator().manual_seed(2)
    features = torch.randn(13, 8, generator=data)
    grads = {"w": torch.randn(13, 4, 3, generator=data), "b": torch.randn(13, 3, generator=data)}
    mine = shard(*grads.values())
    return {
        "aggregate": noisy_feature_sum(
            *shard(features), 1.0, 0.9, torch.Generator().manual_seed(3), across_ranks=True
        ),
        "conv2": private_gradient_sum(
            dict(zip(grads, mine, strict=True)),
            keep_fraction=0.5,
            max_norm=0.3,
            noise_multiplier=1.1,
            generator=torch.Generator().manual_seed(4),
            across_ranks=True,
        ),
    }


def _dpkernel_mechanism() -> torch.Tensor:
    data = torch.Generator().manual_seed(3)
    x, y = torch.randn(11, 5, generator=data), torch.randint(0, 2, (11,), generator=data)
    points, labels = torch.randn(6, 5, generator=data), torch.tensor([0, 1, 0, 1, 0, 1])
    x_mine, y_mine = shard(x, y)
    partial = raw_embedding_gradient(x_mine, y_mine, points, labels, (1.0, 2.0), 8.0)
    return privatize_embedding_gradient(
        partial,
        points,
        labels,
        (1.0, 2.0),
        noise_multiplier=1.0,
        sum_sensitivity=2.0,
        normalizer=8.0,
        generator=torch.Generator().manual_seed(6),
        across_ranks=True,
    )


def _trainer_steps(method: str, overrides: dict[str, Any], steps: int) -> dict[str, torch.Tensor]:
    """`steps` loop steps of a backend's tiny preset on digits with a fixed secret: every
    rank gets the whole Poisson batch, as the training loop gives it."""
    backend = get_method(method)
    records = load_data("digits")
    info = records.info()
    config = backend.config("tiny", overrides, info)
    batch = float(config["batch_size"])
    # A plan with a fixed σ (the accountant is not under test here and costs seconds).
    plan = PrivacyPlan(
        private=True,
        target_epsilon=10.0,
        delta=1e-5,
        sampling_rate=batch / info.n,
        steps=steps,
        expected_batch_size=batch,
        events=(),
        epsilon_bound=10.0,
        total_epsilon_bound=10.0,
        accountant="fixed for the test",
        gaussian_sum=ClippedGaussianSum(1.0, float(config.get("max_grad_norm", 1.0))),
    )
    randomness = PrivateRandomness(SECRET)
    trainer = backend.trainer(info, config, plan, torch.device("cpu"), 3, randomness)
    sampler = PoissonSampler(info.n, plan.sampling_rate, randomness.generator("loop/batches"))
    pixels = records.as_float()
    for _ in range(steps):
        index = sampler.next()
        trainer.step(pixels[index], records.y[index])
    return trainer.state_tensors()


class _StubTrainer:
    def __init__(self, value: float) -> None:
        self.value = value

    def state_tensors(self) -> dict[str, torch.Tensor]:
        return {"w": torch.full((3,), self.value), "steps": torch.tensor(2)}


def _agreement() -> dict[str, bool]:
    """The loop's check of identical models: silent when equal, an error on every rank when
    one rank's state differs (only meaningful under a group)."""
    from dpsynth.errors import DpsynthError
    from dpsynth.privacy.mechanisms.distributed import world
    from dpsynth.training.loop import check_ranks_agree as _check_ranks_agree

    if world()[1] == 1:
        return {}
    _check_ranks_agree(_StubTrainer(1.0), torch.device("cpu"))
    try:
        _check_ranks_agree(_StubTrainer(1.0 + world()[0] * 1e-7), torch.device("cpu"))
    except DpsynthError:
        return {"caught_mismatch": True}
    return {"caught_mismatch": False}


def checks() -> dict[str, Any]:
    """Every check's result (in one process: the reference; under a group: this rank's)."""
    return {
        "dpsgd": _dpsgd(0.7),
        "clipped_sum": _dpsgd(0.0),
        "dpsgd_ghost": _dpsgd(0.7, mode="ghost"),
        "clipped_sum_ghost": _dpsgd(0.0, mode="ghost"),
        "nonprivate": _dpsgd(0.0, private=False),
        "noise": _noise(),
        "dpaf_mechanisms": _dpaf_mechanisms(),
        "dpkernel_mechanism": _dpkernel_mechanism(),
        "psg": _trainer_steps("psg", {}, 2),
        "pge": _trainer_steps("pge", {"batch_size": 16}, 2),
        "dpaf": _trainer_steps("dpaf", {"c_steps": 1}, 2),  # phase 1, then one window
        "dpkernel": _trainer_steps("dpkernel", {}, 2),
        "agreement": _agreement(),
    }


def run(rank: int, world: int, port: int, out: str) -> None:
    """Entry point of one spawned rank: join a gloo group, run the checks, save them."""
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    try:
        results = checks()
    finally:
        torch.distributed.destroy_process_group()
    torch.save(results, Path(out) / f"rank{rank}.pt")
