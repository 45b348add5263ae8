"""RDP-GAN presets: plain data (public constants, never tuned on private data at run time).

Keys:
- `mode`: `sound` only (spec §4.3.1: DP-SGD on the discriminator's real-loss term); the
  paper's loss-noise modes are refused (see `method.py`);
- `batch_size` m: the expected Poisson batch of each discriminator step (q = m/N); the fake
  batch of each D step and each G step has exactly m samples;
- `n_d` discriminator steps per generator step, `n_g` generator steps: the run is
  T = n_g·n_d loop steps, one D step each;
- `max_grad_norm` C: the per-record clip of the real-loss gradient;
- `schedule` of the noise multiplier over generator iterations t (spec §3.3): `constant`,
  `time` (z₀/(1+k·t)), `exp` (z₀·e^(−k·t)), `step` (z₀·k^⌊t/t*⌋); `decay` is k and
  `step_every` t*. z₀ is calibrated so that the whole schedule meets ε (see `schedule.py`);
  `ant` (adaptive, spec §4.3.4) is refused;
- `arch`: `mlp` (flat vectors; the authors' MNIST code; a table mode only needs its encoding)
  or `conv` (the spec's 3-layer conditional DCGAN, §10.3; far better on digits);
  `hidden` (MLP width) / `width` (conv channels), `latent_dim`;
- optimisation: Adam, β = (`beta1`, 0.999), `lr_d`, `lr_g`.
"""

from __future__ import annotations

from typing import Any

from dpsynth.methods.blocks import (
    FREQUENCY_DEFAULTS,
    RELABELLING_TEACHER,
    TEACHER_DEFAULTS,
)

_COMMON: dict[str, Any] = {
    "mode": "sound",
    "schedule": "constant",
    "decay": 0.01,
    "step_every": 100,
    "max_grad_norm": 1.0,
    "beta1": 0.5,
    # The sampler's latent scale (`Generator.truncation`; post-processing, no privacy cost).
    "sample_truncation": 1.0,
    # With the frequency stage: the weight of a pull of G, in every G step, towards its copy
    # as fitted to the DP frequency model (post-processing; 0: off).
    "frequency_anchor": 0.0,
}

PRESETS: dict[str, dict[str, Any]] = {
    # The tests and quick checks: seconds on the CPU.
    "tiny": {
        **_COMMON,
        "arch": "mlp",
        "batch_size": 16,
        "n_d": 2,
        "n_g": 4,
        "hidden": 32,
        "width": 8,
        "latent_dim": 16,
        "lr_d": 1e-3,
        "lr_g": 1e-3,
    },
    # The plain DP-GAN on 8×8 images (digits), a couple of minutes on one CPU core: the
    # conditional DCGAN (D: 16 → 32 channels, GroupNorm). `small-freq` and `small-eps1` are the
    # recommended ones.
    "small": {
        **_COMMON,
        "arch": "conv",
        "batch_size": 256,
        "n_d": 2,
        "n_g": 1500,
        "hidden": 32,
        "width": 16,
        "latent_dim": 32,
        "lr_d": 1e-3,
        "lr_g": 1e-3,
    },
    # The paper's MNIST setting (spec §5, §10.3: conditional 3-layer DCGAN, m = 64, n_d = 5,
    # n_g = 1000, lr 5e-5), for reproduction: minutes on a GPU.
    "paper": {
        **_COMMON,
        "arch": "conv",
        "batch_size": 64,
        "n_d": 5,
        "n_g": 1000,
        "hidden": 256,
        "width": 64,
        "latent_dim": 100,
        "lr_d": 5e-5,
        "lr_g": 5e-5,
    },
}

CHOICES: dict[str, tuple[str, ...]] = {
    "head": ("soft", "hard"),
    "mode": ("sound",),
    "schedule": ("constant", "time", "exp", "step"),
    "arch": ("mlp", "conv"),
}

