"""DPAF presets: plain data (public constants, never tuned on private data at run time).

Keys:
- `batch_size` B: the expected size of each discriminator step's Poisson batch (q = B/N);
- `window` μ: discriminator steps per conv2* DP-SGD step (the paper's asymmetry multiplier);
- `windows`: phase-2 windows (μ·windows discriminator steps in all);
- `c_steps`: phase-1 DP-SGD steps on the classifier C (0 with `conv1_init=random`);
  each takes the union of μ Poisson(q) draws, a Poisson(q_w) lot, so phase 1 and phase 2
  have the same per-step mechanism and one noise scale σ_w is calibrated for both;
- `noise_ratio` σ_agg/σ_conv2 (fixed, public): splits σ_w between DPAGG and conv2*;
- `conv1_init`: `transfer` (phase 1) or `random` (N(0, 0.02), frozen, no phase 1);
- `transfer_conv2`: also start the discriminator's conv2* from C's (DP-trained) conv2;
- `c_label_input`: whether C sees the label branch (spec §10.1-A1; default false);
- `clip_c`, `clip_conv2`: the per-record clipping norms u₁, u₂; `grad_keep`: top-k fraction;
- `g_view`: the generator's loss through D on single samples (`sample`, the paper's D̂) or on
  the clean aggregate of its fake batch (`aggregate`, what D's head was trained on);
- `agg_reduction`: `mean` (noisy sum / B, B public) or `sum`;
- architecture: `width`, `conv1_layers`, `conv2_layers`, `fc_hidden`, `latent_dim`, `g_width`;
- optimisation: `lr` (Adam, β = (0.5, 0.999), every network), `lr_c`, `n_critic`;
- `g_loss`: the generator's loss: `bce` (the paper's, through D's head) or `match` (its
  per-class mean features against the released real aggregates; needs `class_aggregates`);
- `class_aggregates`: a record contributes onehot(y) ⊗ [h, `count_feature`] to the aggregate
  (per-class feature sums and noisy counts; same sensitivity);
- `train_conv2`: whether conv2* takes its DP-SGD step per window (false: frozen, σ_agg = σ_w·√μ);
- `target_decay`: the running released sum's decay per release (1: plain sum);
- `g_steps`: generator steps per turn; `g_batch`: the matching step's generated batch;
- `phase2_release`: `windows` (a DPAGG release per window, the paper's structure) or `once`
  (with frozen conv2* and `g_loss=match`: ONE release of the whole data set's per-class
  feature sums after phase 1, then `windows` generator steps on it, reading no data);
  `release_share`: that release's share of the ε left (phase 1 gets the rest).
"""

from __future__ import annotations

from typing import Any

from dpsynth.methods.blocks import FREQUENCY_DEFAULTS, TEACHER_DEFAULTS

_COMMON: dict[str, Any] = {
    "mode": "strict",
    "conv1_init": "transfer",
    "transfer_conv2": False,
    "c_label_input": False,
    "noise_ratio": 2.0,
    "clip_c": 1.0,
    "clip_conv2": 1.0,
    "grad_keep": 0.9,
    "agg_reduction": "mean",
    "g_view": "sample",
    "lr": 2e-4,
    "lr_c": 1e-3,
    "n_critic": 1,
    "g_loss": "bce",
    "class_aggregates": False,
    "count_feature": 1.0,
    "train_conv2": True,
    "target_decay": 1.0,
    "g_steps": 1,
    "g_batch": 100,
    # The sampler's latent scale (`Generator.truncation`; post-processing, no privacy cost).
    "sample_truncation": 1.0,
    "phase2_release": "windows",
    "release_share": 0.5,
    # With the frequency stage: λ of the pull towards G as fitted to the model
    # (`blocks.fit_penalty`; 0: off).
    "frequency_anchor": 0.0,
}

