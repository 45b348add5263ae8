"""Planning the shared stages in front of a backend's own mechanisms, and the frequency-model
warm start (`dpsynth.privacy.releases.frequency`; config `frequency_share` > 0,
`FREQUENCY_DEFAULTS`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch

from dpsynth.errors import UsageError
from dpsynth.methods.blocks.teacher import check_teacher_config, teacher_schedule
from dpsynth.privacy.accounting.events import AnyEvent
from dpsynth.privacy.accounting.plan import PrivacyPlan, PrivacyTarget
from dpsynth.privacy.mechanisms.randomness import PrivateRandomness
from dpsynth.privacy.releases.central import CentralImages
from dpsynth.privacy.releases.classifier import plan_with_classifier
from dpsynth.privacy.releases.frequency import (
    FrequencyPlan,
    check_denoise,
    frequency_plan_in,
    plan_with_frequency,
    release_frequency_model,
)

FREQUENCY_DEFAULTS: dict[str, Any] = {
    "frequency_share": 0.0,
    # Backends without a warm start of their own (the GANs) fit their generator to the model's
    # samples for this many MMD steps (`mmd_fit`) before their first DP step.
    "frequency_fit_steps": 300,
    "frequency_band": 10,
    "frequency_clip": 0.0,
    "frequency_covariance": "pooled",
    "frequency_count_weight": 0.5,
    # The released covariances' post-processing: `clip` (negative eigenvalues to 0) or
    # `spiked` (also the noise's own eigenvalues to 0, those above debiased; frequency.py).
    "frequency_denoise": "clip",
    # With `train --public` (declared-public images): the backend's own non-private
    # pretraining steps on them before loop step 0 (pge's score network, dpkernel's generator;
    # `Trainer.pretrain_public`). Kept with the shared stages so that every preset has it.
    "public_pretrain_steps": 300,
}


def stage_shares(config: Mapping[str, Any]) -> dict[str, float]:
    """The nominal split of a run's ε between the shared stages and the method's own
    mechanism, from its settings: the teacher takes `teacher_share` of ε; of the rest, the
    frequency model takes `frequency_share` or the central images `warm_start_share`; the
    method's own mechanism gets what remains. (Each stage is calibrated on its share of the ε
    left and PRV composes them, so the figures are the budget's split, not ε's that add up.)
    Only stages in use are listed; `own` always is."""
    teacher = float(config.get("teacher_share", 0.0))
    frequency = float(config.get("frequency_share", 0.0))
    central = float(config.get("warm_start_share", 0.0))
    rest = 1.0 - teacher
    shares: dict[str, float] = {}
    if teacher > 0:
        shares["dp_teacher"] = teacher
    if frequency > 0:
        shares["frequency_model"] = rest * frequency
    if central > 0:
        shares["central_images"] = rest * central
    shares["own"] = rest * (1.0 - frequency) * (1.0 - central)
    return shares


def frequency_plan(info: Any, config: Mapping[str, Any]) -> FrequencyPlan | None:
    """The frequency-model release the config asks for (σ set by the plan), or None."""
    check_denoise(str(config.get("frequency_denoise", "clip")))
    if float(config.get("frequency_share", 0.0)) == 0:
        return None
    if info.modality != "image":
        raise UsageError("--set frequency_share: the frequency model is for images")
    if float(config.get("warm_start_share", 0.0)) > 0:
        raise UsageError("--set frequency_share replaces the central images: warm_start_share 0")
    clip = float(config["frequency_clip"])
    if clip == 0:  # a public default from the shape: 0.6 of the largest possible norm
        clip = 0.6 * math.sqrt(math.prod(int(s) for s in info.shape))
    return FrequencyPlan(
        0.0,
        int(config["frequency_band"]),
        clip,
        float(config["frequency_count_weight"]),
        str(config["frequency_covariance"]),
    )


def plan_with_stages(
    info: Any,
    target: PrivacyTarget,
    config: Mapping[str, Any],
    prior_events: tuple[AnyEvent, ...],
    plan_rest: Callable[[PrivacyTarget, tuple[dict[str, Any], ...]], PrivacyPlan],
) -> PrivacyPlan:
    """`plan_rest(target, prior_events)` (the backend's own plan) with the optional shared
    stages: the frequency model in front of it (`frequency_share` > 0: that share of the ε
    the backend gets, `dpsynth.privacy.releases.frequency`), and beside both the DP teacher
    (`teacher_share` > 0: the backend then plans for 1 − share of the ε left and the teacher
    fills the rest up to ε, `dpsynth.privacy.releases.classifier`). Every stage is one more event in
    the plan, all composed by PRV under `target.epsilon`. Settings are checked first
    (UsageError before anything is reserved)."""
    check_teacher_config(config)
    release = frequency_plan(info, config)

    def backend(goal: PrivacyTarget, prior: tuple[dict[str, Any], ...]) -> PrivacyPlan:
        if release is None:
            return plan_rest(goal, prior)
        share = float(config["frequency_share"])
        return plan_with_frequency(goal, release, share, lambda p: plan_rest(goal, p), prior)

    share = float(config.get("teacher_share", 0.0))
    if share == 0:
        return backend(target, prior_events)
    return plan_with_classifier(
        target, info.n, teacher_schedule(config), share, backend, prior_events
    )


class FrequencyStart:
    """A trainer's frequency-model warm start: released once, before loop step 0, through
    `dpsynth.privacy.releases.frequency` from its own secret stream, as a `CentralImages` whose
    `records` draw from the model. Inactive when the plan has no such release.

    A run restarted before its first checkpoint releases again from the fresh stream: the
    same noise, so the release the plan accounted for.
    """

    def __init__(
        self, info: Any, plan: PrivacyPlan, randomness: PrivateRandomness, denoise: str = "clip"
    ) -> None:
        self.plan = frequency_plan_in(plan.events)
        self.denoise = denoise
        self.num_classes = len(info.classes)
        self.stream = randomness.generator("frequency/noise") if self.plan else None

    def release(self, step: int, x: torch.Tensor, y: torch.Tensor) -> CentralImages | None:
        """The release at loop step 0 (None at other steps or without one)."""
        if self.plan is None or step != 0:
            return None
        assert self.stream is not None
        model = release_frequency_model(
            x.cpu(), y.cpu(), self.num_classes, self.plan, self.stream, self.denoise
        )
        return CentralImages(model.mean_images(), model.counts.to(torch.float32), model)


def mmd_fit(
    draw: Callable[[torch.Tensor], torch.Tensor],
    parameters: Any,
    release: CentralImages,
    steps: int,
    generator: torch.Generator,
    *,
    per_class: int = 16,
    lr: float = 1e-3,
    bandwidths: tuple[float, ...] = (0.5, 1.0, 2.0),
) -> None:
    """Fit a generator to a release's stand-in records (post-processing, no data read).

    `steps` Adam steps on Σ_k MMD²(draw(k-labels), records of class k) with a sum of Gaussian
    kernels on the flattened images (bandwidths in units of √d), `per_class` points of each
    class per side; `draw(labels)` returns the generator's images for `labels` (fresh latents,
    differentiable); the records come from `release.records` with `generator` (public).
    """
    if steps <= 0:
        return
    k = len(release.means)
    labels = torch.arange(k).repeat_interleave(per_class)
    optimizer = torch.optim.Adam(parameters, lr=lr, betas=(0.5, 0.999))
    for _ in range(steps):
        with torch.no_grad():
            real = release.records(labels, 0.3, generator).flatten(1)
        fake = draw(labels).flatten(1)
        real = real.to(fake.device, fake.dtype)
        scale = real.shape[1] * torch.tensor(bandwidths, device=fake.device) ** 2
        loss = fake.new_zeros(())
        for c in range(k):
            rows = slice(c * per_class, (c + 1) * per_class)
            loss = loss + _mmd2(fake[rows], real[rows], scale)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()


def fit_generator_to_model(
    net_g: torch.nn.Module,
    num_classes: int,
    release: CentralImages,
    steps: int,
    seed: int,
    device: torch.device,
) -> None:
    """Fit a conditional generator `net_g(z, one-hot) -> images` (with a `latent_dim`) to the
    release (post-processing, latents from the public `seed`).

    When the release is a frequency model of dimension d ≤ latent_dim, G learns the model's
    own sampling map: for z ~ N(0, I), G(z, y) regresses onto the model's image at z[:d]
    (mean squared error, Adam 1e-3, 160 pairs a step), so it inherits the model's variety
    exactly; otherwise `mmd_fit` to the stand-in records."""
    rng = torch.Generator().manual_seed(int(seed) + 7907)
    onehot_of = torch.nn.functional.one_hot
    latent = int(net_g.latent_dim)
    model = release.model
    if model is None or model.dim > latent:

        def draw(labels: torch.Tensor) -> torch.Tensor:
            z = torch.randn(len(labels), latent, generator=rng).to(device)
            return net_g(z, onehot_of(labels.to(device), num_classes).float())

        mmd_fit(draw, net_g.parameters(), release, steps, rng)
        return
    optimizer = torch.optim.Adam(net_g.parameters(), lr=1e-3, betas=(0.5, 0.999))
    labels = torch.arange(num_classes).repeat(max(1, 160 // num_classes))
    for _ in range(steps):
        z = torch.randn(len(labels), latent, generator=rng)
        with torch.no_grad():
            target = model.images_at(labels, z[:, : model.dim]).to(device)
        out = net_g(z.to(device), onehot_of(labels.to(device), num_classes).float())
        # a vector generator (dpkernel) returns flattened images
        loss = torch.nn.functional.mse_loss(out, target.reshape(out.shape))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()


def _mmd2(a: torch.Tensor, b: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Biased MMD² of two samples under Σ_l exp(−‖x − y‖² / s_l)."""

    def kernel(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        distances = torch.cdist(x, y).pow(2)
        return torch.exp(-distances[None] / scale[:, None, None]).sum(0).mean()

    return kernel(a, a) + kernel(b, b) - 2 * kernel(a, b)
