"""A minimal backend for testing the shared training loop without a real generator.

It learns one template image per class with DP-SGD on a squared-error loss: small enough to
run in milliseconds, yet it goes through the same privacy layer as the real backends.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, ClassVar

import torch
from torch import nn
from torch.func import functional_call

from dpsynth.data.images import DataInfo, to_uint8
from dpsynth.methods.base import Generator, Method, PrivacyPlan, Trainer
from dpsynth.privacy.mechanisms.dpsgd import PrivateGradient
from dpsynth.privacy.mechanisms.randomness import PrivateRandomness


class Templates(nn.Module):
    def __init__(self, classes: int, shape: tuple[int, int, int]) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(classes, *shape))

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        return self.weight[y]


class TemplateGenerator(Generator):
    def __init__(self, model: Templates, info: DataInfo) -> None:
        self.model, self.classes, self.shape = model, info.classes, info.shape
        self.device = torch.device("cpu")

    def sample(
        self, labels: torch.Tensor, batch_size: int, generator: torch.Generator
    ) -> Iterator[torch.Tensor]:
        for start in range(0, labels.numel(), batch_size):
            with torch.no_grad():
                yield to_uint8(self.model(labels[start : start + batch_size]).tanh())


class TemplateTrainer(Trainer):
    def __init__(
        self,
        info: DataInfo,
        config: Mapping[str, Any],
        plan: PrivacyPlan,
        seed: int,
        randomness: PrivateRandomness,
    ):
        torch.manual_seed(seed)
        self.info = info
        self.model = Templates(len(info.classes), info.shape)
        self.rng = randomness.generator("templates/noise")
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=float(config["lr"]))

        def loss(params, buffers, x, y):
            out = functional_call(self.model, (params, buffers), (y.unsqueeze(0),))
            return ((out.tanh() - x.unsqueeze(0)) ** 2).mean()

        self.private_grad = PrivateGradient(
            self.model,
            loss,
            noise_multiplier=plan.noise_multiplier,
            max_grad_norm=plan.max_grad_norm if plan.private else 1.0,
            expected_batch_size=plan.expected_batch_size,
            generator=self.rng,
            private=plan.private,
        )

    def step(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
        self.optimizer.zero_grad()
        stats = self.private_grad.compute(x, y)
        self.optimizer.step()
        return {"loss": float(stats.get("mean_loss", 0.0))}

    def state_tensors(self) -> dict[str, torch.Tensor]:
        return {"weight": self.model.weight.detach().clone()}

    def load_state_tensors(self, tensors: Mapping[str, torch.Tensor]) -> None:
        with torch.no_grad():
            self.model.weight.copy_(tensors["weight"])

    def generator(self) -> Generator:
        return TemplateGenerator(self.model, self.info)


class TemplateMethod(Method):
    name = "templates"
    presets: ClassVar = {"tiny": {"batch_size": 64, "steps": 12, "max_grad_norm": 1.0, "lr": 0.5}}

    def trainer(self, info, config, plan, device, seed, randomness=None) -> Trainer:
        return TemplateTrainer(info, config, plan, seed, randomness or PrivateRandomness.fresh())

    def generator_from_state(self, info, config, tensors, device) -> Generator:
        model = Templates(len(info.classes), info.shape)
        with torch.no_grad():
            model.weight.copy_(tensors["weight"])
        return TemplateGenerator(model, info)
