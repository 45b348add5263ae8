"""The precision a released schema writes for a float column (`released_decimals`): read off
noisy counts of values by digits after the point, it must not take the noise of an empty bin
for a real precision (a column written to one decimal released with six)."""

from __future__ import annotations

import numpy as np

from dpsynth.privacy.releases.schema_release import MAX_DECIMALS, released_decimals


def test_noise_alone_rarely_adds_decimals():
    # A column of 2,000 values written to one decimal, counts released with std 10: the bins
    # of 2…6 digits are noise alone. Over 20,000 releases the precision must stay 1 but for
    # about 1e-3 of them (a 3-deviation cut on each empty bin gave about 0.7%).
    rng = np.random.default_rng(0)
    std, trials = 10.0, 20_000
    counts = np.zeros(MAX_DECIMALS + 1)
    counts[0], counts[1] = 200.0, 1_800.0  # "23" beside "23.4"
    noisy = counts + std * rng.standard_normal((trials, MAX_DECIMALS + 1))
    chosen = np.array([released_decimals(row, std) for row in noisy])
    assert (chosen >= 1).all()
    assert (chosen > 1).mean() < 0.003


def test_a_real_precision_and_no_precision():
    std = 5.0
    counts = np.array([0.0, 0.0, 30.0, 900.0, 0.0, 0.0, 0.0])  # mostly three decimals
    assert released_decimals(counts, std) == 3
    assert released_decimals(np.zeros(MAX_DECIMALS + 1), std) is None
