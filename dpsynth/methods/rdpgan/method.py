"""RDP-GAN (Ma et al., arXiv 2007.02056) in the sound mode of spec `rdpgan.md` §4.3.1.

Learning idea (kept from the paper): a conditional GAN whose discriminator D has a sigmoid
output trained with binary cross-entropy, n_d discriminator steps per generator step, a
privatised discriminator with the generator as post-processing, and noise-scale schedules.

What differs from the paper, whose guarantee does not hold (spec §4.2): the paper adds one
Gaussian scalar to the VALUE of D's real-data loss. A constant added to a loss leaves its
gradient unchanged, so that noise never reaches the parameters and every update is the
non-private one. Here the quantity that drives D's update is privatised instead: each real
record's gradient of its loss term softplus(−logit) is clipped to norm C, the clipped sum
gets Gaussian noise of std σ_t·C and is divided by the public m = qN (DP-SGD through
`PrivateGradient`); the fake term's gradient involves no private data and is exact. Batches
are Poisson samples (add/remove adjacency), and every D step is one Poisson-subsampled
Gaussian event of the PRV accountant. The generator's update reads D only (post-processing).

How the shared loop maps onto RDP-GAN: one loop step = one D step on the loop's Poisson
batch; after every n_d-th D step one G step follows (no private data). The schedule of σ over
generator iterations is data-independent and computed before training (`schedule.py`); each
distinct σ is its own ledger event, and the trainer reads each step's σ from those events.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import nn
from torch.func import functional_call
from torch.nn import functional as F

from dpsynth.data.images import DataInfo, to_uint8
from dpsynth.data.tabular import block_layout
from dpsynth.errors import UsageError
from dpsynth.methods.base import (
    MAX_STEPS,
    Generator,
    Method,
    PrivacyPlan,
    PrivacyTarget,
    Trainer,
    draw_latent,
    sample_truncation,
)
from dpsynth.methods.rdpgan import schedule as sched
from dpsynth.methods.rdpgan.nets import (
    ConvDiscriminator,
    ConvGenerator,
    MLPDiscriminator,
    MLPGenerator,
    init_weights,
)
from dpsynth.methods.rdpgan.presets import CHOICES, PRESETS, TABLE_PRESETS
from dpsynth.privacy.accounting import calibrate_schedule
from dpsynth.privacy.dpsgd import PrivateGradient
from dpsynth.privacy.randomness import PrivateRandomness

MECHANISM = "rdpgan D step: DP-SGD on the real-loss term (clip C, noise σ·C, divide by qN)"

_REFUSED_MODES = {
    "paper-additive": (
        "the paper's noise on the loss value never reaches the gradient (spec rdpgan §4.2), so "
        "it trains exactly the non-private model; use --epsilon inf for that baseline, which "
        "is labelled NOT PRIVATE"
    ),
    "paper-multiplicative": (
        "a random rescaling of the exact gradient is not differentially private (spec rdpgan "
        "§4.2 G1b)"
    ),
    "zo": "the zeroth-order variant (spec rdpgan §4.3.2) is not implemented",
}


# --------------------------------------------------------------------------- networks


def build_discriminator(info: DataInfo, config: Mapping[str, Any]) -> nn.Module:
    """D for this data's record shape and labels (no BatchNorm)."""
    if config["arch"] == "conv":
        return ConvDiscriminator(tuple(info.shape), len(info.classes), int(config["width"]))
    return MLPDiscriminator(tuple(info.shape), len(info.classes), int(config["hidden"]))


def build_generator(info: DataInfo, config: Mapping[str, Any]) -> nn.Module:
    """The conditional G for this data's record shape and labels."""
    latent = int(config["latent_dim"])
    if config["arch"] == "conv":
        return ConvGenerator(tuple(info.shape), len(info.classes), latent, int(config["width"]))
    layout = block_layout(info) if info.modality == "table" else ()
    return MLPGenerator(
        tuple(info.shape),
        len(info.classes),
        latent,
        int(config["hidden"]),
        layout=layout,
        hard_head=config.get("head", "soft") == "hard",
    )


def label_weights(info: DataInfo) -> torch.Tensor | None:
    """A table target's declared public class weights (schema `weights`), else None."""
    if info.modality != "table" or not info.schema:
        return None
    target = next(c for c in info.schema["columns"] if c["name"] == info.schema["target"])
    weights = target.get("weights")
    return torch.tensor([float(w) for w in weights], dtype=torch.float64) if weights else None


