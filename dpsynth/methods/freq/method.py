"""freq: the shared DP frequency model alone, as a method of its own.

The stage every 28×28 preset of the other image backends starts from (`methods.blocks`,
`dpsynth.privacy.releases.frequency`), given the method's whole ε: per-class means and pooled or
per-class second moments of the images' B×B lowest 2-D DCT frequencies (features of x + 1,
clipped to C_f), released once with Gaussian noise of std σ·√(2 + w²) (one `gaussian` event,
`mechanism: frequency_model`), then sampled as class-conditional Gaussians in the band. It is
a baseline, not a paper's method: what the shared stage gives by itself, which every backend's
28×28 preset must beat.

The run is one loop step that reads no Poisson batch (the event declares it with
`loop_steps_without_reads`); the release is made before it, in `release_whole_data`, from the
run's secret stream. With `teacher_share` > 0 the DP teacher (`methods.blocks.teacher`) takes
that share of ε beside the release, exactly as `plan_with_stages` composes it for the other
backends, and relabels the samples.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from dpsynth.data.images import DataInfo
from dpsynth.data.limits import over_budget
from dpsynth.errors import DpsynthError, UsageError
from dpsynth.methods.base import (
    SMALL_EPSILON,
    ClippedGaussianSum,
    PlanFacts,
    PrivacyPlan,
    is_large_image,
)
from dpsynth.methods.blocks import check_teacher_config, frequency_plan
from dpsynth.methods.freq.generator import FreqGenerator
from dpsynth.methods.freq.presets import NOT_OFFERED, PRESETS
from dpsynth.methods.freq.trainer import FreqTrainer
from dpsynth.methods.template import StagedMethod
from dpsynth.privacy.accounting.calibration import calibrate_noise
from dpsynth.privacy.accounting.compose import compose_epsilon
from dpsynth.privacy.accounting.plan_check import IDLE_STEPS_KEY
from dpsynth.privacy.releases.frequency import COVARIANCES, FrequencyPlan

# The run's loop: one step, which reads no Poisson batch (the release comes before it).
LOOP_STEPS = 1


def release_parameters(info: DataInfo, config: Mapping[str, Any]) -> FrequencyPlan:
    """The release's public parameters (σ set by the plan): the shared stage's, asked for as
    the whole of the method's ε (its clip default, 0.6·√(C·H·W), from the public shape)."""
    release = frequency_plan(info, {**config, "frequency_share": 1.0, "warm_start_share": 0.0})
    if release is None:  # never: the share asked for is positive
        raise DpsynthError("freq: no frequency-model release planned")
    return release


def feature_count(info: DataInfo, band: int) -> int:
    """d: the band features of one record (C·min(B, H)·min(B, W))."""
    channels, height, width = (int(s) for s in info.shape)
    return channels * min(band, height) * min(band, width)


def release_bytes(info: DataInfo, config: Mapping[str, Any]) -> float:
    """An upper estimate of the memory the release and its post-processing hold (float64):
    the N × d features, the released vector and a few K × d × d matrices."""
    d = feature_count(info, int(config["frequency_band"]))
    k = len(info.classes)
    blocks = k if config["frequency_covariance"] == "class" else 1
    vector = k * d + blocks * d * (d + 1) / 2 + k
    return 8.0 * (2 * info.n * d + 3 * vector + 6 * k * d * d)


