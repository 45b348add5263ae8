"""DP-Kernel: a generator trained on the privatised gradient field of a kernel mean embedding.

Learning idea (Jiang, Sun & Yu, NeurIPS 2023): minimise the MMD² between generated and private
data under a fixed sum of Gaussian kernels (times a one-hot label kernel for class-conditional
generation). The only data-dependent term is the batch's kernel mean embedding f_S.

Mechanism (the sound variant of spec dpkernel §3.6; the paper's public code detaches its noise,
so what it trains has no DP guarantee): every step draws a Poisson batch S (the training loop
does that), computes ∇_w f_S at M generated points with f_S normalised by the public B = qN,
and releases it plus the derivative field of one Gaussian-process path scaled by σΔ
(`dpsynth.privacy.mechanisms.functional`). The generator then takes an optimiser step on the
surrogate

    L(θ) = (1/M²) Σ_{j,l} k*(w_j, w_l) − (2/M) Σ_j ⟨ṽ_j, w_j⟩,   ṽ = released gradient (a constant),

whose gradient is that of the noisy MMD² (unsquared, without the x-term, which is constant in
θ). Only `raw_embedding_gradient` reads the private batch; everything after it is
post-processing of ṽ. Accounting: one `poisson_gaussian` event (σ, q, T), add/remove adjacency.

Records are vectors: the generator maps (latent, one-hot label) to a vector of dimension d and
only `DPKernelGenerator` reshapes it to the data's image shape, so tabular rows reuse the code.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from dpsynth.data.images import DataInfo
from dpsynth.errors import UsageError
from dpsynth.methods.base import (
    SMALL_EPSILON,
    PlanFacts,
    PrivacyPlan,
    is_large_image,
)
from dpsynth.methods.dpkernel.generator import DPKernelGenerator
from dpsynth.methods.dpkernel.labels import target_weights
from dpsynth.methods.dpkernel.presets import PRESETS, TABLE_PRESETS
from dpsynth.methods.dpkernel.trainer import DPKernelTrainer
from dpsynth.methods.template import StagedMethod
from dpsynth.privacy.mechanisms.functional import SENSITIVITY_CHOICES, functional_sensitivity

# A number's bins in the kernel's space (`number_bins`): beyond this the blocks are mostly empty.
_MAX_NUMBER_BINS = 256


class DPKernelMethod(StagedMethod):
    """`--method dpkernel`: DP-MMD generator on derivative-GP-privatised embedding gradients."""

    name = "dpkernel"
    presets = PRESETS
    trainer_class = DPKernelTrainer
    generator_class = DPKernelGenerator
    table_presets = TABLE_PRESETS
    public_presets = frozenset({"mnist-eps1-public"})
    modalities = ("image", "table")
    # tables with a privacy unit of K rows: the loop samples units, and the read is scaled for
    # K rows (images take K = 1 only: their stages are not scaled)
    supports_privacy_unit = True
    # `dpsynth audit` runs the functional mechanism (privacy/mechanisms/functional.py), not DP-SGD.
    audit_mechanism = "functional"
    description = (
        "DP-Kernel (functional Gaussian mechanism on the kernel mean embedding), sound variant: "
        "releases the derivative-GP-noised gradient field at generated points"
    )

    def public_requirement(self, preset: str, config: Mapping[str, Any]) -> str | None:
        """A kernel that sees features learnt from public images, or a public preset."""
        if int(config.get("kernel_features", 0)) > 0:
            return "learns its kernel's features from declared-public images (kernel_features)"
        return super().public_requirement(preset, config)

    def recommended_preset(self, info: DataInfo, epsilon: float) -> str:
        """`small` for tables; `small-eps1` for small images (8×8 digits) at every ε; for
        28×28-sized ones (≥ 400 values a record) `mnist`, or `mnist-eps1` at ε ≤ 3.

        The bandwidths of each were fixed for its pixel count, so the shape picks the preset.
        On 28×28 the split at ε = 3 is where the tuning logs saw the wider kernel pull ahead;
        on digits the single kernel (ℓ = 6) of `small-eps1` was ahead at ε = 10 too, in every
        run measured (0.870–0.873 against 0.839–0.855 for `small`, README Leaderboard).
        """
        if info.modality == "table":
            return "small"
        if not is_large_image(info):
            return "small-eps1"
        return "mnist-eps1" if epsilon <= SMALL_EPSILON else "mnist"

    def quality_preset(self, info: DataInfo, epsilon: float) -> str | None:
        """`mnist-quality` for 28×28-sized images above ε = 3 (docs/leaderboard.md, the
        quality tier); no quality tier for smaller images, tables or ε ≤ 3, where no slower
        preset was measured to beat the recommended one."""
        if info.modality == "image" and is_large_image(info) and epsilon > SMALL_EPSILON:
            return "mnist-quality"
        return None

    def config(self, preset: str, overrides: Mapping[str, Any], info: DataInfo) -> dict[str, Any]:
        """Preset plus overrides, validated; `max_grad_norm` is derived from the kernel.

        `max_grad_norm` is the RKHS sensitivity of the unnormalised embedding sum (√(2 n_L) or
        √n_L), so it cannot be overridden: a smaller value would under-noise.
        """
        if "max_grad_norm" in overrides:
            raise UsageError(
                "max_grad_norm is derived from the kernel for --method dpkernel; "
                "set bandwidths or sensitivity instead"
            )
        merged = super().config(preset, overrides, info)
        # image presets only (tables have no central images)
        warm_keys = ("warm_start_steps", "warm_start_jitter")
        if "warm_start_share" in merged and min(float(merged[k]) for k in warm_keys) < 0:
            raise UsageError("warm_start_steps and warm_start_jitter must be at least 0")
        merged["bandwidths"] = [float(b) for b in merged["bandwidths"]]
        if not merged["bandwidths"] or min(merged["bandwidths"]) <= 0:
            raise UsageError("bandwidths must be positive numbers")
        if merged["sensitivity"] not in SENSITIVITY_CHOICES:
            raise UsageError(f"sensitivity must be one of {', '.join(SENSITIVITY_CHOICES)}")
        for key in ("batch_size", "generated_points", "steps", "latent_dim", "width"):
            if int(merged[key]) < 1:
                raise UsageError(f"{key} must be at least 1")
        if merged["jitter"] <= 0:
            raise UsageError("jitter must be positive")
        if not 0.0 <= float(merged["ema"]) < 1.0:
            raise UsageError("ema must be in [0, 1) (0: no weight averaging)")
        merged["max_grad_norm"] = functional_sensitivity(
            len(merged["bandwidths"]), merged["sensitivity"]
        )
        return merged

    def validate_config(self, config: Mapping[str, Any], info: DataInfo) -> None:
        """The shared checks plus DP-Kernel's choices (before any budget is reserved)."""
        super().validate_config(config, info)
        weights = target_weights(info)
        if weights is not None and int(config["generated_points"]) < len(weights):
            raise UsageError(
                f"--set generated_points: at least one per class ({len(weights)}) with the "
                "target's weights"
            )
        if (info.modality == "table") != (config["arch"] == "table"):
            raise UsageError(
                "--set arch: tables need arch=table, images conv or mlp "
                f"(got {config['arch']!r} for {info.modality} data)"
            )
        if "number_bins" in config and not 0 <= int(config["number_bins"]) <= _MAX_NUMBER_BINS:
            raise UsageError(
                f"--set number_bins: 0 (numbers as values) or a bin count up to "
                f"{_MAX_NUMBER_BINS}, got {config['number_bins']}"
            )
        if "kernel_frequencies" in config:
            pixels = math.prod(info.shape[1:]) if info.modality == "image" else 0
            if not 0 <= int(config["kernel_frequencies"]) <= pixels:
                raise UsageError(
                    f"--set kernel_frequencies: 0 (every pixel) or up to {pixels} (the image's "
                    f"pixels a channel), got {config['kernel_frequencies']}"
                )
        if int(config.get("kernel_features", 0)) > 0:
            if info.modality != "image" or not info.classes:
                raise UsageError(
                    "--set kernel_features: for labelled images only (its encoder learns the "
                    "data's classes from --public images)"
                )
            scale, steps = config["kernel_feature_scale"], config["kernel_encoder_steps"]
            if float(scale) <= 0 or int(steps) < 1:
                raise UsageError(
                    "--set kernel_feature_scale must be positive and kernel_encoder_steps at "
                    "least 1"
                )
        elif int(config.get("kernel_features", 0)) < 0:
            raise UsageError("--set kernel_features: 0 (off) or a feature count")
        choices = {
            "arch": ("conv", "mlp", "table"),
            "norm": ("batch", "group", "none"),
            "head": ("soft", "hard"),
            "optimizer": ("rmsprop", "adam"),
            "label_input": ("embed", "layers"),
        }
        for key, allowed in choices.items():
            if key in config and config[key] not in allowed:
                raise UsageError(f"--set {key}={config[key]!r}: choose from {', '.join(allowed)}")

    def plan_own(self, facts: PlanFacts) -> PrivacyPlan:
        """One `poisson_gaussian` event (σ, q = B/N, T): the σ the trainer's GP noise uses."""
        config = facts.config
        expected = functional_sensitivity(len(config["bandwidths"]), config["sensitivity"])
        if not math.isclose(float(config["max_grad_norm"]), expected):
            raise UsageError("max_grad_norm does not match the kernel's sensitivity")
        return super().plan_own(facts)
