"""Reading where a column's rows are off the schema release's noisy histograms: wider windows
rescue a column whose rows spread too thin for any one bin, and noise alone rarely passes."""

from __future__ import annotations

import numpy as np

from dpsynth.privacy.releases.schema_spans import coarse_span


def test_rows_spread_thin_over_many_bins_still_get_their_span() -> None:
    rng = np.random.default_rng(0)
    std = 21.6
    counts = np.zeros(203)
    counts[30:98] = 40.0  # 68 years of about 40 rows, each well under one bin's cut
    found = 0
    for _ in range(200):
        span = coarse_span(counts + rng.normal(0, std, counts.size), std)
        if span is not None:
            found += 1
            assert span[0] <= 30 and span[1] >= 97  # the whole run of rows, and more
    assert found == 200


def test_noise_alone_rarely_makes_a_span() -> None:
    rng = np.random.default_rng(1)
    spans = [coarse_span(rng.normal(0, 10.0, 203), 10.0) for _ in range(400)]
    # the five widths share a false alarm in 5% of histograms
    assert sum(s is not None for s in spans) / len(spans) < 0.1


def test_a_date_column_spread_over_decades_keeps_its_whole_range() -> None:
    """Birth dates over 68 years at about 40 rows a year: single years clear the cut only here
    and there, so the range read off them alone was often a year or two wide."""
    import torch

    from dpsynth.privacy.releases.schema_release import (
        NumberSpec,
        plan_schema_release,
        release_ranges,
    )

    rng = np.random.default_rng(2)
    start = -40 * 365.25 * 86400  # 1930
    days = rng.integers(0, 25000, 2760)
    seconds = start + days * 86400.0
    spec = NumberSpec("date")
    plan = plan_schema_release(0.75, 1e-5, 3000, 2, {"born": spec, "x": NumberSpec("numeric")}, 3)
    for seed in range(20):
        generator = torch.Generator().manual_seed(seed)
        _, ranges = release_ranges({}, {"born": (seconds, spec)}, plan, generator)
        low, high = ranges["born"]
        assert (high - low) / (365.25 * 86400) >= 60
