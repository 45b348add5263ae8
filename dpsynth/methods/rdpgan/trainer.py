"""RDP-GAN's trainer: DP-SGD discriminator steps on the real-loss term, generator steps on
D alone, and the checkpointed state."""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torch.func import functional_call
from torch.nn import functional as F

from dpsynth.data.images import DataInfo
from dpsynth.methods.base import Generator, PrivacyPlan, Trainer, sample_truncation
from dpsynth.methods.blocks import FrequencyStart, Teacher, fit_generator_to_model
from dpsynth.methods.rdpgan.generator import (
    RDPGANGenerator,
    build_discriminator,
    build_generator,
    label_weights,
    one_hot_labels,
    with_prefix,
)
from dpsynth.methods.rdpgan.nets import init_weights
from dpsynth.methods.rdpgan.plan import step_sigmas
from dpsynth.privacy.central import CentralImages
from dpsynth.privacy.dpsgd import PrivateGradient
from dpsynth.privacy.randomness import PrivateRandomness


class RDPGANTrainer(Trainer):
    """D (privatised real term), G (post-processing) and their Adam optimisers."""

    # Computed from generated samples and the (public) current weights only.
    released_stats = ("d_fake_loss", "g_loss", "noise_multiplier")

    def __init__(
        self,
        info: DataInfo,
        config: Mapping[str, Any],
        plan: PrivacyPlan,
        device: torch.device,
        seed: int,
        randomness: PrivateRandomness | None = None,
    ) -> None:
        self.info = info
        self.config = dict(config)
        self.plan = plan
        self.device = torch.device(device)
        self.num_classes = len(info.classes)
        self.batch_size = int(config["batch_size"])
        self.n_d = int(config["n_d"])
        self.ends, self.sigmas = step_sigmas(plan)
        # Generated labels: uniform, or a table target's declared public proportions (the
        # same rule as dpkernel); never the data's own class counts.
        self.label_weights = label_weights(info)
        with torch.random.fork_rng(devices=[]):  # seeded init without touching the global RNG
            torch.manual_seed(seed)
            self.net_d = build_discriminator(info, config).to(self.device)
            self.net_g = build_generator(info, config).to(self.device)
            if config["arch"] == "conv":
                self.net_d.apply(init_weights)
                self.net_g.apply(init_weights)
        betas = (float(config["beta1"]), 0.999)
        self.opt_d = torch.optim.Adam(
            self.net_d.parameters(), lr=float(config["lr_d"]), betas=betas
        )
        self.opt_g = torch.optim.Adam(
            self.net_g.parameters(), lr=float(config["lr_g"]), betas=betas
        )
        randomness = randomness if randomness is not None else PrivateRandomness.fresh()
        self.rng_noise = randomness.generator("rdpgan/noise", self.device)
        self.rng_latents = randomness.generator("rdpgan/latents", self.device)
        # The run's DP teacher, if its plan has one (post-processing of the samples).
        self.teacher = Teacher(info, config, plan, self.device, seed, randomness)
        self.frequency = FrequencyStart(info, plan, randomness)
        self.seed = int(seed)
        self.private_d = PrivateGradient(
            self.net_d,
            self._real_loss,
            noise_multiplier=self.sigmas[0] if plan.private else 0.0,
            max_grad_norm=float(plan.max_grad_norm) if plan.private else 1.0,
            expected_batch_size=float(plan.expected_batch_size),
            generator=self.rng_noise,
            private=plan.private,
            batch_loss_fn=self._real_losses,  # ghost clipping: no per-record gradients
        )
        self.steps_done = 0

    def sigma_at(self, step: int) -> float:
        """The noise multiplier of loop step `step` (0-based), from the plan's events."""
        if not self.plan.private:
            return 0.0
        return self.sigmas[min(bisect.bisect_right(self.ends, step), len(self.sigmas) - 1)]

    def _real_loss(self, params, buffers, x, onehot) -> torch.Tensor:
        """One real record's BCE term −log σ(D(x)) = softplus(−logit)."""
        logit = functional_call(self.net_d, (params, buffers), (x[None], onehot[None]))
        return F.softplus(-logit).sum()

    def _real_losses(self, x: torch.Tensor, onehot: torch.Tensor) -> torch.Tensor:
        """Each real record's term softplus(−D(x)) [b] (`_real_loss`, batched)."""
        return F.softplus(-self.net_d(x, onehot))

    def _fakes(self, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """`count` generated records with public labels (uniform, or the declared weights)."""
        z = torch.randn(
            count, self.net_g.latent_dim, generator=self.rng_latents, device=self.device
        )
        if self.label_weights is None:
            labels = torch.randint(
                self.num_classes, (count,), generator=self.rng_latents, device=self.device
            )
        else:
            labels = torch.multinomial(
                self.label_weights.to(self.device), count, True, generator=self.rng_latents
            )
        onehot = one_hot_labels(labels, self.num_classes)
        return self.net_g(z, onehot), onehot

    def discriminator_step(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
        """One D step: DP-SGD gradient of the real term plus the exact fake-term gradient."""
        sigma = self.sigma_at(self.steps_done)
        self.private_d.noise_multiplier = sigma
        self.opt_d.zero_grad(set_to_none=True)
        stats = self.private_d.compute(x, one_hot_labels(y, self.num_classes))
        real_grads = {n: p.grad for n, p in self.net_d.named_parameters()}
        with torch.no_grad():
            fakes, onehot = self._fakes(self.batch_size)
        fake_loss = F.softplus(self.net_d(fakes, onehot)).mean()
        params = list(self.net_d.parameters())
        fake_grads = torch.autograd.grad(fake_loss, params)
        for (name, p), fake in zip(self.net_d.named_parameters(), fake_grads, strict=True):
            p.grad = real_grads[name] + fake
        self.opt_d.step()
        return {
            "loss": stats["mean_loss"],
            "clip_fraction": stats["clip_fraction"],
            "d_fake_loss": float(fake_loss.detach()),
            "noise_multiplier": sigma,
        }

    def generator_step(self) -> float:
        """Non-saturating G loss −log σ(D(G(u))) on a fresh fake batch; reads no data."""
        fakes, onehot = self._fakes(self.batch_size)
        loss = F.softplus(-self.net_d(fakes, onehot)).mean()
        grads = torch.autograd.grad(loss, list(self.net_g.parameters()))
        self.opt_g.zero_grad(set_to_none=True)
        for p, g in zip(self.net_g.parameters(), grads, strict=True):
            p.grad = g
        self.opt_g.step()
        return float(loss.detach())

    def step(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
        """One D step on the Poisson batch; then a G step after every n_d-th D step."""
        self.net_g.train()
        stats = self.discriminator_step(x, y)
        self.steps_done += 1
        stats["g_loss"] = self.generator_step() if self.steps_done % self.n_d == 0 else math.nan
        return stats

    def _modules(self) -> dict[str, nn.Module]:
        return {"discriminator": self.net_d, "generator": self.net_g}

    def _optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {"opt_d": self.opt_d, "opt_g": self.opt_g}

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """Weights, optimiser states and the step counter (public); never a secret stream."""
        out: dict[str, torch.Tensor] = {}
        for prefix, module in self._modules().items():
            for key, value in module.state_dict().items():
                out[f"{prefix}.{key}"] = value.detach().cpu().clone()
        for prefix, optimizer in self._optimizers().items():
            for index, state in optimizer.state_dict()["state"].items():
                for key, value in state.items():
                    tensor = value if torch.is_tensor(value) else torch.tensor(value)
                    out[f"{prefix}.{index}.{key}"] = tensor.detach().cpu().clone()
        out |= self.teacher.state_tensors()
        out["trainer.steps_done"] = torch.tensor(self.steps_done, dtype=torch.int64)
        return out

    def load_state_tensors(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Restore what `state_tensors` returned, so a resumed run continues exactly."""
        self.steps_done = int(tensors["trainer.steps_done"])
        self.teacher.load_state_tensors(tensors)
        for prefix, module in self._modules().items():
            module.load_state_dict(with_prefix(tensors, prefix + "."))
        for prefix, optimizer in self._optimizers().items():
            state: dict[int, dict[str, torch.Tensor]] = {}
            for name, value in with_prefix(tensors, prefix + ".").items():
                index, key = name.split(".", 1)
                state.setdefault(int(index), {})[key] = value.to(
                    self.device if key != "step" else "cpu"
                )
            groups = optimizer.state_dict()["param_groups"]
            optimizer.load_state_dict({"state": state, "param_groups": groups})

    def release_whole_data(self, step: int, x: torch.Tensor, y: torch.Tensor) -> None:
        """The plan's shared stages: the frequency model's release and G's fit to it before
        step 0, the DP teacher's training at the step its plan says (none without them)."""
        release = self.frequency.release(step, x, y)
        if release is not None:
            self._fit_to_frequency_model(release)
        self.teacher.release_whole_data(step, x, y, self._own_generator)

    def _fit_to_frequency_model(self, release: CentralImages) -> None:
        """Before the first DP step: fit G to the DP frequency model's samples by MMD
        (`frequency_fit_steps`; post-processing of the release, public latents)."""
        steps = int(self.config["frequency_fit_steps"])
        fit_generator_to_model(self.net_g, self.num_classes, release, steps, self.seed, self.device)

    def generator(self) -> Generator:
        """A sampler over a copy of the current generator weights (behind the DP teacher
        once it is trained)."""
        return self.teacher.wrap(self._own_generator(), self.config)

    def _own_generator(self) -> RDPGANGenerator:
        net = build_generator(self.info, self.config)
        net.load_state_dict(self.net_g.state_dict())
        return RDPGANGenerator(
            net, self.info.classes, self.device, self.info.modality, sample_truncation(self.config)
        )
