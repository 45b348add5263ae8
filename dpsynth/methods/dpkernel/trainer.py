"""DP-Kernel's trainer: one step releases the privatised embedding gradient and descends the MMD
surrogate on it; the DP warm start, the EMA of the weights and the checkpointed state."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from dpsynth.errors import MechanismFailure, UsageError
from dpsynth.methods.blocks import fit_generator_to_model
from dpsynth.methods.dpkernel.basis import kernel_view
from dpsynth.methods.dpkernel.binning import number_bins
from dpsynth.methods.dpkernel.features import FeatureView, PublicEncoder, train_public_encoder
from dpsynth.methods.dpkernel.generator import DPKernelGenerator, one_hot_or_none
from dpsynth.methods.dpkernel.kernel import generated_kernel_mean, raw_embedding_gradient
from dpsynth.methods.dpkernel.labels import balanced_labels, target_weights, weighted_labels
from dpsynth.methods.dpkernel.nets import build_network
from dpsynth.methods.template import (
    StagedTrainer,
    load_module_tensors,
    module_tensors,
    seeded,
)
from dpsynth.privacy.mechanisms.distributed import all_reduce_sum, shard
from dpsynth.privacy.mechanisms.functional import (
    privatize_embedding_gradient,
    sample_derivative_noise,
)
from dpsynth.privacy.mechanisms.randomness import PrivateRandomness
from dpsynth.privacy.releases.central import CentralImages


class DPKernelTrainer(StagedTrainer):
    """One run's state: generator, optimiser, step count and the secret RNG for all draws."""

    # Functions of the released gradient and of generated points only (see `step`).
    released_stats = ("yy_term", "released_grad_norm")

    def setup(self, randomness: PrivateRandomness) -> None:
        """The generator (from the public seed), its optimiser and EMA, the kernel's view."""
        info, config, plan, seed = self.info, self.config, self.plan, self.seed
        with seeded(seed):
            self.net = build_network(info, config).to(self.device)
        # Latents and the derivative-GP noise: the run's secret stream, never the public seed.
        self.rng = randomness.generator("dpkernel/training")
        self.bandwidths = tuple(float(b) for b in config["bandwidths"])
        self.num_generated = int(config["generated_points"])
        self.num_classes = self.net.num_classes
        # A table's target may declare public class proportions (schema `weights`).
        self.label_weights = target_weights(info)
        # The public normaliser B = qN; the realised batch size is never used.
        self.normalizer = float(plan.expected_batch_size)
        self.steps_done = 0
        self.optimizer = _make_optimizer(self.net, config)
        # An exponential moving average of the weights (post-processing of the released
        # gradients) averages the functional noise over steps; the sampler uses it.
        self.ema_decay = float(config.get("ema", 0.0))
        self.ema = copy.deepcopy(self.net).requires_grad_(False) if self.ema_decay else None
        self.start_stages(randomness)
        self.bins = number_bins(info, config)
        # What the kernel sees: every pixel, or the lowest DCT frequencies (basis.py).
        self.view = kernel_view(
            info.shape, int(config.get("kernel_frequencies", 0)), info.modality, self.device
        )
        # Joined to features learnt from declared-public images (features.py): the encoder's
        # initial weights come from the public seed; `pretrain_public` trains it.
        self.encoder: PublicEncoder | None = None
        features = int(config.get("kernel_features", 0))
        if features > 0 and info.modality == "image":
            with seeded(seed + 2_000_003):
                encoder = PublicEncoder(tuple(info.shape), features, max(self.num_classes, 1))
            self.encoder = encoder.to(self.device).requires_grad_(False).eval()
            # Features of unit norm times the scale in kernel widths (the smallest bandwidth):
            # at 1, two images' features are at most √2 widths apart, as far as their pixels.
            scale = float(config.get("kernel_feature_scale", 1.0)) * min(self.bandwidths)
            self.view = FeatureView(self.view, self.encoder, scale)

    def step(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
        """One update from a Poisson batch; the batch is only forwarded to the private read."""
        self.net.train()
        if not self.num_classes:
            labels = None
        elif self.label_weights is not None:
            labels = weighted_labels(self.num_generated, self.label_weights)
        else:
            labels = balanced_labels(self.num_generated, self.num_classes, self.steps_done)
        z = torch.randn(
            self.num_generated, self.net.latent_dim, generator=self.rng, device=self.rng.device
        )
        dev_labels = labels.to(self.device) if labels is not None else None
        points = self.net(
            z.to(self.device),
            one_hot_or_none(dev_labels, self.num_classes) if labels is not None else None,
        )
        # Data-parallel: this rank's share of the batch (all of it in one process); the
        # embedding gradient is a sum over records, so the shares add up across ranks.
        x, y = shard(x, y)
        if self.bins is not None:  # a public per-record map (see binning.py)
            x = self.bins.encode(x)
        # The kernel's view (a public per-record map, basis.py; the identity by default): the
        # generated points here, the records inside the private read.
        points = self.view(points)
        batch_labels = y if labels is not None else None
        gradient = raw_embedding_gradient(
            x, batch_labels, points, dev_labels, self.bandwidths, self.normalizer, self.view
        )
        if self.plan.private:
            released = privatize_embedding_gradient(
                gradient,
                points,
                dev_labels,
                self.bandwidths,
                noise_multiplier=self.plan.noise_multiplier,
                # a privacy unit's K rows (tables, units sampled together) move the sum K times
                sum_sensitivity=self.plan.max_grad_norm * self.info.rows_per_unit,
                normalizer=self.normalizer,
                generator=self.rng,
                jitter=float(self.config["jitter"]),
                across_ranks=True,
            )
        else:
            released = all_reduce_sum({"gradient": gradient})["gradient"]
        surrogate, yy_term = self._descend(points, dev_labels, released)
        self.steps_done += 1
        self._update_ema()
        # Only public quantities: functions of the released gradient and of generated points.
        return {
            "loss": float(surrogate.detach()),
            "yy_term": float(yy_term.detach()),
            "released_grad_norm": float(released.norm()),
        }

    def preflight(self) -> None:
        """Draw the derivative-GP noise once at the initial generator's points (a copy of the
        public-seed weights, latents from a public generator, the secret stream untouched):
        settings under which its covariance cannot be factorised fail here, before the
        reservation, instead of at the first step after it."""
        if not self.plan.private:
            return
        public = torch.Generator(device=self.rng.device).manual_seed(0)
        net = copy.deepcopy(self.net)  # a forward in train mode moves norm statistics
        if not self.num_classes:
            labels = None
        elif self.label_weights is not None:
            labels = weighted_labels(self.num_generated, self.label_weights)
        else:
            labels = balanced_labels(self.num_generated, self.num_classes, 0)
        z = torch.randn(self.num_generated, net.latent_dim, generator=public, device=public.device)
        dev_labels = labels.to(self.device) if labels is not None else None
        with torch.no_grad():
            points = net(
                z.to(self.device),
                one_hot_or_none(dev_labels, self.num_classes) if labels is not None else None,
            )
        if not torch.isfinite(points).all():
            raise UsageError(
                "--method dpkernel cannot start with these settings: the initial generator's "
                "points are not finite"
            )
        try:
            sample_derivative_noise(
                self.view(points),
                dev_labels,
                self.bandwidths,
                public,
                jitter=float(self.config["jitter"]),
            )
        except MechanismFailure as exc:
            raise UsageError(
                f"--method dpkernel cannot start with these settings (--set bandwidths, jitter, "
                f"generated_points): {exc}"
            ) from None

    def warm_start(self, release: CentralImages) -> None:
        """Pretrain the generator on a DP release (central images or frequency model) before
        the first DP step: post-processing of the release, no data read.

        A frequency model of dimension d ≤ `latent_dim`: G regresses onto the model's own
        sampling map for `warm_start_steps` steps (`fit_generator_to_model`), so it starts as
        the model. Otherwise `warm_start_steps` MMD steps (the run's kernel, `generated_points`
        per step, the same surrogate as `step`) towards the model's samples, or towards
        "records" released_mean[y] + `warm_start_jitter`·N(0, I), with balanced y. The EMA (if
        any) is reset to the pretrained weights; the DP steps then refine them.
        """
        model = release.model
        if model is not None and self.num_classes and self.net.latent_dim >= model.dim:
            steps = int(self.config["warm_start_steps"])
            fit_generator_to_model(
                self.net, self.num_classes, release, steps, self.seed, self.device
            )
        else:
            self._mmd_warm_start(release)
        if self.ema is not None:
            self.ema.load_state_dict(self.net.state_dict())

    def public_uses(self, labelled: bool) -> tuple[str, ...]:
        """The generator (images only) when `public_pretrain_steps` > 0, and the DP teacher
        when it can use the labels."""
        steps = int(self.config.get("public_pretrain_steps", 0))
        uses = ("generator",) if steps > 0 and self.info.modality == "image" else ()
        # The kernel's features need the data's classes (`check_public` refuses otherwise).
        uses += ("kernel features",) if self.encoder is not None and labelled else ()
        return uses + (("DP teacher",) if self.teacher.uses_public(labelled) else ())

    def pretrain_public(self, x: torch.Tensor, y: torch.Tensor | None) -> None:
        """Fit the generator to declared-public images before any private step: the DP step
        without its noise, `public_pretrain_steps` times, on `generated_points` public images
        a step (drawn with replacement) against as many generated points with balanced labels
        (the class-conditional kernel when labelled, else the unconditional one), with its
        own optimiser; latents and batches from the public seed. The EMA (if any) restarts
        from the result; the DP teacher, if any, pretrains on labelled images."""
        if self.encoder is not None:
            if y is None:
                raise UsageError(
                    "kernel_features needs --public images labelled with the data's classes"
                )
            self.encoder.requires_grad_(True)
            train_public_encoder(
                self.encoder,
                x,
                y,
                int(self.config.get("kernel_encoder_steps", 1000)),
                self.seed + 2_000_029,
            )
        steps = int(self.config.get("public_pretrain_steps", 0))
        count = self.num_generated
        rng = torch.Generator().manual_seed(self.seed + 1_000_003)
        optimizer = _make_optimizer(self.net, self.config)
        self.net.train()
        for step in range(steps if self.info.modality == "image" else 0):
            index = torch.randint(0, len(x), (count,), generator=rng)
            records = x[index.to(x.device)].flatten(1)
            labels = balanced_labels(count, self.num_classes, step).to(self.device)
            z = torch.randn(count, self.net.latent_dim, generator=rng)
            points = self.view(
                self.net(z.to(self.device), one_hot_or_none(labels, self.num_classes))
            )
            if y is None:  # unlabelled: the unconditional kernel
                target = raw_embedding_gradient(
                    records, None, points, None, self.bandwidths, float(count), self.view
                )
                self._descend(points, None, target, optimizer)
            else:
                record_labels = y[index.to(y.device)]
                target = raw_embedding_gradient(
                    records,
                    record_labels,
                    points,
                    labels,
                    self.bandwidths,
                    float(count),
                    self.view,
                )
                self._descend(points, labels, target, optimizer)
        if steps > 0 and self.ema is not None:
            self.ema.load_state_dict(self.net.state_dict())
        self.teacher.pretrain_public(x, y)

    def _mmd_warm_start(self, release: CentralImages) -> None:
        """The MMD warm start (see `warm_start`): latents from the run's stream."""
        central = CentralImages(
            release.means.to(self.device, torch.float32), release.counts, release.model
        )
        jitter = float(self.config["warm_start_jitter"])
        count = self.num_generated
        for step in range(int(self.config["warm_start_steps"])):
            labels = balanced_labels(count, self.num_classes, step).to(self.device)
            onehot = one_hot_or_none(labels, self.num_classes)
            # the model's samples (a frequency release), else mean[y] + jitter·N(0, I)
            records = central.records(labels, jitter, self.rng).flatten(1).to(self.device)
            z = torch.randn(count, self.net.latent_dim, generator=self.rng, device=self.rng.device)
            points = self.view(self.net(z.to(self.device), onehot))
            target = raw_embedding_gradient(
                records, labels, points, labels, self.bandwidths, float(count), self.view
            )
            self._descend(points, labels, target)

    def _descend(
        self,
        points: torch.Tensor,
        labels: torch.Tensor | None,
        gradient: torch.Tensor,
        optimizer: torch.optim.Optimizer | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One optimiser step on the MMD surrogate E k(y, y') − (2/M) Σ_j ⟨gradient_j, y_j⟩,
        whose gradient w.r.t. the generated points is the MMD's with the data's mean embedding
        gradient replaced by `gradient` (the released one, or the warm start's target).
        Returns the surrogate and its E k(y, y') term, detached. `optimizer`: the run's own
        by default."""
        optimizer = optimizer if optimizer is not None else self.optimizer
        gradient = gradient.to(points.dtype).detach()
        yy_term = generated_kernel_mean(points, labels, self.bandwidths)
        surrogate = yy_term - (2.0 / self.num_generated) * (gradient * points).sum()
        optimizer.zero_grad(set_to_none=True)
        surrogate.backward()
        optimizer.step()
        return surrogate.detach(), yy_term.detach()

    @torch.no_grad()
    def _update_ema(self) -> None:
        """EMA of the parameters, warm-up decay ≤ (1 + t)/(10 + t); buffers are copied."""
        if self.ema is None:
            return
        decay = min(self.ema_decay, (1.0 + self.steps_done) / (10.0 + self.steps_done))
        for average, current in zip(self.ema.parameters(), self.net.parameters(), strict=True):
            average.mul_(decay).add_(current.detach(), alpha=1.0 - decay)
        for average, current in zip(self.ema.buffers(), self.net.buffers(), strict=True):
            average.copy_(current)

    def _modules(self) -> dict[str, nn.Module]:
        """The saved networks: the generator, its EMA and the kernel's encoder when the config
        keeps them."""
        out: dict[str, nn.Module] = {"generator": self.net}
        if self.ema is not None:
            out["ema"] = self.ema
        if self.encoder is not None:
            out["kernel_encoder"] = self.encoder
        return out

    def own_state_tensors(self) -> dict[str, torch.Tensor]:
        """Generator weights and buffers (and their EMA), optimiser state, step count (no
        secret RNG state)."""
        out = module_tensors(self._modules(), {"optimizer": self.optimizer})
        out["trainer.steps_done"] = torch.tensor(self.steps_done, dtype=torch.int64)
        return out

    def load_own_state(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Restore what `own_state_tensors` returned, so a resumed run continues exactly."""
        load_module_tensors(tensors, self._modules(), {"optimizer": self.optimizer}, self.device)
        self.steps_done = int(tensors["trainer.steps_done"])

    def own_generator(self) -> DPKernelGenerator:
        """A sampler over a copy of the current weights (their EMA when the config has one)."""
        weights = (self.ema if self.ema is not None else self.net).state_dict()
        return DPKernelGenerator.loaded(weights, self.info, self.config, self.device)


def _make_optimizer(net: nn.Module, config: Mapping[str, Any]) -> torch.optim.Optimizer:
    name, lr = str(config["optimizer"]), float(config["lr"])
    if name == "rmsprop":
        return torch.optim.RMSprop(net.parameters(), lr=lr)
    if name == "adam":
        return torch.optim.Adam(net.parameters(), lr=lr, betas=(0.5, 0.999))
    raise UsageError(f"optimizer must be rmsprop or adam, got {name!r}")
