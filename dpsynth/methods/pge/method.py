"""PGE (Liu et al., ACM MM 2024) under DP-SGD: sliced score matching + Hamiltonian sampling.

What runs (spec `pge.md` sections 2, 3.3, 4.5):
- training: a class-conditional, noise-conditional score U-Net (GroupNorm only) is fitted with
  the sliced score-matching loss of the paper's Eq. 8 over `n_levels` noise levels, K random
  projections per record, the residual enhancement module (a frozen, seeded random-conv
  encoder that never learns from data, masked and fed into the bottleneck through a
  zero-initialised projection), and DP-SGD: Poisson batches, per-record clipping, Gaussian
  noise, division by the expected batch size (`dpsynth.privacy.mechanisms.dpsgd`);
- sampling: annealed HMC (leapfrog with the learned score as the force, momentum refreshed each
  round, path-integral energy accept/reject, box reflection, final Tweedie denoise) from
  uniform noise, with balanced labels chosen by the caller; it never touches data.

Privacy: the ε of a run is the accountant's bound for the DP-SGD steps that actually ran. The
paper's randomized response on projection vectors (`rr`) may be switched on as a variance knob,
but it privatizes nothing (the vectors are data-independent noise) and changes no ε.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from dpsynth.data.images import DataInfo
from dpsynth.errors import UsageError
from dpsynth.methods.base import SMALL_EPSILON, is_large_image
from dpsynth.methods.pge.build import describe_transform, working_shape
from dpsynth.methods.pge.generator import PGEGenerator
from dpsynth.methods.pge.hmc import MH_MODES
from dpsynth.methods.pge.presets import PRESETS
from dpsynth.methods.pge.trainer import PGETrainer
from dpsynth.methods.template import StagedMethod

_CHOICES: dict[str, tuple[str, ...]] = {
    "ssm_variant": ("plain", "vr", "stein"),
    "divergence": ("jvp", "fd"),
    "residual": ("random-conv", "none"),
    "step_schedule": ("sigma", "paper"),
    "mh": MH_MODES,
    "resize": ("pad", "resize"),
    "sampler_init": ("uniform", "central", "frequency"),
}


class PGEMethod(StagedMethod):
    """`--method pge`: DP-SGD sliced score matching with an HMC sampler; the template's
    default plan (DP-SGD steps, the optional central images) and factories."""

    name = "pge"
    presets = PRESETS
    trainer_class = PGETrainer
    generator_class = PGEGenerator
    preset_advice: ClassVar[Mapping[str, str]] = {
        "mnist-eps1": (
            "pge's mnist-eps1 narrowly fails the rule every 28×28 preset is held to: on "
            "mnist-5k at ε = 1 its chains left the frequency model's samples slightly worse "
            "(FID 282 against 273 for the frequency model alone, CNN accuracy 0.735 against "
            "0.777); at ε ≤ 3 prefer --method freq or dpkernel (docs/leaderboard.md)"
        )
    }
    description = (
        "PGE's score network (sliced score matching, residual module, HMC sampler) trained "
        "with DP-SGD; the paper's randomized response gives no privacy and earns no credit"
    )

    def recommended_preset(self, info: DataInfo, epsilon: float) -> str:
        """For 28×28-sized images (≥ 400 values a record) `mnist`, `mnist-eps1` at ε ≤ 3
        (the DP frequency model first, then a short DP-SGD fine-tune and a short sampler);
        for smaller ones `small`, `small-eps1` at ε ≤ 3 (tuned on 8×8 digits,
        bench/results/2026-11-23-tuning-logs/tuning-pge.md). Only public facts (shape, ε) choose."""
        small = epsilon <= SMALL_EPSILON
        if is_large_image(info):
            return "mnist-eps1" if small else "mnist"
        return "small-eps1" if small else "small"

    def config(self, preset: str, overrides: Mapping[str, Any], info: DataInfo) -> dict[str, Any]:
        """The preset with overrides, validated, plus the resolved working resolution."""
        merged = super().config(preset, overrides, info)
        for key, allowed in _CHOICES.items():
            if merged[key] not in allowed:
                raise UsageError(f"{key}={merged[key]!r}: choose from {', '.join(allowed)}")
        for key in ("n_levels", "projections", "sampler_rounds", "batch_size", "steps"):
            if int(merged[key]) < 1:
                raise UsageError(f"{key} must be at least 1")
        if not 0 < float(merged["sigma_min"]) <= float(merged["sigma_max"]):
            raise UsageError("need 0 < sigma_min <= sigma_max")
        if not 0.0 <= float(merged["mask_ratio"]) <= 1.0:
            raise UsageError("mask_ratio must be in [0, 1]")
        merged["working_size"] = list(working_shape(merged, info.shape))
        merged["input_transform"] = describe_transform(merged, info.shape)
        merged["rr_privacy"] = "none: RR on data-independent projections is a variance knob only"
        return merged

    def validate_config(self, config: Mapping[str, Any], info: DataInfo) -> None:
        """The shared checks plus PGE's ranges (before any budget is reserved)."""
        super().validate_config(config, info)
        at_least_one = (
            "sampler_steps", "micro_batch_size", "nf", "num_res_blocks", "residual_channels",
            "rr_k", "warm_start_batch",
        )  # fmt: skip
        for key in at_least_one:
            if int(config[key]) < 1:
                raise UsageError(f"--set {key}: must be at least 1, got {config[key]}")
        for key in ("ema", "label_dropout", "residual_noise_prob"):
            if not 0.0 <= float(config[key]) <= 1.0:
                raise UsageError(f"--set {key}: must be in [0, 1], got {config[key]}")
        for key in ("lambda0", "box", "rr_epsilon"):
            if not float(config[key]) > 0:
                raise UsageError(f"--set {key}: must be positive, got {config[key]}")
        if not 0 <= int(config["sampler_first_level"]) < int(config["n_levels"]):
            raise UsageError("--set sampler_first_level: must be in [0, n_levels)")
        if int(config["warm_start_steps"]) < 0:
            raise UsageError("--set warm_start_steps: must be at least 0")
        if float(config["warm_start_jitter"]) < 0:
            raise UsageError("--set warm_start_jitter: must be at least 0")
        if float(config["feature_noise"]) < 0:
            raise UsageError(
                f"--set feature_noise: must be at least 0, got {config['feature_noise']}"
            )
        if not config["ch_mult"] or min(int(m) for m in config["ch_mult"]) < 1:
            raise UsageError(f"--set ch_mult: needs positive multipliers, got {config['ch_mult']}")
        levels = len(config["ch_mult"])
        if any(not 0 <= int(a) < levels for a in config["attn_levels"]):
            raise UsageError(
                f"--set attn_levels: each must be in [0, {levels - 1}], got {config['attn_levels']}"
            )
        if not 0 <= int(config["image_size"]) <= 1024:
            raise UsageError(f"--set image_size: must be in [0, 1024], got {config['image_size']}")
