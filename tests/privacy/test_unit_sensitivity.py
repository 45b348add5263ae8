"""A privacy unit of at most K rows: contribution bounding, and every table mechanism's
sensitivity and noise measured when one unit's K rows change (the worst case: all K rows in
the same cell, bin or class)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.stats import norm

import dpsynth.privacy.mechanisms.marginal_measure as marginal_measure
from dpsynth.errors import UsageError
from dpsynth.ledger.anchors import unit_phrase
from dpsynth.privacy.mechanisms.contribution import (
    UnitBound,
    bound_contributions,
    rows_per_unit,
)
from dpsynth.privacy.mechanisms.histograms import (
    class_counts,
    plan_class_weights_release,
    release_class_weights,
)
from dpsynth.privacy.mechanisms.marginal_measure import MarginalQueries, marginal_counts
from dpsynth.privacy.mechanisms.randomness import PrivateRandomness
from dpsynth.privacy.releases.schema_release import (
    NumberSpec,
    plan_schema_release,
    release_ranges,
)
from dpsynth.privacy.releases.unit_sizes import (
    plan_unit_sizes_release,
    release_unit_sizes,
    size_counts,
)


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ------------------------------------------------------------------ contribution bounding


def test_bounding_keeps_at_most_k_rows_per_unit_and_every_small_unit_whole() -> None:
    units = np.array(["a"] * 7 + ["b"] * 2 + ["c"] + ["d"] * 3, dtype=object)
    kept = bound_contributions(units, 3, _generator(0))
    assert np.all(np.diff(kept) > 0)  # ascending, no row twice
    sizes = dict(zip(*np.unique(units[kept], return_counts=True), strict=True))
    assert sizes == {"a": 3, "b": 2, "c": 1, "d": 3}
    assert sorted(rows_per_unit(units).tolist()) == [1, 2, 3, 7]


def test_bounding_draws_each_row_of_a_unit_with_equal_chance_not_the_first_k() -> None:
    units = np.array(["p"] * 5 + ["q"] * 4, dtype=object)
    hits = np.zeros(9)
    trials = 4000
    for seed in range(trials):
        hits[bound_contributions(units, 2, _generator(seed))] += 1
    # each of p's 5 rows is kept with probability 2/5, each of q's 4 with 2/4
    expected = np.array([2 / 5] * 5 + [2 / 4] * 4)
    assert np.abs(hits / trials - expected).max() < 0.03


def test_bounding_replays_from_the_runs_secret_and_differs_under_another() -> None:
    units = np.repeat(np.arange(200).astype(str), 6).astype(object)
    secret = PrivateRandomness(12345)
    first = bound_contributions(units, 2, secret.replayable("table/contribution-bound"))
    again = bound_contributions(
        units, 2, PrivateRandomness(12345).replayable("table/contribution-bound")
    )
    other = bound_contributions(
        units, 2, PrivateRandomness(54321).replayable("table/contribution-bound")
    )
    assert np.array_equal(first, again)
    assert not np.array_equal(first, other)
    # a replayable stream is not a handed-out one: the run's saved streams are unchanged
    assert secret.state() == {}


def test_unit_bound_refuses_k_below_one_and_states_its_unit() -> None:
    with pytest.raises(UsageError):
        UnitBound("subject_id", 0)
    unit = UnitBound("subject_id", 3).to_json()
    assert unit_phrase(unit) == " per subject_id (at most 3 rows each)"


# ----------------------------------------------------------------- marginal measurements


def _codes(extra_unit_rows: int) -> np.ndarray:
    rng = np.random.default_rng(0)
    base = rng.integers(0, 3, size=(300, 2))
    unit = np.tile([[2, 1]], (extra_unit_rows, 1))  # one unit's rows, all in one cell
    return np.concatenate([base, unit]) if extra_unit_rows else base


@pytest.mark.parametrize("k", [1, 3, 10])
def test_marginal_measurement_noise_is_k_sigma_for_one_units_k_rows(k: int) -> None:
    sizes, clique, sigma = (3, 3), (0, 1), 2.0
    without, with_unit = _codes(0), _codes(k)
    difference = marginal_counts(with_unit, sizes, clique) - marginal_counts(without, sizes, clique)
    sensitivity = float(np.linalg.norm(difference))
    assert sensitivity == k  # one unit's K rows move one cell by K
    queries = MarginalQueries(without, sizes, sensitivity=k)
    draws = np.stack(
        [queries.measure([clique], sigma, _generator(s))[0] for s in range(2000)]
    ) - marginal_counts(without, sizes, clique)
    std = draws.std()
    assert abs(std - k * sigma) < 0.05 * k * sigma
    # the privacy loss is that of a sensitivity-1 Gaussian at σ: Δ / std = 1 / σ
    assert sensitivity / (k * sigma) == pytest.approx(1 / sigma)


def test_marginal_selection_sensitivity_covers_one_units_k_rows(monkeypatch) -> None:
    k, sizes, clique = 4, (3, 3), (0, 1)
    seen: list[float] = []

    def spy(scores, sensitivity, epsilon, generator):
        seen.append(float(sensitivity))
        return int(np.argmax(scores))

    monkeypatch.setattr(marginal_measure, "exponential_mechanism", spy)
    estimate = [np.full(9, 300 / 9)]
    scores = []
    for codes in (_codes(0), _codes(k)):
        queries = MarginalQueries(codes, sizes, sensitivity=k)
        queries.select([clique], estimate, [0.0], [1.0], 1.0, _generator(0))
        scores.append(np.abs(marginal_counts(codes, sizes, clique) - estimate[0]).sum())
    assert seen == [k, k]
    assert abs(scores[1] - scores[0]) <= seen[0]


# ---------------------------------------------------------------------- schema release


@pytest.mark.parametrize("k", [1, 3, 10])
def test_schema_release_noise_and_threshold_scale_with_k(k: int) -> None:
    specs = {"age": NumberSpec("integer")}
    one = plan_schema_release(1.0, 1e-5, 5000, 2, specs, 1)
    plan = plan_schema_release(1.0, 1e-5, 5000, 2, specs, 1, unit_rows=k)
    assert plan.noise_multiplier == one.noise_multiplier  # same events, same ε
    assert plan.events == one.events
    assert plan.category_noise_std == pytest.approx(k * one.category_noise_std)
    assert plan.range_noise_std == pytest.approx(k * one.range_noise_std)
    assert plan.shape_noise_std == pytest.approx(k * one.shape_noise_std)
    # a value held by one unit's K rows only clears the threshold with probability ≤ δ_c / K
    per_value = plan.threshold_delta / 2 / k
    released = norm.sf((plan.category_threshold - k) / plan.category_noise_std)
    assert released == pytest.approx(per_value, rel=1e-6)


def test_a_value_held_by_one_unit_is_released_at_the_planned_rate() -> None:
    # a plan with a large δ share, so the rate can be measured: the threshold is K + s·z
    k = 3
    plan = plan_schema_release(2.0, 0.3, 1000, 1, {}, 0, unit_rows=k)
    values = np.array(["common"] * 900 + ["rare"] * k, dtype=object)
    trials = 3000
    hits = sum(
        "rare" in release_ranges({"c": values}, {}, plan, _generator(s))[0]["c"]
        for s in range(trials)
    )
    expected = norm.sf((plan.category_threshold - k) / plan.category_noise_std)
    assert expected == pytest.approx(plan.threshold_delta / k, rel=1e-6)
    assert abs(hits / trials - expected) < 4 * math.sqrt(expected * (1 - expected) / trials)


def test_the_targets_label_list_gets_less_noise_within_the_same_sensitivity() -> None:
    plan = plan_schema_release(1.0, 1e-5, 5000, 5, {"x": NumberSpec("numeric")}, 0, target=True)
    assert plan.target_noise_std is not None and plan.target_threshold is not None
    assert plan.target_noise_std < plan.category_noise_std
    # the release's L2 sensitivity in noise units stays √3/σ (three rounds at σ): Σ 1/s² over
    # its histograms (4 lists, the target's, a range, a span and a shape)
    sigma = plan.noise_multiplier
    total = 4 / plan.category_noise_std**2 + 1 / plan.target_noise_std**2
    total += 1 / plan.range_noise_std**2 + 1 / plan.span_noise_std**2
    total += 1 / plan.shape_noise_std**2
    assert total == pytest.approx(3 / sigma**2, rel=1e-9)
    # the target takes a quarter of the release's precision
    assert 1 / plan.target_noise_std**2 == pytest.approx(total / 4, rel=1e-9)


# ------------------------------------------------------------- class weights, unit sizes


@pytest.mark.parametrize("k", [1, 3])
def test_class_weights_noise_is_k_sigma(k: int) -> None:
    plan = plan_class_weights_release(1.0, 1e-5, unit_rows=k)
    assert plan.noise_std == pytest.approx(k * plan.noise_multiplier)
    labels = np.array(["a"] * 60 + ["b"] * 40)
    neighbour = np.concatenate([labels, ["b"] * k])  # one unit's K rows, one class
    diff = class_counts(neighbour, ("a", "b")) - class_counts(labels, ("a", "b"))
    assert np.linalg.norm(diff) == k
    draws = []
    for s in range(1500):
        shares = release_class_weights(labels, ("a", "b"), plan, _generator(s))
        draws.append(shares[0])
    # the shares come from counts + N(0, (Kσ)²): wider noise for larger K
    assert np.std(draws) > 0


def test_unit_sizes_histogram_moves_one_bin_by_one_per_unit() -> None:
    sizes = np.array([1, 1, 2, 3, 3, 3])
    neighbour = np.append(sizes, 2)  # one more unit, of 2 rows
    diff = size_counts(neighbour, 3) - size_counts(sizes, 3)
    assert diff.tolist() == [0.0, 1.0, 0.0]  # L2 sensitivity 1, whatever K
    plan = plan_unit_sizes_release(0.5, 1e-5, 3)
    assert plan.noise_multiplier > 0 and len(plan.events) == 1
    shares = release_unit_sizes(sizes, plan, _generator(0))
    assert len(shares) == 3 and sum(shares) == pytest.approx(1.0)
    with pytest.raises(ValueError):
        size_counts(np.array([4]), 3)  # rows must be bounded first


# ------------------------------------------------------------------ user-level DP-SGD


def test_units_are_sampled_whole_at_rate_q() -> None:
    from dpsynth.privacy.mechanisms.poisson import UnitPoissonSampler

    units = torch.tensor([0, 1, 1, 2, 2, 2, 3, 0, 3, 3])
    sampler = UnitPoissonSampler(units, 0.3, _generator(0))
    seen = np.zeros(4)
    trials = 4000
    for _ in range(trials):
        rows = sampler.next()
        drawn = set(units[rows].tolist())
        for unit in drawn:  # every row of a drawn unit, none of the others
            assert set(torch.nonzero(units == unit).flatten().tolist()) <= set(rows.tolist())
        assert set(units[rows].tolist()) == drawn and len(rows) == sum(
            int((units == u).sum()) for u in drawn
        )
        seen[list(drawn)] += 1
    assert np.abs(seen / trials - 0.3).max() < 0.03


def test_dp_sgd_clips_each_row_to_c_over_k_so_a_unit_moves_the_sum_by_c() -> None:
    from dpsynth.privacy.mechanisms.dpsgd import PrivateGradient

    k, c, sigma = 3, 1.0, 2.0
    net = torch.nn.Linear(4, 1)

    def loss(params, buffers, x):  # one record's loss, huge gradients
        return 1e3 * torch.func.functional_call(net, (params, buffers), (x,)).sum()

    # as rdpgan's trainer builds it for a unit of K rows
    gradient = PrivateGradient(
        net, loss, noise_multiplier=sigma * k, max_grad_norm=c / k,
        expected_batch_size=1.0, generator=_generator(0), private=True, grad_mode="vmap",
    )  # fmt: skip
    assert gradient.noise_std == pytest.approx(sigma * c)  # σ·C, as the plan's event
    unit = torch.randn(k, 4) * 10  # one unit's K rows
    gradient.noise_multiplier = 0.0  # the clipped sum alone
    gradient.compute(unit)
    norm = torch.sqrt(sum((p.grad**2).sum() for p in net.parameters()))
    assert norm <= c + 1e-6  # K rows of C / K each: at most C


def test_dpkernel_scales_its_sum_sensitivity_by_k(monkeypatch) -> None:
    import dpsynth.methods.dpkernel.trainer as trainer_module

    seen: list[float] = []
    original = trainer_module.privatize_embedding_gradient

    def spy(*args, **kwargs):
        seen.append(float(kwargs["sum_sensitivity"]))
        return original(*args, **kwargs)

    monkeypatch.setattr(trainer_module, "privatize_embedding_gradient", spy)
    from dataclasses import replace

    from dpsynth.data.sources import load_table
    from dpsynth.methods.registry import get_method
    from dpsynth.privacy.accounting.plan import PrivacyTarget

    table = load_table("german-credit")
    for k in (1, 3):
        info = replace(table.info(""), unit="customer", rows_per_unit=k)
        method = get_method("dpkernel")
        config = method.config("tiny", {}, info)
        plan = method.plan(info, PrivacyTarget(5.0, 1e-5), config, ())
        trainer = method.trainer(info, config, plan, torch.device("cpu"), 0, PrivateRandomness(1))
        trainer.step(table.x[:32], table.y[:32])
    assert seen[1] == pytest.approx(3 * seen[0])