def _onehot(labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    return F.one_hot(labels, num_classes).float()


def noise_segments(config: Mapping[str, Any]) -> tuple[list[tuple[float, int]], float | None]:
    """The schedule as (factor, D steps) runs in order, and the rounding grid's ratio."""
    raw = sched.factors(
        str(config["schedule"]),
        int(config["n_g"]),
        float(config["decay"]),
        int(config["step_every"]),
    )
    rounded, ratio = sched.rounded_factors(raw)
    return sched.segments(rounded, int(config["n_d"])), ratio


def step_sigmas(plan: PrivacyPlan) -> tuple[list[int], list[float]]:
    """Cumulative step ends and σ of the plan's events, in order (σ of step s: first end > s)."""
    ends, sigmas, total = [], [], 0
    for event in plan.events:
        total += int(event["steps"])
        ends.append(total)
        sigmas.append(float(event.get("noise_multiplier", 0.0)))
    return ends, sigmas


# --------------------------------------------------------------------------- generator


class RDPGANGenerator(Generator):
    """Samples uint8 images [b, C, H, W] (or encoded table rows float32 [b, D]) from the
    trained conditional generator, its latent at scale `truncation` (`Generator.truncation`)."""

    def __init__(
        self,
        net: nn.Module,
        classes: tuple[str, ...],
        device: torch.device,
        modality: str = "image",
        truncation: float = 1.0,
    ):
        self.net = net.to(device).eval()
        self.truncation = float(truncation)
        self.modality = modality
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
            z = draw_latent(chunk.numel(), self.net.latent_dim, generator, self.truncation)
            onehot = _onehot(chunk.to(self.device), self.net.num_classes)
            records = self.net(z.to(self.device), onehot)
            if self.modality == "table":
                yield records.float().cpu()  # encoded rows; `sample_table` decodes them
            else:
                yield to_uint8(records).cpu()


# --------------------------------------------------------------------------- trainer


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
        onehot = _onehot(labels, self.num_classes)
        return self.net_g(z, onehot), onehot

    def discriminator_step(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
        """One D step: DP-SGD gradient of the real term plus the exact fake-term gradient."""
        sigma = self.sigma_at(self.steps_done)
        self.private_d.noise_multiplier = sigma
        self.opt_d.zero_grad(set_to_none=True)
        stats = self.private_d.compute(x, _onehot(y, self.num_classes))
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
        out["trainer.steps_done"] = torch.tensor(self.steps_done, dtype=torch.int64)
        return out

    def load_state_tensors(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Restore what `state_tensors` returned, so a resumed run continues exactly."""
        self.steps_done = int(tensors["trainer.steps_done"])
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
        return RDPGANGenerator(
            net, self.info.classes, self.device, self.info.modality, sample_truncation(self.config)
        )


def _with_prefix(tensors: Mapping[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    return {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}


# --------------------------------------------------------------------------- method


class RDPGANMethod(Method):
    """`--method rdpgan`: conditional GAN, DP-SGD on D's real-loss term, σ schedules."""

    name = "rdpgan"
    presets = PRESETS
    table_presets = TABLE_PRESETS
    modalities = ("image", "table")
    description = (
        "RDP-GAN, sound mode: DP-SGD on the discriminator's real-loss term (the paper's "
        "loss-value noise never reaches the gradient), Poisson sampling, PRV accounting, "
        "data-independent σ schedules"
    )

    def validate_config(self, config: Mapping[str, Any], info: DataInfo) -> None:
        """Raise UsageError for a value the run could not use (before any budget is spent)."""
        super().validate_config(config, info)
        mode = config.get("mode")
        if mode in _REFUSED_MODES:
            raise UsageError(f"--set mode={mode} is not available: {_REFUSED_MODES[mode]}")
        if config.get("schedule") == "ant":
            raise UsageError(
                "--set schedule=ant is not available: adaptive noise tuning needs a Rényi "
                "filter and a public or paid accuracy signal (spec rdpgan §4.3.4), which are "
                "not implemented; use constant, time, exp or step"
            )
        for key, choices in CHOICES.items():
            if key in config and config[key] not in choices:
                raise UsageError(f"--set {key}: must be one of {', '.join(choices)}")
        for key in ("n_d", "n_g", "hidden", "width", "latent_dim", "step_every"):
            if int(config[key]) < 1:
                raise UsageError(f"--set {key}: must be at least 1, got {config[key]}")
        steps = int(config["n_d"]) * int(config["n_g"])
        if steps > MAX_STEPS:
            raise UsageError(f"--set n_g, n_d: n_g·n_d = {steps} exceeds {MAX_STEPS:.0e}")
        for key in ("lr_d", "lr_g"):
            if not float(config[key]) > 0:
                raise UsageError(f"--set {key}: must be positive, got {config[key]}")
        if not 0.0 <= float(config["beta1"]) < 1.0:
            raise UsageError(f"--set beta1: must be in [0, 1), got {config['beta1']}")
        decay = float(config["decay"])
        if config["schedule"] == "step" and not 0.0 < decay <= 1.0:
            raise UsageError(f"--set decay: the step schedule needs k in (0, 1], got {decay}")
        if config["schedule"] in ("time", "exp") and decay < 0:
            raise UsageError(f"--set decay: must be ≥ 0, got {decay}")
        if config["schedule"] == "exp" and decay * int(config["n_g"]) > 20:
            raise UsageError("--set decay: e^(−k·n_g) below e^−20 leaves no noise to speak of")
        if info.modality == "table" and config["arch"] != "mlp":
            raise UsageError("--set arch: tables need arch=mlp (a row is a flat vector)")
        if config["arch"] == "conv":
            shape = tuple(info.shape)
            if len(shape) != 3 or shape[1] % 4 or shape[2] % 4:
                raise UsageError(
                    f"--set arch=conv needs images with sides divisible by 4, got {shape}; "
                    "use arch=mlp"
                )

    def plan(
        self,
        info: DataInfo,
        target: PrivacyTarget,
        config: Mapping[str, Any],
        prior_events: tuple[dict[str, Any], ...] = (),
    ) -> PrivacyPlan:
        """The whole σ schedule, calibrated before any data access; one event per distinct σ.

        z₀ (the schedule's first σ) is the smallest value whose composed ε over all
        n_g·n_d D steps meets the target: the run always has the preset's length, and the
        decay shifts noise from late to early steps rather than shortening the run.
        """
        batch = int(config["batch_size"])
        steps = int(config["n_g"]) * int(config["n_d"])
        q = min(1.0, batch / info.n)
        if not target.private:
            return PrivacyPlan(
                private=False,
                target_epsilon=math.inf,
                delta=target.delta,
                noise_multiplier=0.0,
                sampling_rate=q,
                steps=steps,
                max_grad_norm=math.inf,
                expected_batch_size=q * info.n,
                events=({"type": "non_private", "sampling_rate": q, "steps": steps},),
                epsilon_bound=math.inf,
                total_epsilon_bound=math.inf,
                accountant="none (not private)",
                notes=("NOT PRIVATE: trained without clipping or noise (--epsilon inf)",),
            )
        segments, ratio = noise_segments(config)
        cal = calibrate_schedule(target.epsilon, target.delta, q, segments, prior_events)
        clip = float(config["max_grad_norm"])
        events, start = [], 0
        for factor, count in segments:
            events.append(
                {
                    "type": "poisson_gaussian",
                    "noise_multiplier": cal.noise_multiplier * factor,
                    "sampling_rate": q,
                    "steps": count,
                    "mechanism": MECHANISM,
                    "max_grad_norm": clip,
                    "schedule": str(config["schedule"]),
                    "first_step": start,
                }
            )
            start += count
        sigmas = [e["noise_multiplier"] for e in events]
        notes = [
            f"schedule {config['schedule']}: z₀ = {cal.noise_multiplier:.4g}, σ from "
            f"{max(sigmas):.4g} down to {min(sigmas):.4g} in {len(events)} ledger event(s)",
            "adjacency add/remove one record; each D step is one Poisson-subsampled Gaussian",
        ]
        if ratio is not None:
            notes.append(
                f"schedule factors rounded down on a geometric grid of ratio {ratio:.4g} "
                "(less noise than the formula, exactly as accounted)"
            )
        return PrivacyPlan(
            private=True,
            target_epsilon=float(target.epsilon),
            delta=target.delta,
            noise_multiplier=min(sigmas),
            sampling_rate=q,
            steps=steps,
            max_grad_norm=clip,
            expected_batch_size=q * info.n,
            events=tuple(events),
            epsilon_bound=cal.epsilon,
            total_epsilon_bound=cal.total_epsilon,
            accountant=cal.accountant,
            notes=(*notes, *cal.notes),
        )

    def trainer(
        self,
        info: DataInfo,
        config: Mapping[str, Any],
        plan: PrivacyPlan,
        device: torch.device,
        seed: int,
        randomness: PrivateRandomness | None = None,
    ) -> RDPGANTrainer:
        """A fresh trainer; weights from `seed`, never from the data; draws from `randomness`."""
        return RDPGANTrainer(info, config, plan, device, seed, randomness)

    def generator_from_state(
        self,
        info: DataInfo,
        config: Mapping[str, Any],
        tensors: Mapping[str, torch.Tensor],
        device: torch.device,
    ) -> RDPGANGenerator:
        """Rebuild the sampler from saved `generator.*` tensors."""
        net = build_generator(info, config)
        net.load_state_dict(_with_prefix(tensors, "generator."))
        return RDPGANGenerator(
            net, info.classes, torch.device(device), info.modality, sample_truncation(config)
        )
