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
}

PRESETS: dict[str, dict[str, Any]] = {
    # Seconds on CPU (tests).
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
    # digits (8×8, N = 1437) on one CPU core in a couple of minutes: the conditional DCGAN
    # (D: 16 → 32 channels, GroupNorm); tuned on public digits only
    # (bench/results/2026-11-23-tuning-logs/tuning-digits.md).
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
    # The paper's MNIST setting (spec §5, §10.3): conditional 3-layer DCGAN, m = 64, n_d = 5,
    # n_g = 1000 (T = 5000 D steps), lr 5e-5 for both, Adam β = (0.5, 0.999). Minutes on a GPU.
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

# 28×28 images such as mnist-5k on a CPU (recommended for records of ≥ 400 values above
# ε = 3; issue 28): nearly all of the backend's ε (95%) on the DP frequency model (class
# means and per-class covariances of the 10×10 lowest DCT frequencies); G (a latent of 100 = the
# model's dimension) regresses onto the model's own sampling map for 3,000 steps; the GAN
# then takes one step with the rest. On mnist-5k at ε = 10 (one CNN seed each) the GAN's
# 300 DP steps after the fit lowered the CNN score (0.780 ± 0.003 against 0.859 for the same
# fit without them), and the longer fit raised it (600 → 3,000 steps: 0.859 → 0.886).
# A DP teacher (`RELABELLING_TEACHER`: the backend plans for 30% of ε and the teacher's σ
# fills the rest up to ε under PRV), a small CNN trained with DP-SGD on the records and
# started from a fit to 10,000 of G's samples, labels the release (`relabel`: candidates of
# every class, each image given the teacher's label, the most confident kept). The images
# are the frequency model's at the backend's share.
# Chosen on the public mnist-5k's test split (bench/results/2026-11-23-tuning-logs/tuning-28.md).
PRESETS["mnist"] = {
    **PRESETS["small"],
    "latent_dim": 100,
    # Issue 45: the DP discriminator keeps half of ε, over 1,000 D steps (500 G steps).
    "n_d": 2,
    "n_g": 500,
    "lr_d": 2e-4,
    "lr_g": 1e-4,
    "frequency_share": 0.5,
    "frequency_covariance": "class",
    "frequency_fit_steps": 3000,
}
# 28×28 at small ε (recommended at ε ≤ 3): the pooled within-class covariance (K times less
# noise per entry; probe P7 of tuning-28.md, not compared with per-class ones at ε = 1), and
# no teacher: with ε ≤ 3 on 1,437 records (digits28) its labels were worse than G's own
# (ε = 1: 0.806 → 0.61 / 0.69 at a 70% / 40% share; ε = 3: 0.875 → 0.833), though on
# mnist-5k's 4,000 at ε = 1 they helped (0.77 → 0.81).
PRESETS["mnist-eps1"] = {**PRESETS["mnist"], "frequency_covariance": "pooled"}
# The release of an earlier version, named: 95% of the backend's share on the frequency
# model, G fitted to it, one GAN step, and a DP teacher (70% of ε) choosing the images by its
# labels; it measures the frequency model and the teacher, not RDP-GAN.
PRESETS["mnist-teacher"] = {
    **PRESETS["mnist"],
    "n_d": 1,
    "n_g": 1,
    "frequency_share": 0.95,
    **RELABELLING_TEACHER,
}

# Small images such as the 8×8 digits (recommended below 400 values a record, at every ε):
# `mnist-eps1`'s design, whose frequency band (10×10, clipped to the image) holds the whole
# 8×8 image: half of ε on the DP frequency model (pooled covariance), G fitted to it, then the
# DP GAN with the other half. (Before issue 45 the GAN took one step with 5% of ε.)
PRESETS["small-freq"] = {**PRESETS["mnist-eps1"]}

# The optional shared stages (`dpsynth.methods.blocks`; off unless their share > 0); images
# only (the teacher and the frequency model are for images).
for _preset in PRESETS.values():
    for _key, _value in {**FREQUENCY_DEFAULTS, **TEACHER_DEFAULTS}.items():
        _preset.setdefault(_key, _value)

# Tables (encoded rows: one-hot blocks in {0, 1}, numbers in [-1, 1]): an MLP D on
# (row ‖ one-hot target) without normalisation layers, and an MLP G ending in the shared
# `TableHead` (softmax per categorical block, tanh per number). Only `arch=mlp` applies.
TABLE_PRESETS: dict[str, dict[str, Any]] = {
    # Seconds on CPU (tests, german-credit).
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
    # german-credit or Census-Income KDD on one CPU thread in about two minutes at most.
    # Tuned on public census only (bench/results/2026-11-23-tuning-logs/tuning-tables.md): a
    # narrower D (64) and a larger batch (512: less relative noise per step) did best of five
    # settings at ε = 1, but run-to-run spread is large (see the log).
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