def plan_frequency_release(facts: PlanFacts) -> PrivacyPlan:
    """The release alone at the whole of `target`: σ the smallest whose one Gaussian event
    composes with `prior_events` (PRV) to at most ε; one event, declaring the loop's one step
    as reading no Poisson batch. ε = inf: the exact release (σ = 0), not private."""
    info, target, config, prior_events = facts.unpacked()
    release = release_parameters(info, config)
    common = {
        "delta": target.delta,
        "sampling_rate": 1.0,
        "steps": LOOP_STEPS,
        "expected_batch_size": float(info.n),
    }
    if not target.private:
        event = {**release.event().to_json(), IDLE_STEPS_KEY: LOOP_STEPS}
        return PrivacyPlan(
            private=False,
            target_epsilon=math.inf,
            gaussian_sum=ClippedGaussianSum(0.0, float(release.clip_norm)),
            events=(event,),
            epsilon_bound=math.inf,
            total_epsilon_bound=math.inf,
            accountant="none (not private)",
            notes=("NOT PRIVATE: the exact frequency model, without noise (--epsilon inf)",),
            **common,
        )
    sigma = calibrate_noise(target.epsilon, target.delta, 1.0, 1, prior_events).noise_multiplier
    planned = FrequencyPlan(
        sigma, release.band, release.clip_norm, release.count_weight, release.covariance
    )
    event = {**planned.event().to_json(), IDLE_STEPS_KEY: LOOP_STEPS}
    alone = compose_epsilon([event], target.delta)
    total = compose_epsilon([*prior_events, event], target.delta) if prior_events else alone
    d = feature_count(info, planned.band)
    return PrivacyPlan(
        private=True,
        target_epsilon=float(target.epsilon),
        gaussian_sum=ClippedGaussianSum(sigma, float(release.clip_norm)),
        events=(event,),
        epsilon_bound=alone.epsilon,
        total_epsilon_bound=total.epsilon,
        accountant=alone.accountant,
        notes=(
            f"frequency model: class means and {planned.covariance} second moments of the "
            f"{planned.band}×{planned.band} lowest DCT frequencies (d = {d}, clip "
            f"{planned.clip_norm:g}), one Gaussian release at σ = {sigma:.4g} (noise std "
            f"{planned.noise_std:.4g} = σ·√(2 + w²), w = {planned.count_weight:g})",
        ),
        **common,
    )


class FreqMethod(StagedMethod):
    """`--method freq`: the shared DP frequency model alone (a baseline)."""

    name = "freq"
    presets = PRESETS
    trainer_class = FreqTrainer
    generator_class = FreqGenerator
    modalities = ("image",)
    # Its one release is a Gaussian mechanism on the whole data, not DP-SGD: the white-box
    # audit does not run it (it says so).
    audit_mechanism = "frequency_model"
    description = (
        "the shared DP frequency model alone: class means and second moments of the images' "
        "lowest DCT frequencies, one Gaussian release, sampled as class-conditional Gaussians "
        "(a baseline and a shared stage of the other methods, not a paper's method)"
    )

    def config(self, preset: str, overrides: Mapping[str, Any], info: DataInfo) -> dict[str, Any]:
        """The preset with `--set` overrides; the shared stage's share and fit are refused by
        name (UsageError): the model takes the whole of this method's ε."""
        for key, reason in NOT_OFFERED.items():
            if key in overrides:
                raise UsageError(f"--set {key} does not apply to --method freq: {reason}")
        return super().config(preset, overrides, info)

    def recommended_preset(self, info: DataInfo, epsilon: float) -> str:
        """`mnist` for 28×28-sized images (≥ 400 values a record), `mnist-eps1` at ε ≤ 3,
        `small` for smaller ones; never the teacher (the baseline is the model alone). Public
        facts only (the shape and ε)."""
        if is_large_image(info):
            return "mnist-eps1" if epsilon <= SMALL_EPSILON else "mnist"
        return "small"

    def validate_config(self, config: Mapping[str, Any], info: DataInfo) -> None:
        """Raise UsageError for a value the run could not use (before any budget is spent)."""
        super().validate_config(config, info)
        if int(config["frequency_band"]) < 1:
            raise UsageError(
                f"--set frequency_band: must be at least 1, got {config['frequency_band']}"
            )
        if float(config["frequency_clip"]) < 0:
            raise UsageError(
                f"--set frequency_clip: must be ≥ 0 (0: from the shape), got "
                f"{config['frequency_clip']}"
            )
        if not float(config["frequency_count_weight"]) > 0:
            raise UsageError(
                "--set frequency_count_weight: must be positive, got "
                f"{config['frequency_count_weight']}"
            )
        if config["frequency_covariance"] not in COVARIANCES:
            raise UsageError(f"--set frequency_covariance: one of {', '.join(COVARIANCES)}")
        check_teacher_config(config)
        if info.modality != "image":
            return  # the training loop refuses a table before this matters
        problem = over_budget(release_bytes(info, config))
        if problem:
            raise UsageError(
                f"--set frequency_band={config['frequency_band']}: the frequency model {problem}"
                "; use a smaller band or frequency_covariance=pooled"
            )

    def plan_own(self, facts: PlanFacts) -> PrivacyPlan:
        """The release at the whole ε (`plan_frequency_release`); the template puts the DP
        teacher beside it when `teacher_share` > 0 (the release then gets 1 − share of the ε
        left and the teacher's σ fills the rest, all composed by PRV)."""
        return plan_frequency_release(facts)
