"""DP-Kernel's presets (plain data): image presets with the warm start's defaults, table presets.

Each comment says what a preset is for; what it measured is in docs/leaderboard.md."""

from __future__ import annotations

from typing import Any

from dpsynth.methods.blocks import FREQUENCY_DEFAULTS, HALF_BUDGET_TEACHER, TEACHER_DEFAULTS
from dpsynth.privacy.mechanisms.functional import functional_sensitivity

_PAPER_BANDWIDTHS = (1.0, 2.0, 4.0, 8.0, 16.0)

# The DP warm start (`dpsynth.privacy.releases.central`): `warm_start_share` of ε (0: off) on noised
# per-class means; the generator then takes `warm_start_steps` non-private MMD steps (same
# kernel) towards "records" mean[y] + `warm_start_jitter`·N(0, I) before its DP steps.
WARM_START_DEFAULTS: dict[str, Any] = {
    "warm_start_share": 0.0,
    "warm_start_clip": 0.0,
    "warm_start_count_weight": 0.5,
    "warm_start_jitter": 0.3,
    "warm_start_steps": 300,
}

PRESETS: dict[str, dict[str, Any]] = {
    # The tests and quick checks: seconds on the CPU on digits. The exact add/remove sensitivity
    # √n_L, as every recommended preset (the paper's √(2 n_L) is √2 more noise for the same ε).
    "tiny": {
        "batch_size": 16,
        "generated_points": 16,
        "steps": 20,
        "bandwidths": (4.0, 8.0, 16.0),
        "sensitivity": "add_remove",
        "max_grad_norm": functional_sensitivity(3, "add_remove"),
        "arch": "conv",
        "width": 8,
        "latent_dim": 10,
        "norm": "group",
        "conditional": True,
        "label_input": "embed",
        "optimizer": "adam",
        "lr": 2e-3,
        "jitter": 1e-8,
        "ema": 0.0,
    },
    # 8×8 images (digits) at ε about 10, under a minute on the CPU. Two wide kernels fixed a
    # priori for 64 values in [-1, 1] (never fitted to the data) and an EMA of the weights.
    "small": {
        "batch_size": 256,
        "generated_points": 128,
        "steps": 2000,
        "bandwidths": (8.0, 16.0),
        "sensitivity": "paper",
        "max_grad_norm": functional_sensitivity(2, "paper"),
        "arch": "conv",
        "width": 64,
        "latent_dim": 10,
        "norm": "group",
        "conditional": True,
        "label_input": "embed",
        "optimizer": "adam",
        "lr": 1e-3,
        "jitter": 1e-8,
        "ema": 0.99,
    },
    # 8×8 images at every ε (the recommended one there, chosen at ε = 1): one narrower kernel
    # (ℓ = 6, half the sensitivity of two), the exact add/remove sensitivity √n_L, samples at
    # latent scale 0.5. About 15 s of training on the CPU.
    "small-eps1": {
        "sample_truncation": 0.5,
        "batch_size": 256,
        "generated_points": 128,
        "steps": 2000,
        "bandwidths": (6.0,),
        "sensitivity": "add_remove",
        "max_grad_norm": functional_sensitivity(1, "add_remove"),
        "arch": "conv",
        "width": 64,
        "latent_dim": 10,
        "norm": "group",
        "conditional": True,
        "label_input": "embed",
        "optimizer": "adam",
        "lr": 1e-3,
        "jitter": 1e-8,
        "ema": 0.99,
    },
    # 28×28 images (mnist-5k) above ε = 3: half of ε on the DP frequency model (per-class
    # covariances), which G first learns to reproduce (latent 100, 1,000 regression steps),
    # then 2,000 DP-MMD steps at lr 1e-4 with one kernel of width 12 fixed a priori for 784
    # values, the label in every decoder layer. Tens of minutes on the CPU.
    "mnist": {
        "warm_start_share": 0.0,
        # The other half of ε for the functional mechanism (the DP-MMD steps).
        "frequency_share": 0.5,
        "frequency_covariance": "class",
        # G first reproduces the model without the noise's own covariance directions: on
        # mnist-5k FID 88.6 against 122.0, CNN 0.857 against 0.879 (docs/leaderboard.md).
        "frequency_denoise": "spiked",
        "warm_start_steps": 1000,
        # Read only with the central images (`--set warm_start_share=0.2 --set
        # frequency_share=0 --set latent_dim=10 --set lr=1e-3 --set sample_truncation=0.5`).
        "warm_start_jitter": 0.6,
        "sample_truncation": 1.0,
        "batch_size": 512,
        "generated_points": 128,
        "steps": 2000,
        "bandwidths": (12.0,),
        "sensitivity": "add_remove",
        "max_grad_norm": functional_sensitivity(1, "add_remove"),
        "arch": "conv",
        "width": 64,
        "latent_dim": 100,
        "norm": "group",
        "conditional": True,
        "label_input": "layers",
        "optimizer": "adam",
        "lr": 1e-4,
        "jitter": 1e-8,
        "ema": 0.99,
    },
    # 28×28 images at ε ≤ 3: as `mnist` with the pooled covariance (less noise per entry), a
    # wider kernel (ℓ = 16: less derivative noise per coordinate) and half the DP steps at
    # twice the batch (less noise per step at the same ε). Minutes on the CPU.
    "mnist-eps1": {
        "warm_start_share": 0.0,
        # The other half of ε for the functional mechanism, over 500 DP-MMD steps.
        "frequency_share": 0.5,
        "frequency_covariance": "pooled",
        "warm_start_steps": 1000,
        # Read only with the central images (`--set warm_start_share=0.9 --set
        # frequency_share=0 --set latent_dim=10 --set lr=1e-3 --set sample_truncation=0.3`).
        "warm_start_jitter": 0.6,
        "sample_truncation": 1.0,
        "batch_size": 1024,
        "generated_points": 128,
        "steps": 500,
        "bandwidths": (16.0,),
        "sensitivity": "add_remove",
        "max_grad_norm": functional_sensitivity(1, "add_remove"),
        "arch": "conv",
        "width": 64,
        "latent_dim": 100,
        "norm": "group",
        "conditional": True,
        "label_input": "embed",
        "optimizer": "adam",
        "lr": 1e-4,
        "jitter": 1e-8,
        "ema": 0.99,
    },
    # The paper's conditional MNIST setting (spec §2.4, §5: DCGAN decoder, RMSprop, B = M = 60,
    # five bandwidths, 200,000 steps), for reproduction only: about 6 h on one CPU thread, and
    # weak under the sound mechanism; the `mnist` presets are the choice for 28×28 data.
    "paper-200k": {
        "batch_size": 60,
        "generated_points": 60,
        "steps": 200_000,
        "bandwidths": _PAPER_BANDWIDTHS,
        "sensitivity": "paper",
        "max_grad_norm": functional_sensitivity(len(_PAPER_BANDWIDTHS), "paper"),
        "arch": "conv",
        "width": 64,
        "latent_dim": 10,
        "norm": "batch",
        "conditional": True,
        "label_input": "embed",
        "optimizer": "rmsprop",
        "lr": 5e-5,
        "jitter": 1e-8,
        "ema": 0.0,
    },
}
# 28×28 above ε = 3 with the DP teacher (a named option, not picked by `auto`): `mnist` with
# the relabelling teacher on half of ε, so the frequency model and the functional mechanism
# share the other half. On mnist-5k at ε = 10 the most accurate release measured, at
# `mnist`'s fidelity (CNN 0.900, FID 90.7, against 0.857 and 88.6); without the frequency
# model (the teacher and the functional mechanism alone) 0.899 at FID 143.5. 10.0 minutes on
# an idle 2-core CPU for mnist-5k; 10,000 images sample in 18 s.
PRESETS["mnist-teacher"] = {**PRESETS["mnist"], **HALF_BUDGET_TEACHER}
# The same at ε ≤ 3: `mnist-eps1` with the teacher on half of ε. On mnist-5k at ε = 1 the most
# accurate release measured (CNN 0.796, FID 206.9, against `mnist-eps1`'s 0.711 and 178.5).
PRESETS["mnist-eps1-teacher"] = {**PRESETS["mnist-eps1"], **HALF_BUDGET_TEACHER}
# The quality tier (`--preset quality`) for 28×28 above ε = 3: `mnist-teacher` with the
# teacher's DP-SGD on 4 shifted copies of each record (augmentation multiplicity: a DP-SGD
# classifier of this schedule at ε = 7 scores 0.96 with them, 0.935 without, on mnist-5k) and
# twice the DP-MMD steps. Measured in docs/leaderboard.md (the quality tier).
PRESETS["mnist-quality"] = {**PRESETS["mnist-teacher"], "teacher_augment": 4, "steps": 4000}
# With declared-public labelled images (`train --public`, required) at ε ≤ 3: the generator
# starts from 1,000 public MMD steps instead of the frequency model, so the functional mechanism
# holds half of ε and the teacher (also pretrained on them) the other half. On mnist-5k at ε = 1
# with typeset digits as the public set (bench/fonts28.py): CNN 0.848, FID 167.2, against
# `mnist-eps1-teacher`'s 0.796 and 206.9 (0.837 and 190.6 with the same public set).
PRESETS["mnist-eps1-public"] = {
    **PRESETS["mnist-eps1-teacher"],
    "frequency_share": 0.0,
    "public_pretrain_steps": 1000,
}
# With declared-public labelled images (`train --public`, required) above ε = 3: `mnist` with
# the kernel on pixels joined to 64 features of an encoder trained on the public images
# (features.py). On mnist-5k at ε = 10 with typeset digits as the public set, three training
# runs: FID 78.1–79.4 (`mnist`: 82.6–88.6 in two; the public digits alone: 82.0), CNN
# 0.841–0.863 (0.849–0.857); on digits28 0.884 and 150.5 (0.894 and 154.1).
PRESETS["mnist-public"] = {**PRESETS["mnist"], "kernel_features": 64, "kernel_feature_scale": 1.0}
for _preset in PRESETS.values():
    for _key, _value in {**WARM_START_DEFAULTS, **FREQUENCY_DEFAULTS, **TEACHER_DEFAULTS}.items():
        _preset.setdefault(_key, _value)
    # The kernel sees every pixel (0), or the K lowest DCT frequencies (basis.py).
    _preset.setdefault("kernel_frequencies", 0)
    # Or joined to features learnt from --public images (features.py): off (0) by default.
    _preset.setdefault("kernel_features", 0)
    _preset.setdefault("kernel_feature_scale", 1.0)
    _preset.setdefault("kernel_encoder_steps", 1000)


