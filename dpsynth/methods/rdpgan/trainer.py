"""RDP-GAN's trainer: DP-SGD discriminator steps on the real-loss term, generator steps on
D alone, and the checkpointed state."""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping

import torch
from torch import nn
from torch.func import functional_call
from torch.nn import functional as F

from dpsynth.methods.blocks import FitPenalty, dcgan_init, fit_generator_to_model, one_hot_labels
from dpsynth.methods.rdpgan.generator import (
    RDPGANGenerator,
    build_discriminator,
    build_generator,
    label_weights,
)
from dpsynth.methods.rdpgan.plan import step_sigmas
from dpsynth.methods.template import (
    StagedTrainer,
    load_module_tensors,
    module_tensors,
    seeded,
)
from dpsynth.privacy.mechanisms.dpsgd import PrivateGradient
from dpsynth.privacy.mechanisms.randomness import PrivateRandomness
from dpsynth.privacy.releases.central import CentralImages


class RDPGANTrainer(StagedTrainer):
    """D (privatised real term), G (post-processing) and their Adam optimisers."""

    # Computed from generated samples and the (public) current weights only.
    released_stats = ("d_fake_loss", "g_loss", "noise_multiplier")

    def setup(self, randomness: PrivateRandomness) -> None:
        """D and G (from the public seed), their optimisers, the secret streams, D's mechanism."""
        info, config, plan, seed = self.info, self.config, self.plan, self.seed
        self.num_classes = len(info.classes)
        self.batch_size = int(config["batch_size"])
        self.n_d = int(config["n_d"])
        self.ends, self.sigmas = step_sigmas(plan)
        # Generated labels: uniform, or a table target's declared public proportions (the
        # same rule as dpkernel); never the data's own class counts.
        self.label_weights = label_weights(info)
        with seeded(seed):
            self.net_d = build_discriminator(info, config).to(self.device)
            self.net_g = build_generator(info, config).to(self.device)
            if config["arch"] == "conv":
                self.net_d.apply(dcgan_init)
                self.net_g.apply(dcgan_init)
        betas = (float(config["beta1"]), 0.999)
        self.opt_d = torch.optim.Adam(
            self.net_d.parameters(), lr=float(config["lr_d"]), betas=betas
        )
        self.opt_g = torch.optim.Adam(
            self.net_g.parameters(), lr=float(config["lr_g"]), betas=betas
        )
        self.rng_noise = randomness.generator("rdpgan/noise", self.device)
        self.rng_latents = randomness.generator("rdpgan/latents", self.device)
        self.start_stages(randomness)
        # A privacy unit of K rows (tables): each row is clipped to C / K, so a unit's rows
        # move the sum by at most C, and the noise stays σ·C (multiplier K·σ at C / K); the
        # loop samples units (`UnitPoissonSampler`). K = 1: the per-row mechanism.
        self.unit_rows = int(info.rows_per_unit)
        self.private_d = PrivateGradient(
            self.net_d,
            self._real_loss,
            noise_multiplier=self.sigmas[0] * self.unit_rows if plan.private else 0.0,
            max_grad_norm=float(plan.max_grad_norm) / self.unit_rows if plan.private else 1.0,
            expected_batch_size=float(plan.expected_batch_size),
            generator=self.rng_noise,
            private=plan.private,
            batch_loss_fn=self._real_losses,  # ghost clipping: no per-record gradients
        )
        self.steps_done = 0
        # `frequency_anchor` > 0: a frozen copy of G as fitted to the DP frequency model
        # (`warm_start`), which each G step is pulled towards at the same latents.
        self.fit_penalty = FitPenalty(config)

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

    def _fakes(
        self, count: int, rng: torch.Generator | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`count` generated records with public labels (uniform, or the declared weights);
        latents from the run's stream, or from `rng` (the public pretraining's)."""
        z, onehot = self._latents(count, rng)
        return self.net_g(z, onehot), onehot

    def _latents(
        self, count: int, rng: torch.Generator | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The latents and one-hot labels of `_fakes`."""
        rng = self.rng_latents if rng is None else rng
        z = torch.randn(count, self.net_g.latent_dim, generator=rng, device=self.device)
        if self.label_weights is None:
            labels = torch.randint(self.num_classes, (count,), generator=rng, device=self.device)
        else:
            labels = torch.multinomial(
                self.label_weights.to(self.device), count, True, generator=rng
            )
        return z, one_hot_labels(labels, self.num_classes)

    def discriminator_step(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
        """One D step: DP-SGD gradient of the real term plus the exact fake-term gradient."""
        sigma = self.sigma_at(self.steps_done)
        self.private_d.noise_multiplier = sigma * self.unit_rows
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
        """Non-saturating G loss −log σ(D(G(u))) on a fresh fake batch, plus with a fit
        penalty `frequency_anchor` · the mean squared distance of G(u) to the frozen fit's image
        at the same latents; reads no data."""
        z, onehot = self._latents(self.batch_size)
        fakes = self.net_g(z, onehot)
        loss = F.softplus(-self.net_d(fakes, onehot)).mean()
        return self.fit_penalty.step_generator(self.net_g, self.opt_g, loss, (fakes, z, onehot))

    def step(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
        """One D step on the Poisson batch; then a G step after every n_d-th D step."""
        self.net_g.train()
        stats = self.discriminator_step(x, y)
        self.steps_done += 1
        stats["g_loss"] = self.generator_step() if self.steps_done % self.n_d == 0 else math.nan
        return stats

    def _modules(self) -> dict[str, nn.Module]:
        return {"discriminator": self.net_d, "generator": self.net_g} | self.fit_penalty.modules()

    def _optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {"opt_d": self.opt_d, "opt_g": self.opt_g}

    def own_state_tensors(self) -> dict[str, torch.Tensor]:
        """Weights, optimiser states and the step counter (public); never a secret stream."""
        out = module_tensors(self._modules(), self._optimizers())
        out["trainer.steps_done"] = torch.tensor(self.steps_done, dtype=torch.int64)
        return out

    def load_own_state(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Restore what `own_state_tensors` returned, so a resumed run continues exactly."""
        self.steps_done = int(tensors["trainer.steps_done"])
        if FitPenalty.in_checkpoint(tensors):
            self.fit_penalty.restore(self.net_g)
        load_module_tensors(tensors, self._modules(), self._optimizers(), self.device)

    def warm_start(self, release: CentralImages) -> None:
        """Before the first DP step: fit G to a DP release, the frequency model's samples
        (`frequency_fit_steps`; post-processing of the release, public latents)."""
        steps = int(self.config["frequency_fit_steps"])
        fit_generator_to_model(self.net_g, self.num_classes, release, steps, self.seed, self.device)
        self.fit_penalty.take(self.net_g)

    def public_uses(self, labelled: bool) -> tuple[str, ...]:
        """G and D (images, labelled or not) when `public_pretrain_steps` > 0, and the DP
        teacher when it can use the labels."""
        steps = int(self.config.get("public_pretrain_steps", 0))
        uses = ("generator", "discriminator") if steps > 0 and self.info.modality == "image" else ()
        return uses + (("DP teacher",) if self.teacher.uses_public(labelled) else ())

    def pretrain_public(self, x: torch.Tensor, y: torch.Tensor | None) -> None:
        """`public_pretrain_steps` non-private GAN steps on declared-public images before any
        DP step: a D step on a public batch of `batch_size` (both BCE terms, exact gradients)
        and a G step after every `n_d`-th, with their own Adam optimisers (the DP phase's start
        fresh); batches, latents and labels from the public seed. Unlabelled images get
        uniform random labels, so the conditioning learns nothing from them. Any frequency
        fit of G (`warm_start`) follows; the DP teacher, if any, pretrains on labelled ones."""
        steps = int(self.config.get("public_pretrain_steps", 0))
        if steps > 0 and self.info.modality == "image":
            self._public_gan(x.to(self.device, torch.float32), y, steps)
        self.teacher.pretrain_public(x, y)

    def _public_gan(self, x: torch.Tensor, y: torch.Tensor | None, steps: int) -> None:
        """The GAN steps of `pretrain_public` (see there)."""
        rng = torch.Generator(device=self.device).manual_seed(self.seed + 1_000_003)
        betas = (float(self.config["beta1"]), 0.999)
        opt_d = torch.optim.Adam(
            self.net_d.parameters(), lr=float(self.config["lr_d"]), betas=betas
        )
        opt_g = torch.optim.Adam(
            self.net_g.parameters(), lr=float(self.config["lr_g"]), betas=betas
        )
        labels = y.to(self.device) if y is not None else None
        self.net_d.train()
        self.net_g.train()
        for step in range(steps):
            index = torch.randint(len(x), (self.batch_size,), generator=rng, device=self.device)
            if labels is not None:
                real_labels = labels[index]
            else:
                real_labels = torch.randint(
                    self.num_classes, (self.batch_size,), generator=rng, device=self.device
                )
            with torch.no_grad():
                fakes, fake_onehot = self._fakes(self.batch_size, rng)
            real_onehot = one_hot_labels(real_labels, self.num_classes)
            d_loss = F.softplus(-self.net_d(x[index], real_onehot)).mean()
            d_loss = d_loss + F.softplus(self.net_d(fakes, fake_onehot)).mean()
            opt_d.zero_grad(set_to_none=True)
            d_loss.backward()
            opt_d.step()
            if (step + 1) % self.n_d == 0:
                fakes, fake_onehot = self._fakes(self.batch_size, rng)
                g_loss = F.softplus(-self.net_d(fakes, fake_onehot)).mean()
                opt_g.zero_grad(set_to_none=True)
                self.net_d.zero_grad(set_to_none=True)
                g_loss.backward()
                opt_g.step()
        # the DP phase starts with clean gradients
        self.net_d.zero_grad(set_to_none=True)
        self.net_g.zero_grad(set_to_none=True)

    def own_generator(self) -> RDPGANGenerator:
        """A sampler over a copy of the current generator weights."""
        return RDPGANGenerator.loaded(self.net_g.state_dict(), self.info, self.config, self.device)
