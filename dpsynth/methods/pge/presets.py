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
    # DP warm start (dpsynth.privacy.central): share of ε for the central images (0: off), the
    # records' clipping norm (0: √d, the largest norm in [-1, 1], so no clipping), the counts'
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

# Digits (8x8) on the CPU, tuned at ε = 10 on the public digits set
# (bench/results/2026-11-23-tuning-logs/tuning-pge.md): a DP warm start from central images (30% of
# ε), 300 pretraining steps on them, then 100 DP-SGD steps; the sampler starts at the class's
# central image with the noise of level 2 of 8. Noise multiplicity (4 particles per record,
# averaged before clipping) and a narrow net as before. CNN 0.381 -> 0.880 at ε = 10.
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

PRESETS: dict[str, dict[str, Any]] = {
    # CPU tests: seconds on digits (8x8).
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
    # `small` for small ε (what `--preset auto` takes at ε ≤ 3): most of the budget goes to
    # the central images (85%), 200 pretraining steps and a short DP-SGD fine-tune (25 steps).
    # CNN 0.093 -> 0.811 at ε = 1.
    # Issue 45: half of ε for the private score matching.
    "small-eps1": {**_SMALL, "warm_start_share": 0.5, "warm_start_steps": 200, "steps": 25},
    # 28×28 images such as mnist-5k on a CPU (recommended for records of ≥ 400 values above
    # ε = 3; issue 28). The curriculum's easy first target is the DP frequency model (80% of
    # ε: class means and per-class covariances of the 10×10 lowest DCT frequencies, about the
    # detail of a 16×16 image, hence the 16×16 working size with a fixed bilinear resize);
    # the network pretrains on its samples (100 steps), then 20 DP-SGD steps on the pixels;
    # the chains start at a sample of the model with the noise of level 6 of 8 and take 2
    # rounds of 3 HMC steps (SDEdit-like: the score network refines the model's samples), so
    # 10,000 images sample in about a minute. At 28×28 the same took 6× the CPU time.
    # A DP teacher labels the release (`RELABELLING_TEACHER`: the backend plans for 30% of ε,
    # the teacher's DP-SGD fills the rest): one release each, mnist-5k 0.883 → 0.907 / 0.917,
    # unseen digits28 0.892 → 0.903.
    # Designed from probes on the public mnist-5k
    # (bench/results/2026-11-23-tuning-logs/tuning-28.md).
    "mnist": {
        **_SMALL,
        "image_size": 16,
        "resize": "resize",
        "warm_start_share": 0.0,
        # Issue 45: private score matching keeps half of ε, over 200 DP-SGD steps.
        "frequency_share": 0.5,
        "frequency_covariance": "class",
        "steps": 200,
        "projections": 1,
        "warm_start_steps": 100,
        "warm_start_batch": 64,
        "sampler_init": "frequency",
        "sampler_rounds": 2,
        "sampler_steps": 3,
        "sampler_first_level": 6,
    },
    # Spec section 10.4 budget run: DPDM's NCSN++ sizes for 28x28 / 32x32 on one GPU.
    "paper": {
        **_COMMON,
        "batch_size": 1024,
        "steps": 1800,
        "projections": 2,
        "micro_batch_size": 256,
    },
}
# 28×28 at small ε (recommended at ε ≤ 3): the pooled within-class covariance (one matrix
# for all classes: K times less noise per entry than per-class ones) and 85% of ε for it;
# no teacher (on digits28's 1,437 records at ε ≤ 3 its labels were worse than the model's).
PRESETS["mnist-eps1"] = {
    **PRESETS["mnist"],
    "frequency_share": 0.5,
    "frequency_covariance": "pooled",
    "steps": 100,
}
# The release of an earlier version, named: 80% of the backend's share on the frequency
# model, 20 DP steps, and a DP teacher (70% of ε) choosing the images by its labels; its CNN
# accuracy comes from the teacher's labels more than from the images.
PRESETS["mnist-teacher"] = {
    **PRESETS["mnist"],
    "frequency_share": 0.8,
    "steps": 20,
    **RELABELLING_TEACHER,
}

# The optional shared stages (`dpsynth.methods.blocks`; off unless their share > 0).
for _preset in PRESETS.values():
    for _key, _value in {**FREQUENCY_DEFAULTS, **TEACHER_DEFAULTS}.items():
        _preset.setdefault(_key, _value)
