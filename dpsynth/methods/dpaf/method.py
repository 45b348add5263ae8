"""DPAF (Lin et al., arXiv 2304.12185) in the sound `strict` mode of spec `dpaf.md` §10.3.

Learning idea: a conditional DCGAN whose discriminator aggregates the SIN-normalised feature
vectors of a whole batch and adds Gaussian noise to that aggregate (DPAGG) in the forward
pass, so the layers after the aggregation (the head) train on released values only. The
layers before it are protected separately: conv1 by DP-SGD in a classifier C (phase 1,
transferred and frozen) or random and frozen, conv2* by one DP-SGD step per window of μ
discriminator steps. The generator never sees private data.

What differs from the paper (whose guarantee does not hold, spec §10.1-F2..F4):
- Poisson sampling everywhere, add/remove neighbours, public normalisers (B, μB);
- phase 1 is per-sample DP-SGD on ALL of C's parameters with per-sample targets
  (classification), not DP-SGD on conv1 through a clean aggregate and non-private layers;
- the conv2* gradient is evaluated at the RELEASED noisy aggregates (a record's gradient then
  depends on that record and on public values only), not at the clean aggregate;
- the window's shared sampling is accounted as one mechanism per window (no independent
  "three streams"), with the conservative bound of `dpsynth.privacy.aggregation`;
- the fake aggregate gets an independent noise draw of the same std as the real one (the
  same draw would cancel in the difference and reveal the real sum).

How a step of the training loop maps onto DPAF: the loop draws one Poisson batch at rate
q_w = 1 − (1 − q)^μ per step. The first `c_steps` steps are phase-1 DP-SGD steps of C on that
lot; every later step is one window: each record of the union gets its participation pattern
in the μ discriminator steps (`window_patterns`), which makes the μ batches independent
Poisson(q) batches. Both kinds of step are dominated by a Poisson(q_w)-subsampled Gaussian of
multiplier σ_w, so one σ_w is calibrated for the whole run; phase 1 and phase 2 are recorded
as two ledger events with that σ_w.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch.func import functional_call
from torch.nn import functional as F

from dpsynth.data.images import DataInfo, to_uint8
from dpsynth.errors import UsageError
from dpsynth.methods.base import Generator, Method, PrivacyPlan, PrivacyTarget, Trainer
from dpsynth.methods.dpaf.model import Classifier, CondGenerator, Features, Head, init_weights
from dpsynth.methods.dpaf.presets import CHOICES, PRESETS
from dpsynth.privacy.accounting import calibrate_noise
from dpsynth.privacy.aggregation import (
    WINDOW_ACCOUNTING_NOTE,
    noisy_feature_sum,
    private_gradient_sum,
    split_window_noise,
    window_patterns,
    window_sampling_rate,
)
from dpsynth.privacy.distributed import shard, shard_mask
from dpsynth.privacy.dpsgd import PrivateGradient, per_sample_grads
from dpsynth.privacy.randomness import PrivateRandomness

_ADAM_BETAS = (0.5, 0.999)


# --------------------------------------------------------------------------- networks


def build_features(info: DataInfo, config: Mapping[str, Any]) -> Features:
    """The discriminator's (or C's) feature extractor for this data's shape and labels."""
    return Features(
        tuple(info.shape),
        len(info.classes),
        int(config["width"]),
        int(config["conv1_layers"]),
        int(config["conv2_layers"]),
    )


def build_generator(info: DataInfo, config: Mapping[str, Any]) -> CondGenerator:
    """The conditional generator for this data's shape and labels."""
    return CondGenerator(
        tuple(info.shape), len(info.classes), int(config["latent_dim"]), int(config["g_width"])
    )


