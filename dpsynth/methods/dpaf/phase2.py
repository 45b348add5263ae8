"""Phase 2 of DPAF's trainer: the windows of DPAGG discriminator steps, the conv2* DP-SGD
step at the released aggregates, and the generator's steps (BCE or matching; no data)."""

from __future__ import annotations

import math

import torch
from torch.func import functional_call
from torch.nn import functional as F

from dpsynth.methods.blocks import one_hot_labels
from dpsynth.privacy.mechanisms.aggregation import (
    noisy_feature_sum,
    private_gradient_sum,
    window_patterns,
)
from dpsynth.privacy.mechanisms.distributed import shard, shard_mask
from dpsynth.privacy.mechanisms.dpsgd import per_sample_grads


class WindowSteps:
    """`DPAFTrainer`'s phase-2 steps (mixed into it; they use its networks and streams)."""

    def _fakes(self, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """`count` generated images with uniform labels, and their one-hot labels (public)."""
        z, onehot = self._latents(count)
        return self.net_g(z, onehot), onehot

    def _latents(self, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The latents and uniform one-hot labels of `_fakes` (the run's latent stream)."""
        z = torch.randn(
            count, self.net_g.latent_dim, generator=self.rng_latents, device=self.device
        )
        labels = torch.randint(
            self.num_classes, (count,), generator=self.rng_latents, device=self.device
        )
        return z, one_hot_labels(labels, self.num_classes)

    def _release(self, features: torch.Tensor, *, across_ranks: bool = False) -> torch.Tensor:
        """DPAGG of a batch's features, divided by the public normaliser (`across_ranks`: the
        features are this rank's share of the real batch)."""
        noisy = noisy_feature_sum(
            features, self.rows.bound, self.agg_sigma, self.rng_agg, across_ranks=across_ranks
        )
        return noisy / self.agg_normalizer

    def _generator_step(self) -> float:
        """One G step on its loss (BCE through D, or matching), plus the fit penalty's
        pull when there is one; touches no data."""
        if self.match:
            return self._matching_step()
        z, onehot = self._latents(self.batch_size)
        images = self.net_g(z, onehot)
        features = self.rows(self.features(images, onehot), onehot)
        if self.config["g_view"] == "aggregate":
            # the clean aggregate of the fake batch: the input D's head was trained on
            features = features.sum(0, keepdim=True) / self.agg_normalizer
        logits = self.head(features).squeeze(1)
        loss = F.softplus(-logits).mean()
        return self.fit_penalty.step_generator(self.net_g, self.opt_g, loss, (images, z, onehot))

    def _matching_step(self) -> float:
        """G matches its per-class mean features to the released real aggregates' (public).

        The target of class c is block c of the running released sum divided by the block's
        noisy count coordinate; the generator's batch is balanced over the classes (labels
        public), so each class mean is over `g_batch / K` samples. With `frequency_anchor`,
        plus λ · MSE of the images to the frozen fit's at the same latents.
        """
        targets = self.rows.class_means(self.released_sum)
        if targets is None:
            return math.nan
        count = int(self.config["g_batch"])
        z = torch.randn(
            count, self.net_g.latent_dim, generator=self.rng_latents, device=self.device
        )
        labels = torch.arange(count, device=self.device) % self.num_classes
        onehot = one_hot_labels(labels, self.num_classes)
        images = self.net_g(z, onehot)
        h = self.features(images, onehot)
        fake_means = (onehot.t() @ h) / onehot.sum(0).clamp_min(1.0)[:, None]
        loss = (fake_means - targets).pow(2).sum(1).mean()
        return self.fit_penalty.step_generator(self.net_g, self.opt_g, loss, (images, z, onehot))

    def _window_step(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
        onehot = one_hot_labels(y, self.num_classes)
        patterns = window_patterns(x.shape[0], self.window, self.step_rate, self.rng_patterns)
        patterns = patterns.to(self.device)
        # Data-parallel: every rank holds the whole union and its patterns (same streams) and
        # reads only its share of the records; the released sums are all-reduced.
        mine = shard_mask(x.shape[0], self.device)
        weights = torch.zeros(x.shape[0], self.rows.dim, device=self.device)
        fake_terms: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        d_losses, g_losses = [], []
        n_critic = int(self.config["n_critic"])
        decay = float(self.config["target_decay"])
        for s in range(self.window):
            members = patterns[:, s]
            read = members & mine
            with torch.no_grad():
                real = (
                    self.rows(self.features(x[read], onehot[read]), onehot[read])
                    if bool(read.any())
                    else x.new_zeros(0, self.rows.dim)  # an empty Poisson batch: noise only
                )
                released_real = self._release(real, across_ranks=True)
                self.released_sum.mul_(decay).add_(released_real * self.agg_normalizer)
            self.d_steps += 1
            if not self.use_head:
                for _ in range(int(self.config["g_steps"])):
                    g_losses.append(self._generator_step())
                continue
            with torch.no_grad():
                fake_images, fake_onehot = self._fakes(self.batch_size)
                fake_rows = self.rows(self.features(fake_images, fake_onehot), fake_onehot)
                released_fake = self._release(fake_rows)
            clean_v = self._clean_aggregate_v(real, fake_rows) if self.paper else None
            aggregates = torch.stack([released_real, released_fake]).requires_grad_(True)
            logits = self.head(aggregates).squeeze(1)
            loss_real, loss_fake = F.softplus(-logits[0]), F.softplus(logits[1])
            loss = loss_real + loss_fake
            self.opt_head.zero_grad(set_to_none=True)
            loss.backward()
            # ∂ℓ/∂ã at the released aggregates with the current (public) head.
            v_real, v_fake = aggregates.grad[0].detach(), aggregates.grad[1].detach()
            if clean_v is not None:  # the paper's D̃: at the clean aggregates (not DP, F2)
                v_real, v_fake = clean_v
            self.opt_head.step()
            weights += members[:, None].to(weights.dtype) * v_real[None]
            fake_terms.append((fake_images, fake_onehot, v_fake))
            d_losses.append(float(loss.detach()))
            if self.d_steps % n_critic == 0:
                for _ in range(int(self.config["g_steps"])):
                    g_losses.append(self._generator_step())
        if self.train_conv2:
            self._conv2_step(x, onehot, weights, fake_terms)
        return {
            "d_loss": sum(d_losses) / len(d_losses) if d_losses else math.nan,
            "g_loss": sum(g_losses) / len(g_losses) if g_losses else math.nan,
        }

    def _clean_aggregate_v(
        self, real: torch.Tensor, fake: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """∂L'/∂a at the clean (noise-free) real and fake aggregates with the current head:
        the paper's conv2* gradient (mode=paper only; it depends on every record of the batch)."""
        clean = torch.stack([real.sum(0), fake.sum(0)]) / self.agg_normalizer
        clean.requires_grad_(True)
        logits = self.head(clean).squeeze(1)
        (grad,) = torch.autograd.grad(F.softplus(-logits[0]) + F.softplus(logits[1]), clean)
        return grad[0].detach(), grad[1].detach()

    def _conv2_step(
        self,
        x: torch.Tensor,
        onehot: torch.Tensor,
        weights: torch.Tensor,
        fake_terms: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
    ) -> None:
        """One DP-SGD step of conv2* on the window's union, at the released aggregates.

        Record x's gradient is (∂h_x/∂θ₂)ᵀ Σ_{s ∋ x} v_s with v_s = ∂ℓ_s/∂ã_s taken at the
        released ã_s: a function of x and public values only, so clipping bounds its
        contribution. The fake side (public) is added without noise.
        """
        features = self.features

        rows = self.rows

        def record_loss(params, buffers, image, label, weight) -> torch.Tensor:
            h = functional_call(features, (params, buffers), (image[None], label[None]))
            return (rows(h, label[None])[0] * weight).sum()

        x, onehot, weights = shard(x, onehot, weights)  # this rank's share (all in one process)
        if x.shape[0]:
            grads = per_sample_grads(features, record_loss, (x, onehot, weights))
        else:
            grads = {n: p.new_zeros(0, *p.shape) for n, p in self.conv2_params.items()}
        noisy = private_gradient_sum(
            grads,
            keep_fraction=float(self.config["grad_keep"]),
            max_norm=self.clip_conv2,
            noise_multiplier=self.conv2_sigma,
            generator=self.rng_conv2,
            across_ranks=True,
        )
        fake_loss = sum(
            (rows(features(images, labels), labels) * v[None]).sum()
            for images, labels, v in fake_terms
        )
        fake_grads = torch.autograd.grad(fake_loss, list(self.conv2_params.values()))
        scale = 1.0 / (self.window * self.batch_size)
        self.opt_conv2.zero_grad(set_to_none=True)
        for (name, p), fake in zip(self.conv2_params.items(), fake_grads, strict=True):
            p.grad = (noisy[name] + fake) * scale
        self.opt_conv2.step()