# Tables (german-credit and the like): an MLP ending in `methods.blocks.TableHead`. One
# bandwidth, ℓ = 2, fixed a priori below the encoding's typical squared distance between rows
# (2 per differing category, up to 4 per number), and few generated points (16 per class), since
# the derivative-GP noise costs a Cholesky of size about M² per step.
TABLE_PRESETS: dict[str, dict[str, Any]] = {
    # The tests and the demo: seconds on the CPU.
    "tiny": {
        "batch_size": 64,
        "generated_points": 32,
        "steps": 300,
        "bandwidths": (2.0,),
        "sensitivity": "add_remove",
        "max_grad_norm": functional_sensitivity(1, "add_remove"),
        "arch": "table",
        "head": "soft",
        "number_bins": 0,
        "width": 64,
        "latent_dim": 16,
        "norm": "none",
        "conditional": True,
        "optimizer": "adam",
        "lr": 2e-3,
        "jitter": 1e-8,
        "ema": 0.9,
    },
    # Tables of up to a few hundred thousand rows at any ε, a minute or two on the CPU; the
    # exact add/remove sensitivity √n_L.
    "small": {
        "batch_size": 256,
        "generated_points": 32,
        "steps": 2000,
        "bandwidths": (2.0,),
        "sensitivity": "add_remove",
        "max_grad_norm": functional_sensitivity(1, "add_remove"),
        "arch": "table",
        "head": "soft",
        "number_bins": 0,
        "width": 128,
        "latent_dim": 16,
        "norm": "none",
        "conditional": True,
        "optimizer": "adam",
        "lr": 1e-3,
        "jitter": 1e-8,
        "ema": 0.99,
    },
}
# The sampler's latent scale (`DPKernelGenerator`): 1 samples z ~ N(0, I) as trained.
for _preset in (*PRESETS.values(), *TABLE_PRESETS.values()):
    _preset.setdefault("sample_truncation", 1.0)
