"""PSG presets: plain data. `steps` (= runs · outer_loop · batches) is derived, not set.

Keys (spec psg §2.1/§4): `spc` synthetic images per class; `runs` R fresh networks;
`outer_loop` T matching rounds per network; `batches` K real Poisson batches (noisy gradient
releases) per round; `inner_loop` J epochs of training the network on S after each round but
the last; `batch_size` the expected Poisson batch B (q = B/N); `max_grad_norm` C; `width`,
`depth`, `norm` of the ConvNet; `lr_syn`/`momentum_syn` the SGD on S's pixels; `lr_net` the
SGD on θ (no momentum); `batch_train` the minibatch for θ's epochs on S; `micro_batch_size`
the chunk of records per vmap; `augment_replicas` augment repeats at `sample` time.

Warm start (`dpsynth.privacy.releases.central`): `warm_start_share` of ε (0: off, S starts as N(0,
1)) releases the DP class means once before the first gradient release, and S starts as each
class's mean plus `warm_start_jitter`·N(0, I) (public seed); `warm_start_clip` the L2 clip of
each record for that release (0: √d, no clipping in [-1, 1]); `warm_start_count_weight` the
weight of the class counts released with the sums.

Generator prior (spec §2.4): `prior` `none` optimises S's pixels; `dcgan` makes S the outputs
G(z_j, y_j; φ) of a conditional generator (`prior_width`, `prior_latent_dim`) at fixed public
codes and optimises φ with Adam at `lr_prior` (`lr_syn`/`momentum_syn` then unused); a warm
start fits G to the jittered class means in `warm_start_steps` steps.
"""

from __future__ import annotations

from typing import Any

from dpsynth.methods.blocks import FREQUENCY_DEFAULTS, RELABELLING_TEACHER, TEACHER_DEFAULTS

_PAPER_COMMON: dict[str, Any] = {
    "spc": 10,
    "outer_loop": 10,
    "batches": 10,
    "inner_loop": 50,
    "batch_size": 256,
    "max_grad_norm": 0.1,
    "width": 128,
    "depth": 3,
    "norm": "instance",
    "lr_syn": 0.1,
    "momentum_syn": 0.5,
    "lr_net": 0.01,
    "batch_train": 256,
    "micro_batch_size": 256,
    "augment_replicas": True,
    "warm_start_share": 0.0,
    "warm_start_clip": 0.0,
    "warm_start_count_weight": 0.5,
    "warm_start_jitter": 0.1,
    "warm_start_steps": 300,
    "prior": "none",
    "prior_latent_dim": 10,
    "prior_width": 64,
    "lr_prior": 0.01,
}

# The base of the CPU presets below: 8×8 images (digits), 1,000 releases.
_SMALL: dict[str, Any] = {
    **_PAPER_COMMON,
    "runs": 40,
    "outer_loop": 5,
    "batches": 5,
    "inner_loop": 10,
    "batch_size": 64,
    "max_grad_norm": 0.1,
    "width": 16,
    "depth": 2,
    "lr_syn": 1.0,
    "warm_start_share": 0.2,
}

PRESETS: dict[str, dict[str, Any]] = {
    # The tests and quick checks: seconds on the CPU (8 releases, a width-8 ConvNet).
    "tiny": {
        **_PAPER_COMMON,
        "spc": 2,
        "runs": 2,
        "outer_loop": 2,
        "batches": 2,
        "inner_loop": 1,
        "batch_size": 16,
        "width": 8,
        "depth": 2,
    },
    # 8×8 images (digits) above ε = 3, about half a minute on the CPU: a narrow network,
    # a large step on S (lr_syn 1), and S started from the DP class means (20% of ε).
    "small": _SMALL,
    # 8×8 images at ε ≤ 3: half of ε for the class means and 4× fewer releases.
    "small-eps1": {**_SMALL, "runs": 10, "warm_start_share": 0.5},
    # 28×28 images (mnist-5k) above ε = 3: S (50 per class) starts from samples of the DP
    # frequency model (half of ε, denoised, pooled) and gradient matching refines it
    # with the other half over 1,000 releases. 8 minutes on an idle 2-core CPU for mnist-5k.
    "mnist": {
        **_SMALL,
        "lr_syn": 3.0,
        "spc": 50,
        "warm_start_share": 0.0,
        # The DP teacher is a named option (`mnist-teacher`), not part of this preset.
        "frequency_share": 0.5,
        # The set starts as the model's samples with the noise's own directions dropped
        # (docs/leaderboard.md, the denoised rows): FID 220 against 265, CNN 0.838 against 0.826.
        "frequency_denoise": "spiked",
        # Each class's surviving directions, the rest from the pooled within-class covariance
        # (K times less noise an entry): on the unseen digits28 (144 records a class) CNN 0.801
        # against 0.669 per class, where the set started as one image a class; on mnist-5k
        # 0.854 / 226.9 against 0.838 / 219.6.
        "frequency_covariance": "pooled",
    },
    # 28×28 images at ε ≤ 3: the pooled within-class covariance (K times less noise per
    # entry), 4× fewer releases and 100 members per class. 5–8 minutes on the CPU.
    "mnist-eps1": {
        **_SMALL,
        "runs": 10,
        "spc": 100,
        "warm_start_share": 0.0,
        "frequency_share": 0.5,  # the other half of ε for the gradient matching
        "frequency_covariance": "pooled",
        # As `mnist`: FID 244 against 265, CNN 0.679 against 0.703 (within its spread).
        "frequency_denoise": "spiked",
    },
    # The paper's budget variant for one GPU (spec §9.4 `quick`): 10,000 releases.
    "quick": {**_PAPER_COMMON, "runs": 100},
    # The paper's MNIST setting at ε = 10 (100,000 releases; at ε = 1 the paper uses
    # --set runs=200), for reproduction: hours on a GPU.
    "paper-multi-hour": {**_PAPER_COMMON, "runs": 1000},
}
# 28×28 with a DP teacher (70% of ε) choosing the images by its labels, 60% of the rest on
# the frequency model: a higher CNN accuracy that the teacher's labels carry, not the images.
PRESETS["mnist-teacher"] = {
    **PRESETS["mnist"],
    "frequency_share": 0.6,
    "frequency_denoise": "clip",  # as measured
    "frequency_covariance": "class",
    **RELABELLING_TEACHER,
}
# The optional shared stages (`dpsynth.methods.blocks`; off unless their share > 0).
for _preset in PRESETS.values():
    for _key, _value in {**FREQUENCY_DEFAULTS, **TEACHER_DEFAULTS}.items():
        _preset.setdefault(_key, _value)
