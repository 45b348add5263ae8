"""freq presets: plain data (public constants, never tuned on private data at run time).

Keys (the shared stage's, `methods.blocks.FREQUENCY_DEFAULTS`, less its share and fit):
- `frequency_band` B: the B×B lowest 2-D DCT frequencies of each channel (clipped to the
  image: B ≥ H, W keeps the whole image);
- `frequency_clip` C_f: the features' L2 clip (0: 0.6·√(C·H·W), from the public shape);
- `frequency_covariance`: `pooled` (one within-class second moment: K times less noise per
  entry) or `class` (one per class);
- `frequency_count_weight` w: the weight of the class counts in the release (sensitivity
  √(2 + w²));
- `frequency_denoise`: the covariances' post-processing, `clip` or `spiked`
  (`dpsynth.privacy.releases.frequency.model_from_release`);
- the DP teacher's keys (`methods.blocks.TEACHER_DEFAULTS`; off unless `teacher_share` > 0);
- `sample_truncation`: the scale of the sampled deviations from the class means
  (`Generator.truncation`; post-processing, no privacy cost).

There is no `frequency_share`: the model takes all of the method's ε (the teacher's share
aside), and no steps, batch or learning rate: the run is the one release.
"""

from __future__ import annotations

from typing import Any

from dpsynth.methods.blocks import FREQUENCY_DEFAULTS, RELABELLING_TEACHER, TEACHER_DEFAULTS

# The shared stage's keys that have no meaning here (the model takes the whole ε; nothing is
# fitted to it). `Method.config` refuses them by name.
NOT_OFFERED: dict[str, str] = {
    "frequency_share": "the frequency model takes all of freq's ε (the teacher's share aside)",
    "warm_start_share": "freq has no central images: the frequency model is its release",
    "frequency_fit_steps": "freq fits no generator: it samples the frequency model itself",
}

_COMMON: dict[str, Any] = {
    **{k: v for k, v in FREQUENCY_DEFAULTS.items() if k not in NOT_OFFERED},
    **TEACHER_DEFAULTS,
    "sample_truncation": 1.0,
}

PRESETS: dict[str, dict[str, Any]] = {
    # Tests: a 4×4 band (d = 16 features a record for one channel).
    "tiny": {**_COMMON, "frequency_band": 4},
    # 8×8 images such as digits at any ε: the band is the whole image (d = 64), with the
    # pooled covariance, which 1,437 records need. Seconds on the CPU, as every freq preset.
    "small": {**_COMMON, "frequency_band": 8},
    # 28×28 images such as mnist-5k above ε = 3: the 10×10 lowest frequencies (d = 100) and one
    # covariance per class, as rdpgan's and pge's `mnist` presets release it; the covariances
    # without the noise's own eigenvalues, so that samples read as digits, and each class's
    # bulk filled from the pooled within-class covariance (`spiked-pooled`): on digits28
    # (1,437 records, no preset chosen on it) `spiked` alone left each class near its mean
    # (CNN 0.535) where this keeps the shared variation (0.773; docs/leaderboard.md).
    "mnist": {
        **_COMMON,
        "frequency_band": 10,
        "frequency_covariance": "class",
        "frequency_denoise": "spiked-pooled",
    },
}
# 28×28 at ε ≤ 3: the pooled within-class covariance (K times less noise per entry).
PRESETS["mnist-eps1"] = {
    **PRESETS["mnist"],
    "frequency_covariance": "pooled",
    "frequency_denoise": "spiked",  # the same as `spiked-pooled` for a pooled covariance
}
# `mnist` with the DP teacher of the other backends' 28×28 presets above ε = 3: 70% of ε to a
# DP-SGD classifier started from a fit to 10,000 of the model's samples, which relabels them.
# (Measured with the clipped covariances, which it keeps; `spiked` under it is not measured.)
PRESETS["mnist-teacher"] = {
    **PRESETS["mnist"],
    **RELABELLING_TEACHER,
    "frequency_denoise": "clip",
}
