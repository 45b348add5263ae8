"""The image presets' frequency-model settings are valid and are the ones that were measured.

`frequency_denoise` changes what every 28×28 release looks like (docs/leaderboard.md, the
denoised rows); a preset inheriting a value it was never measured with (a digits preset built
from a 28×28 one, a teacher preset from the plain one) would ship unmeasured figures.
"""

from __future__ import annotations

import pytest

from dpsynth.methods.registry import get_method, methods_for
from dpsynth.privacy.releases.frequency import DENOISERS

IMAGE_METHODS = methods_for("image")

# The presets whose measured rows took `spiked` (docs/leaderboard.md, "Denoised frequency
# model"); every other image preset
# with a frequency stage keeps `clip`.
SPIKED = {
    ("freq", "mnist-eps1"),
    ("pge", "mnist"), ("pge", "mnist-eps1"),
    ("psg", "mnist"), ("psg", "mnist-eps1"),
    ("dpkernel", "mnist"), ("dpkernel", "mnist-teacher"), ("dpkernel", "mnist-public"),
    ("dpkernel", "mnist-quality"),
    ("rdpgan", "mnist"),
}  # fmt: skip
# `spiked-pooled`: the same with each class's bulk from the pooled within-class covariance.
SPIKED_POOLED = {("freq", "mnist")}


@pytest.mark.parametrize("method", IMAGE_METHODS)
def test_every_image_presets_denoiser_is_known(method: str) -> None:
    for name, preset in get_method(method).presets.items():
        assert preset.get("frequency_denoise", "clip") in DENOISERS, (method, name)


@pytest.mark.parametrize("method", IMAGE_METHODS)
def test_only_the_measured_presets_denoise_the_frequency_model(method: str) -> None:
    for name, preset in get_method(method).presets.items():
        expected = "spiked" if (method, name) in SPIKED else "clip"
        expected = "spiked-pooled" if (method, name) in SPIKED_POOLED else expected
        assert preset.get("frequency_denoise", "clip") == expected, (method, name)
