"""PGE's presets: plain data (the defaults every preset shares, then tiny, small and paper).

`--set key=value` overrides a value; `PGEMethod.validate_config` checks the result.
"""

from __future__ import annotations

from typing import Any

from dpsynth.methods.blocks import (
    FREQUENCY_DEFAULTS,
    RELABELLING_TEACHER,
    TEACHER_DEFAULTS,
)

_COMMON: dict[str, Any] = {
    "max_grad_norm": 1.0,
    "lr": 3e-4,
    "ema": 0.999,
    "ssm_variant": "plain",
    "divergence": "jvp",
    "sigma_max": 2.0,
    "sigma_min": 0.02,
    "n_levels": 10,
    "projections": 1,
    "nf": 32,
    "ch_mult": [1, 2, 2],
    "num_res_blocks": 2,
    "attn_levels": [2],
    "mid_attention": True,
    "residual": "random-conv",
    "residual_channels": 4,
    "mask_ratio": 0.75,
    "residual_noise_prob": 0.5,
    "feature_noise": 1.0,
    "label_dropout": 0.1,
    "guidance": 0.0,
    "rr": False,
    "rr_k": 10,
    "rr_epsilon": 1.0,
    "sampler_rounds": 10,
    "sampler_steps": 100,
    "lambda0": 0.005,
    "step_schedule": "sigma",
    "mh": "path",
    "box": 1.0,
    "final_denoise": True,
    "image_size": 0,
    "resize": "pad",
    "micro_batch_size": 256,
    # DP warm start (dpsynth.privacy.releases.central): share of ε for the central images (0: off),
    # the records' clipping norm (0: √d, the largest norm in [-1, 1], so no clipping), the counts'
    # weight in the release, then the pretraining.
    "warm_start_share": 0.0,
    "warm_start_clip": 0.0,
    "warm_start_count_weight": 0.5,
    "warm_start_steps": 0,
    "warm_start_batch": 128,
    "warm_start_lr": 3e-3,
    "warm_start_jitter": 0.1,
    "sampler_init": "uniform",
    # With sampler_init=central: the first round's level (SDEdit-like: a later start keeps
    # more of the central image).
    "sampler_first_level": 0,
}

# 8×8 images (digits) above ε = 3, about two minutes on the CPU: a DP warm start from the
# central images (30% of ε), 300 pretraining steps on them, then 100 DP-SGD steps with 4
# noise particles per record; the sampler starts at the class's central image (level 2 of 8).
_SMALL: dict[str, Any] = {
    **_COMMON,
    "batch_size": 256,
    "steps": 100,
    "projections": 4,
    "ssm_variant": "vr",
    "lr": 3e-3,
    "ema": 0.99,
    "sigma_max": 2.0,
    "sigma_min": 0.05,
    "n_levels": 8,
    "nf": 8,
    "ch_mult": [1, 2],
    "num_res_blocks": 1,
    "attn_levels": [],
    "mid_attention": False,
    "sampler_rounds": 8,
    "sampler_steps": 20,
    "lambda0": 0.01,
    "micro_batch_size": 256,
    "warm_start_share": 0.3,
    "warm_start_steps": 300,
    "warm_start_jitter": 0.2,
    "sampler_init": "central",
    "sampler_first_level": 2,
}

# 28×28 images: half of ε on the DP frequency model (per-class covariances); the score network
# pretrains on its samples at a 16×16 working size, then 200 DP-SGD steps with the other half;
# short HMC chains refine samples of the model (the `mnist` preset of 2026-11-29, which
# `mnist-eps1` and `mnist-teacher` still build on).
_MNIST_FREQUENCY_START: dict[str, Any] = {
    **_SMALL,
    "image_size": 16,
    "resize": "resize",
    "warm_start_share": 0.0,
    # The other half of ε for private score matching, over 200 DP-SGD steps.
    "frequency_share": 0.5,
    "frequency_covariance": "class",
    # The model's covariances without the noise's own eigenvalues: its samples, where the
    # chains start, then read as digits (docs/leaderboard.md, the spiked rows).
    "frequency_denoise": "spiked",
    "steps": 200,
    "projections": 1,
    "warm_start_steps": 100,
    "warm_start_batch": 64,
    "sampler_init": "frequency",
    "sampler_rounds": 2,
    "sampler_steps": 3,
    "sampler_first_level": 6,
}

PRESETS: dict[str, dict[str, Any]] = {
    # The tests and quick checks: seconds on the CPU on digits.
    "tiny": {
        **_COMMON,
        "batch_size": 32,
        "steps": 20,
        "lr": 1e-3,
        "ema": 0.99,
        "sigma_max": 1.0,
        "sigma_min": 0.1,
        "n_levels": 3,
        "nf": 8,
        "ch_mult": [1, 2],
        "num_res_blocks": 1,
        "attn_levels": [],
        "mid_attention": False,
        "sampler_rounds": 3,
        "sampler_steps": 5,
        "lambda0": 0.02,
        "micro_batch_size": 64,
    },
    "small": _SMALL,
    # 8×8 images at ε ≤ 3: half of ε on the central images, 200 pretraining steps and a
    # short DP-SGD fine-tune (25 steps) with the other half. About a minute on the CPU.
    "small-eps1": {**_SMALL, "warm_start_share": 0.5, "warm_start_steps": 200, "steps": 25},
    # 28×28 images (mnist-5k) above ε = 3: half of ε on the DP frequency model; the score
    # network pretrains on its samples (3,000 steps, free), then 1,000 DP-SGD steps of the
    # `stein` estimator with the other half; each chain starts at a sample of the model
    # with noise of level 3 of 8 (σ 0.41) and anneals down to the last in 50 rounds of one
    # leapfrog step (Langevin dynamics: no accept/reject at a single step).
    "mnist": {
        **_MNIST_FREQUENCY_START,
        "ssm_variant": "stein",
        "ema": 0.999,
        "warm_start_steps": 3000,
        "warm_start_batch": 128,
        "steps": 1000,
        "sampler_first_level": 3,
        "sampler_rounds": 50,
        "sampler_steps": 1,
        "lambda0": 0.0158,
        "mh": "none",
    },
    # The spec's budget run (§10.4): DPDM's NCSN++ sizes for 28×28 / 32×32 on one GPU.
    "paper": {
        **_COMMON,
        "batch_size": 1024,
        "steps": 1800,
        "projections": 2,
        "micro_batch_size": 256,
    },
}
# 28×28 images at ε ≤ 3: the earlier `mnist` with the pooled within-class covariance (K times
# less noise per entry) and 100 DP-SGD steps; no teacher.
PRESETS["mnist-eps1"] = {
    **_MNIST_FREQUENCY_START,
    "frequency_share": 0.5,
    "frequency_covariance": "pooled",
    "steps": 100,
}
# 28×28 with a DP teacher (70% of ε) choosing the images by its labels, 80% of the rest on the
# frequency model and 20 DP steps: a higher CNN accuracy that the teacher's labels carry.
PRESETS["mnist-teacher"] = {
    **_MNIST_FREQUENCY_START,
    "frequency_share": 0.8,
    "frequency_denoise": "clip",  # as measured
    "steps": 20,
    **RELABELLING_TEACHER,
}

# The optional shared stages (`dpsynth.methods.blocks`; off unless their share > 0).
for _preset in PRESETS.values():
    for _key, _value in {**FREQUENCY_DEFAULTS, **TEACHER_DEFAULTS}.items():
        _preset.setdefault(_key, _value)