def _onehot(labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    return F.one_hot(labels, num_classes).float()


# --------------------------------------------------------------------------- generator


class DPAFGenerator(Generator):
    """Samples uint8 images [b, C, H, W] from the trained conditional generator."""

    def __init__(self, net: CondGenerator, classes: tuple[str, ...], device: torch.device):
        self.net = net.to(device).eval()
        self.classes = tuple(classes)
        self.shape = tuple(net.shape)  # type: ignore[assignment]
        self.device = device

    @torch.no_grad()
    def sample(
        self, labels: torch.Tensor, batch_size: int, generator: torch.Generator
    ) -> Iterator[torch.Tensor]:
        """Yield uint8 batches for `labels` in order; latents come from `generator`."""
        for start in range(0, int(labels.numel()), batch_size):
            chunk = labels[start : start + batch_size].to(torch.int64)
            z = torch.randn(
                chunk.numel(), self.net.latent_dim, generator=generator, device=generator.device
            )
            onehot = _onehot(chunk.to(self.device), self.net.num_classes)
            yield to_uint8(self.net(z.to(self.device), onehot)).cpu()


# --------------------------------------------------------------------------- trainer


class DPAFTrainer(Trainer):
    """One run: C (phase 1), the split discriminator, the generator and their optimisers."""

    # Functions of the released noisy aggregates, of public weights and of generated samples.
    released_stats = ("d_loss", "g_loss")

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
        self.window = int(config["window"])
        self.c_steps = int(config["c_steps"])
        self.step_rate = min(1.0, self.batch_size / info.n)
        # Public normalisers: B for a mean aggregate, μB for the conv2* step.
        self.agg_normalizer = float(self.batch_size) if config["agg_reduction"] == "mean" else 1.0
        if plan.private:
            window_sigma = float(plan.noise_multiplier)
            self.c_sigma = window_sigma
            self.agg_sigma, self.conv2_sigma = split_window_noise(
                window_sigma, self.window, float(config["noise_ratio"])
            )
            self.clip_conv2 = float(config["clip_conv2"])
        else:
            self.c_sigma = self.agg_sigma = self.conv2_sigma = 0.0
            self.clip_conv2 = math.inf
        with torch.random.fork_rng(devices=[]):  # seeded init without touching the global RNG
            torch.manual_seed(seed)
            self.features = build_features(info, config).to(self.device)
            self.head = Head(self.features.dim, int(config["fc_hidden"]), 1).to(self.device)
            self.net_g = build_generator(info, config).to(self.device)
            self.classifier = (
                Classifier(build_features(info, config), int(config["fc_hidden"])).to(self.device)
                if self.c_steps > 0
                else None
            )
            for module in (self.features, self.head, self.net_g, self.classifier):
                if module is not None:
                    module.apply(init_weights)
        for p in self.features.conv1_parameters():  # conv1 never trains inside D
            p.requires_grad_(False)
        self.conv2_params = dict(
            (n, p) for n, p in self.features.named_parameters() if p.requires_grad
        )
        lr = float(config["lr"])
        self.opt_head = torch.optim.Adam(self.head.parameters(), lr=lr, betas=_ADAM_BETAS)
        self.opt_conv2 = torch.optim.Adam(self.conv2_params.values(), lr=lr, betas=_ADAM_BETAS)
        self.opt_g = torch.optim.Adam(self.net_g.parameters(), lr=lr, betas=_ADAM_BETAS)
        # Every stream is asked for now, so that a resumed run restores the same set.
        randomness = randomness if randomness is not None else PrivateRandomness.fresh()
        self.rng_patterns = randomness.generator("dpaf/patterns", self.device)
        self.rng_agg = randomness.generator("dpaf/aggregate-noise", self.device)
        self.rng_conv2 = randomness.generator("dpaf/conv2-noise", self.device)
        self.rng_latents = randomness.generator("dpaf/latents", self.device)
        rng_c = randomness.generator("dpaf/classifier-noise", self.device)
        self.opt_c = None
        self.private_c = None
        if self.classifier is not None:
            self.opt_c = torch.optim.Adam(
                self.classifier.parameters(), lr=float(config["lr_c"]), betas=_ADAM_BETAS
            )
            self.private_c = PrivateGradient(
                self.classifier,
                self._classifier_loss,
                noise_multiplier=self.c_sigma,
                max_grad_norm=float(config["clip_c"]),
                expected_batch_size=float(plan.expected_batch_size),
                generator=rng_c,
                private=plan.private,
                batch_loss_fn=self._classifier_losses,  # ghost clipping where it applies
            )
        self.steps_done = 0
        self.d_steps = 0

    # ----------------------------------------------------------------- phase 1

    def _classifier_loss(self, params, buffers, x, label_input, y) -> torch.Tensor:
        """One record's cross-entropy under C (per-sample targets: no aggregation)."""
        logits = functional_call(self.classifier, (params, buffers), (x[None], label_input[None]))
        return F.cross_entropy(logits, y[None])

    def _classifier_losses(self, x, label_input, y) -> torch.Tensor:
        """Each record's cross-entropy under C [b] (`_classifier_loss`, batched)."""
        return F.cross_entropy(self.classifier(x, label_input), y, reduction="none")

    def _phase1_step(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
        onehot = _onehot(y, self.num_classes)
        label_input = onehot if self.config["c_label_input"] else torch.zeros_like(onehot)
        self.opt_c.zero_grad(set_to_none=True)
        stats = self.private_c.compute(x, label_input, y)
        self.opt_c.step()
        return {"c_loss": stats["mean_loss"]}

    def _transfer_conv1(self) -> None:
        """Copy C's (DP-trained) conv1 into the discriminator, where it stays frozen (and its
        conv2 into conv2* with `transfer_conv2`)."""
        with torch.no_grad():
            for target, source in zip(
                self.features.conv1_parameters(),
                self.classifier.features.conv1_parameters(),
                strict=True,
            ):
                target.copy_(source)
            if self.config["transfer_conv2"]:  # C's conv2 is DP-trained too: a free start
                for target, source in zip(
                    self.conv2_params.values(),
                    self.classifier.features.conv2.parameters(),
                    strict=True,
                ):
                    target.copy_(source)
        self.classifier = self.opt_c = self.private_c = None

    # ----------------------------------------------------------------- phase 2

    def _fakes(self, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """`count` generated images with uniform labels, and their one-hot labels (public)."""
        z = torch.randn(
            count, self.net_g.latent_dim, generator=self.rng_latents, device=self.device
        )
        labels = torch.randint(
            self.num_classes, (count,), generator=self.rng_latents, device=self.device
        )
        onehot = _onehot(labels, self.num_classes)
        return self.net_g(z, onehot), onehot

    def _release(self, features: torch.Tensor, *, across_ranks: bool = False) -> torch.Tensor:
        """DPAGG of a batch's features, divided by the public normaliser (`across_ranks`: the
        features are this rank's share of the real batch)."""
        noisy = noisy_feature_sum(
            features, self.features.bound, self.agg_sigma, self.rng_agg, across_ranks=across_ranks
        )
        return noisy / self.agg_normalizer

    def _generator_step(self) -> float:
        """Non-saturating G loss through D without aggregation (D̂); touches no data."""
        images, onehot = self._fakes(self.batch_size)
        features = self.features(images, onehot)
        if self.config["g_view"] == "aggregate":
            # the clean aggregate of the fake batch: the input D's head was trained on
            features = features.sum(0, keepdim=True) / self.agg_normalizer
        logits = self.head(features).squeeze(1)
        loss = F.softplus(-logits).mean()
        grads = torch.autograd.grad(loss, list(self.net_g.parameters()))
        self.opt_g.zero_grad(set_to_none=True)
        for p, g in zip(self.net_g.parameters(), grads, strict=True):
            p.grad = g
        self.opt_g.step()
        return float(loss.detach())

    def _window_step(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
        onehot = _onehot(y, self.num_classes)
        patterns = window_patterns(x.shape[0], self.window, self.step_rate, self.rng_patterns)
        patterns = patterns.to(self.device)
        # Data-parallel: every rank holds the whole union and its patterns (same streams) and
        # reads only its share of the records; the released sums are all-reduced.
        mine = shard_mask(x.shape[0], self.device)
        weights = torch.zeros(x.shape[0], self.features.dim, device=self.device)
        fake_terms: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        d_losses, g_losses = [], []
        n_critic = int(self.config["n_critic"])
        for s in range(self.window):
            members = patterns[:, s]
            read = members & mine
            with torch.no_grad():
                real = (
                    self.features(x[read], onehot[read])
                    if bool(read.any())
                    else x.new_zeros(0, self.features.dim)  # an empty Poisson batch: noise only
                )
                released_real = self._release(real, across_ranks=True)
                fake_images, fake_onehot = self._fakes(self.batch_size)
                released_fake = self._release(self.features(fake_images, fake_onehot))
            aggregates = torch.stack([released_real, released_fake]).requires_grad_(True)
            logits = self.head(aggregates).squeeze(1)
            loss_real, loss_fake = F.softplus(-logits[0]), F.softplus(logits[1])
            loss = loss_real + loss_fake
            self.opt_head.zero_grad(set_to_none=True)
            loss.backward()
            # ∂ℓ/∂ã at the released aggregates with the current (public) head.
            v_real, v_fake = aggregates.grad[0].detach(), aggregates.grad[1].detach()
            self.opt_head.step()
            weights += members[:, None].to(weights.dtype) * v_real[None]
            fake_terms.append((fake_images, fake_onehot, v_fake))
            d_losses.append(float(loss.detach()))
            self.d_steps += 1
            if self.d_steps % n_critic == 0:
                g_losses.append(self._generator_step())
        self._conv2_step(x, onehot, weights, fake_terms)
        return {
            "d_loss": sum(d_losses) / len(d_losses),
            "g_loss": sum(g_losses) / len(g_losses) if g_losses else math.nan,
        }

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

        def record_loss(params, buffers, image, label, weight) -> torch.Tensor:
            h = functional_call(features, (params, buffers), (image[None], label[None]))
            return (h[0] * weight).sum()

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
            (features(images, labels) * v[None]).sum() for images, labels, v in fake_terms
        )
        fake_grads = torch.autograd.grad(fake_loss, list(self.conv2_params.values()))
        scale = 1.0 / (self.window * self.batch_size)
        self.opt_conv2.zero_grad(set_to_none=True)
        for (name, p), fake in zip(self.conv2_params.items(), fake_grads, strict=True):
            p.grad = (noisy[name] + fake) * scale
        self.opt_conv2.step()

    # ----------------------------------------------------------------- interface

    def step(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
        """A phase-1 step of C for the first `c_steps` loop steps, then one window each."""
        self.net_g.train()
        if self.steps_done < self.c_steps:
            stats = self._phase1_step(x, y)
            self.steps_done += 1
            if self.steps_done == self.c_steps:
                self._transfer_conv1()
            return stats
        stats = self._window_step(x, y)
        self.steps_done += 1
        return stats

    def _modules(self) -> dict[str, torch.nn.Module]:
        out = {"features": self.features, "head": self.head, "generator": self.net_g}
        if self.classifier is not None:
            out["classifier"] = self.classifier
        return out

    def _optimizers(self) -> dict[str, torch.optim.Optimizer]:
        out = {"opt_head": self.opt_head, "opt_conv2": self.opt_conv2, "opt_g": self.opt_g}
        if self.opt_c is not None:
            out["opt_c"] = self.opt_c
        return out

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """Weights, optimiser states and counters (public); never a secret stream's state."""
        out: dict[str, torch.Tensor] = {}
        for prefix, module in self._modules().items():
            for key, value in module.state_dict().items():
                out[f"{prefix}.{key}"] = value.detach().cpu().clone()
        for prefix, optimizer in self._optimizers().items():
            for index, state in optimizer.state_dict()["state"].items():
                for key, value in state.items():
                    tensor = value if torch.is_tensor(value) else torch.tensor(value)
                    out[f"{prefix}.{index}.{key}"] = tensor.detach().cpu().clone()
        out["trainer.steps_done"] = torch.tensor(self.steps_done, dtype=torch.int64)
        out["trainer.d_steps"] = torch.tensor(self.d_steps, dtype=torch.int64)
        return out

    def load_state_tensors(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Restore what `state_tensors` returned, so a resumed run continues exactly."""
        self.steps_done = int(tensors["trainer.steps_done"])
        self.d_steps = int(tensors["trainer.d_steps"])
        if self.steps_done >= self.c_steps and self.classifier is not None:
            self.classifier = self.opt_c = self.private_c = None  # phase 1 was over
        for prefix, module in self._modules().items():
            module.load_state_dict(_with_prefix(tensors, prefix + "."))
        for prefix, optimizer in self._optimizers().items():
            state: dict[int, dict[str, torch.Tensor]] = {}
            for name, value in _with_prefix(tensors, prefix + ".").items():
                index, key = name.split(".", 1)
                state.setdefault(int(index), {})[key] = value.to(
                    self.device if key != "step" else "cpu"
                )
            groups = optimizer.state_dict()["param_groups"]
            optimizer.load_state_dict({"state": state, "param_groups": groups})

    def generator(self) -> Generator:
        """A sampler over a copy of the current generator weights."""
        net = build_generator(self.info, self.config)
        net.load_state_dict(self.net_g.state_dict())
        return DPAFGenerator(net, self.info.classes, self.device)


def _with_prefix(tensors: Mapping[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    return {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}


# --------------------------------------------------------------------------- method


class DPAFMethod(Method):
    """`--method dpaf`: DP aggregation in the forward phase, sound (`strict`) mode."""

    name = "dpaf"
    presets = PRESETS
    description = (
        "DPAF (noisy aggregation of SIN features in the discriminator's forward pass), strict "
        "mode: Poisson sampling, DP-SGD phase 1, conv2* at the released aggregates"
    )

    def config(self, preset: str, overrides: Mapping[str, Any], info: DataInfo) -> dict[str, Any]:
        """Preset plus overrides, validated; `conv1_init=random` means no phase 1."""
        merged = super().config(preset, overrides, info)
        if merged["conv1_init"] == "random":
            merged["c_steps"] = 0
        self.validate_config(merged, info)
        return merged

    def validate_config(self, config: Mapping[str, Any], info: DataInfo) -> None:
        """Raise UsageError for a value the run could not use (before any budget is spent)."""
        if config.get("mode") == "paper":
            raise UsageError(
                "--set mode=paper is not available: the paper's accounting is not a DP "
                "guarantee (spec dpaf §10.1); dpaf runs in strict mode only"
            )
        for key, choices in CHOICES.items():
            if config[key] not in choices:
                raise UsageError(f"--set {key}: must be one of {', '.join(choices)}")
        for key in (
            "batch_size",
            "window",
            "windows",
            "width",
            "conv1_layers",
            "conv2_layers",
            "fc_hidden",
            "latent_dim",
            "g_width",
            "n_critic",
        ):
            if int(config[key]) < 1:
                raise UsageError(f"--set {key}: must be at least 1, got {config[key]}")
        if int(config["width"]) < 2:
            raise UsageError("--set width: must be at least 2 (image and label branches)")
        if int(config["c_steps"]) < 0:
            raise UsageError(f"--set c_steps: must be ≥ 0, got {config['c_steps']}")
        if int(config["batch_size"]) > info.n:
            raise UsageError(
                f"--set batch_size: {config['batch_size']} exceeds the data set's {info.n} records"
            )
        for key in ("noise_ratio", "clip_c", "clip_conv2", "lr", "lr_c"):
            value = float(config[key])
            if not (math.isfinite(value) and value > 0):
                raise UsageError(f"--set {key}: must be a positive finite number, got {value}")
        if not 0.0 < float(config["grad_keep"]) <= 1.0:
            raise UsageError(f"--set grad_keep: must be in (0, 1], got {config['grad_keep']}")
        if min(info.shape[1], info.shape[2]) < 2:
            raise UsageError("dpaf needs images of at least 2×2 pixels")

    def plan(
        self,
        info: DataInfo,
        target: PrivacyTarget,
        config: Mapping[str, Any],
        prior_events: tuple[dict[str, Any], ...] = (),
    ) -> PrivacyPlan:
        """σ_w for c_steps + windows loop steps at q_w; two events (phase 1, phase 2)."""
        batch, window = int(config["batch_size"]), int(config["window"])
        c_steps, windows = int(config["c_steps"]), int(config["windows"])
        q = min(1.0, batch / info.n)
        q_w = window_sampling_rate(q, window)
        steps = c_steps + windows
        if not target.private:
            return PrivacyPlan(
                private=False,
                target_epsilon=math.inf,
                delta=target.delta,
                noise_multiplier=0.0,
                sampling_rate=q_w,
                steps=steps,
                max_grad_norm=math.inf,
                expected_batch_size=q_w * info.n,
                events=({"type": "non_private", "sampling_rate": q_w, "steps": steps},),
                epsilon_bound=math.inf,
                total_epsilon_bound=math.inf,
                accountant="none (not private)",
                notes=("NOT PRIVATE: trained without clipping or noise (--epsilon inf)",),
            )
        cal = calibrate_noise(target.epsilon, target.delta, q_w, steps, prior_events)
        sigma_w = cal.noise_multiplier
        agg_sigma, conv2_sigma = split_window_noise(sigma_w, window, float(config["noise_ratio"]))
        events = []
        if c_steps:
            events.append(
                {
                    "type": "poisson_gaussian",
                    "noise_multiplier": sigma_w,
                    "sampling_rate": q_w,
                    "steps": c_steps,
                    "mechanism": "dpaf phase 1: DP-SGD on classifier C (all parameters)",
                    "max_grad_norm": float(config["clip_c"]),
                }
            )
        events.append(
            {
                "type": "poisson_gaussian",
                "noise_multiplier": sigma_w,
                "sampling_rate": q_w,
                "steps": windows,
                "mechanism": f"dpaf phase 2: windows of {window} DPAGG steps + 1 conv2* step",
                "accounting": WINDOW_ACCOUNTING_NOTE,
                "window": window,
                "step_sampling_rate": q,
                "agg_noise_multiplier": agg_sigma,
                "conv2_noise_multiplier": conv2_sigma,
                "conv2_max_grad_norm": float(config["clip_conv2"]),
            }
        )
        notes = (
            f"σ_w = {sigma_w:.4g} per loop step (q_w = {q_w:.4g}); DPAGG σ = {agg_sigma:.4g}, "
            f"conv2* σ = {conv2_sigma:.4g}, phase-1 σ = {sigma_w:.4g}",
            "phase 2 accounted with the " + WINDOW_ACCOUNTING_NOTE,
            *cal.notes,
        )
        return PrivacyPlan(
            private=True,
            target_epsilon=float(target.epsilon),
            delta=target.delta,
            noise_multiplier=sigma_w,
            sampling_rate=q_w,
            steps=steps,
            max_grad_norm=float(config["clip_conv2"]),
            expected_batch_size=q_w * info.n,
            events=tuple(events),
            epsilon_bound=cal.epsilon,
            total_epsilon_bound=cal.total_epsilon,
            accountant=cal.accountant,
            notes=notes,
        )

    def trainer(
        self,
        info: DataInfo,
        config: Mapping[str, Any],
        plan: PrivacyPlan,
        device: torch.device,
        seed: int,
        randomness: PrivateRandomness | None = None,
    ) -> DPAFTrainer:
        """A fresh trainer; weights from `seed`, never from the data; draws from `randomness`."""
        return DPAFTrainer(info, config, plan, device, seed, randomness)

    def generator_from_state(
        self,
        info: DataInfo,
        config: Mapping[str, Any],
        tensors: Mapping[str, torch.Tensor],
        device: torch.device,
    ) -> DPAFGenerator:
        """Rebuild the sampler from saved `generator.*` tensors."""
        net = build_generator(info, config)
        net.load_state_dict(_with_prefix(tensors, "generator."))
        return DPAFGenerator(net, info.classes, torch.device(device))