# 28×28 images (mnist-5k) above ε = 3 (the recommended one): half of ε on the DP frequency
# model (per-class covariances), which G (latent 100) first learns to reproduce in 3,000
# regression steps; the DP GAN then trains with the other half. 3.1 minutes on an idle 2-core
# CPU for mnist-5k; 10,000 images sample in 10 s.
PRESETS["mnist"] = {
    **PRESETS["small"],
    "latent_dim": 100,
    # The DP discriminator's half of ε: 1,000 D steps (500 G steps).
    "n_d": 2,
    "n_g": 500,
    "lr_d": 2e-4,
    "lr_g": 1e-4,
    "frequency_share": 0.5,
    "frequency_covariance": "class",
    "frequency_fit_steps": 3000,
    # G is fitted to the model's samples without the noise's own covariance directions: on
    # mnist-5k FID 175.6 against 179.8, CNN 0.727 against 0.707, and every class's samples
    # read as the digit (docs/leaderboard.md, the denoised rows).
    "frequency_denoise": "spiked",
    # Every G step is pulled towards G as fitted to the model (weight 10): on mnist-5k CNN
    # 0.810 against 0.727 at the same FID (176.6 against 175.6); 30 and 100 trade FID for
    # accuracy (0.824 / 196, 0.832 / 231), 1 does nothing. On the unseen digits28 0.849 / 236
    # against 0.805 / 213 (docs/leaderboard.md).
    "frequency_anchor": 10.0,
}
# 28×28 images at ε ≤ 3: `mnist` with the pooled within-class covariance (K times less noise
# per entry).
PRESETS["mnist-eps1"] = {
    **PRESETS["mnist"],
    "frequency_covariance": "pooled",
    "frequency_denoise": "clip",
    # No anchor: it would hold G to the clipped model's textures (mnist-5k at ε = 1: CNN 0.734
    # but FID 307.0 against 0.653 / 216.5, worse than the model alone, 272.9).
    "frequency_anchor": 0.0,
}
# 28×28 with a DP teacher (70% of ε) choosing the images by its labels, 95% of the rest on the
# frequency model and one GAN step: it measures the frequency model and the teacher, not
# RDP-GAN.
PRESETS["mnist-teacher"] = {
    **PRESETS["mnist"],
    "n_d": 1,
    "n_g": 1,
    "frequency_share": 0.95,
    "frequency_denoise": "clip",  # as measured
    "frequency_anchor": 0.0,
    **RELABELLING_TEACHER,
}

# Small images such as the 8×8 digits above ε = 3 (the recommended one there): `mnist-eps1`,
# whose 10×10 band holds the whole 8×8 image: half of ε on the frequency model, G fitted to
# it, the DP GAN with the other half.
PRESETS["small-freq"] = {**PRESETS["mnist-eps1"], "frequency_denoise": "clip"}
# Small images at ε ≤ 3 (the recommended one there): `small-freq` with each G step pulled
# lightly towards G as fitted to the model (weight 0.3). At ε = 1 the DP GAN alone drifts from
# the model's classes: on digits CNN 0.56–0.57 at FID 57–85 without the anchor, 0.754 / 60.4
# with it; 1 and 3 give FID for nothing (0.699 / 88.2, 0.691 / 104.4; docs/leaderboard.md).
PRESETS["small-eps1"] = {**PRESETS["small-freq"], "frequency_anchor": 0.3}

# The optional shared stages (`dpsynth.methods.blocks`; off unless their share > 0); images
# only (the teacher and the frequency model are for images).
for _preset in PRESETS.values():
    for _key, _value in {**FREQUENCY_DEFAULTS, **TEACHER_DEFAULTS}.items():
        _preset.setdefault(_key, _value)

# Tables (encoded rows: one-hot blocks in {0, 1}, numbers in [-1, 1]): an MLP D on
# (row ‖ one-hot target) without normalisation layers, and an MLP G ending in the shared
# `TableHead` (softmax per categorical block, tanh per number). Only `arch=mlp` applies.
TABLE_PRESETS: dict[str, dict[str, Any]] = {
    # The tests and the demo on german-credit: seconds on the CPU.
    "tiny": {
        **_COMMON,
        "arch": "mlp",
        "head": "hard",
        "batch_size": 64,
        "n_d": 1,
        "n_g": 40,
        "hidden": 32,
        "width": 8,
        "latent_dim": 16,
        "lr_d": 2e-3,
        "lr_g": 2e-3,
    },
    # Tables such as german-credit or Census-Income KDD at any ε, two minutes at most on one
    # CPU thread: a narrow D (64) and a large batch (less relative noise per step). Kept for
    # comparison; mst and aim do far better on tables.
    "small": {
        **_COMMON,
        "arch": "mlp",
        "head": "hard",
        "batch_size": 512,
        "n_d": 1,
        "n_g": 2000,
        "hidden": 64,
        "width": 8,
        "latent_dim": 32,
        "lr_d": 1e-3,
        "lr_g": 1e-3,
    },
}