_SMALL: dict[str, Any] = {
    **_COMMON,
    "batch_size": 32,
    "window": 1,
    "windows": 1000,
    "c_steps": 100,
    "transfer_conv2": True,
    "g_loss": "match",
    "class_aggregates": True,
    "count_feature": 16.0,
    "train_conv2": False,
    "width": 32,
    "conv1_layers": 1,
    "conv2_layers": 1,
    "fc_hidden": 128,
    "latent_dim": 32,
    "g_width": 32,
    "lr": 1e-3,
}

PRESETS: dict[str, dict[str, Any]] = {
    # The tests and quick checks: seconds on the CPU on digits (C1-C1-×, d = 8).
    "tiny": {
        **_COMMON,
        "batch_size": 16,
        "window": 2,
        "windows": 4,
        "c_steps": 2,
        "width": 8,
        "conv1_layers": 1,
        "conv2_layers": 1,
        "fc_hidden": 16,
        "latent_dim": 16,
        "g_width": 8,
        "lr": 1e-3,
    },
    # 8×8 images (digits) at any ε, under a minute on the CPU: C1-C1-× (d = 1,024), conv2*
    # kept at C's DP-trained conv2, one DPAGG release per phase-2 step, and the generator
    # matching per-class mean features to the released aggregates (`g_loss=match`).
    "small": _SMALL,
    # 28×28 images (mnist-5k) with DPAF's own phases only, no frequency model: `small` with
    # phase 2 released once (one Gaussian release of the per-class feature sums) and 2,000
    # generator steps on it. Too noisy below ε ≈ 3; `auto` takes `mnist-freq` instead.
    "mnist": {
        **_SMALL,
        "windows": 2000,
        "phase2_release": "once",
        "latent_dim": 64,
        "g_width": 64,
    },
    # 28×28 images above ε = 3 (the recommended one): half of ε on the DP frequency model
    # (per-class covariances), which G first learns to reproduce (3,000 regression steps,
    # latent 100); the other half on `mnist`'s phases, whose 500 generator steps at lr 1e-4
    # refine that fit without undoing it. 11.6 minutes on an idle 2-core CPU for mnist-5k;
    # 10,000 images sample in 13 s.
    "mnist-freq": {
        **_SMALL,
        "windows": 500,
        "phase2_release": "once",
        "lr": 1e-4,
        "latent_dim": 100,
        "g_width": 32,
        "frequency_share": 0.5,
        "frequency_covariance": "class",
        "frequency_fit_steps": 3000,
    },
    # The paper's MNIST architecture (C2-C1-×, spec §2.8), B = 24, μ = 8, n_critic = 3, for
    # reproduction on one GPU; the number of windows is ours (the paper gives none).
    "paper": {
        **_COMMON,
        "batch_size": 24,
        "window": 8,
        "windows": 4000,
        "c_steps": 300,
        "width": 64,
        "conv1_layers": 2,
        "conv2_layers": 1,
        "fc_hidden": 512,
        "latent_dim": 100,
        "g_width": 32,
        "n_critic": 3,
    },
}
# 28×28 images at ε ≤ 3 (the recommended one there): `mnist-freq` with the pooled
# within-class covariance (K times less noise per entry).
PRESETS["mnist-freq-eps1"] = {
    **PRESETS["mnist-freq"],
    "frequency_covariance": "pooled",
}
# The optional shared stages (`dpsynth.methods.blocks`; off unless their share > 0).
for _preset in PRESETS.values():
    for _key, _value in {**FREQUENCY_DEFAULTS, **TEACHER_DEFAULTS}.items():
        _preset.setdefault(_key, _value)

CHOICES: dict[str, tuple[str, ...]] = {
    # `paper` reproduces the paper's mechanism and accounting: NOT a DP guarantee; the run is
    # recorded as not private, labelled so, and its claimed ε never enters a statement.
    "mode": ("strict", "paper"),
    "conv1_init": ("transfer", "random"),
    "agg_reduction": ("mean", "sum"),
    "g_view": ("sample", "aggregate"),
    "g_loss": ("bce", "match"),
    "phase2_release": ("windows", "once"),
}
