"""DPAF `phase2_release=once`: phase 2 as ONE Gaussian release of the whole data set's
per-class feature sums, after phase 1, followed by generator steps that read no data.

Checked here: the grouped sum's sensitivity on neighbouring data sets and its noise, the plan
(phase 1 + one Gaussian, re-accounted with dp-accounting's PLD within the printed ε), that the
trainer releases exactly once at the phase boundary and reads no batch after it, and that a
run cut at the release resumes to the straight run's weights and ledger.
"""

from __future__ import annotations

import math

import pytest
import torch
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant

from dpsynth.data.images import DataInfo
from dpsynth.errors import UsageError
from dpsynth.methods.base import PrivacyTarget
from dpsynth.methods.dpaf import DPAFMethod
from dpsynth.methods.dpaf.plan import ONCE_PHASE
from dpsynth.privacy.accounting.events import events_to_json
from dpsynth.privacy.mechanisms.aggregation import noisy_group_sums, renorm_rows
from dpsynth.privacy.mechanisms.randomness import PrivateRandomness
from tests.methods.dpaf.test_dpaf_match import INFO, _digits, straight_and_cut_runs
from tests.noise_checks import assert_gaussian_noise

ONCE = {
    "g_loss": "match",
    "class_aggregates": True,
    "train_conv2": False,
    "window": 1,
    "count_feature": 4.0,
    "g_batch": 20,
    "phase2_release": "once",
}


def _trainer(epsilon: float, seed: int = 0, **overrides):
    method = DPAFMethod()
    config = method.config("tiny", {**ONCE, **overrides}, INFO)
    plan = method.plan(INFO, PrivacyTarget(epsilon, 1e-5), config)
    trainer = method.trainer(INFO, config, plan, torch.device("cpu"), 0, PrivateRandomness(seed))
    return config, plan, trainer


def test_group_sums_move_by_at_most_the_bound_between_neighbours():
    gen = torch.Generator().manual_seed(0)
    rows = 3.0 * torch.randn(50, 12, generator=gen)  # many rows above the bound
    groups = torch.randint(4, (50,), generator=gen)
    bound = 2.5
    full = noisy_group_sums(rows, groups, 4, bound, 0.0, torch.Generator())
    for i in range(50):  # remove record i: only its group moves, by its renormed row
        keep = torch.arange(50) != i
        neighbour = noisy_group_sums(rows[keep], groups[keep], 4, bound, 0.0, torch.Generator())
        difference = full - neighbour
        assert float(difference.norm()) <= bound * (1 + 1e-5)
        others = torch.arange(4) != groups[i]
        assert float(difference[others].abs().max()) < 1e-5
        torch.testing.assert_close(difference[groups[i]], renorm_rows(rows[i : i + 1], bound)[0])


def test_group_sums_noise_is_sigma_times_the_bound_from_the_generator():
    bound, sigma = 3.0, 0.7
    released = noisy_group_sums(
        torch.zeros(0, 500), torch.zeros(0), 10, bound, sigma, torch.Generator().manual_seed(5)
    )
    assert released.shape == (10, 500)
    assert_gaussian_noise(released.flatten(), sigma * bound)
    again = noisy_group_sums(
        torch.zeros(0, 500), torch.zeros(0), 10, bound, sigma, torch.Generator().manual_seed(5)
    )
    assert torch.equal(released, again)


def test_once_plan_is_phase1_and_one_gaussian_within_epsilon_under_pld():
    config, plan, trainer = _trainer(4.0)
    phase1, release = events_to_json(plan.events)
    assert phase1["type"] == "poisson_gaussian" and phase1["steps"] == config["c_steps"]
    assert release["type"] == "gaussian" and release["phase"] == ONCE_PHASE
    assert trainer.once_sigma == release["noise_multiplier"] > 0
    assert trainer.c_sigma == plan.noise_multiplier == phase1["noise_multiplier"]
    assert plan.steps == config["c_steps"] + config["windows"]
    assert plan.epsilon_bound <= 4.0
    accountant = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-3)
    accountant.compose(
        dp_event.PoissonSampledDpEvent(
            phase1["sampling_rate"], dp_event.GaussianDpEvent(phase1["noise_multiplier"])
        ),
        phase1["steps"],
    )
    accountant.compose(dp_event.GaussianDpEvent(release["noise_multiplier"]))
    assert accountant.get_epsilon(plan.delta) <= plan.epsilon_bound
    # without phase 1 the release takes the whole ε
    _, alone, _ = _trainer(4.0, conv1_init="random")
    (only,) = events_to_json(alone.events)
    assert only["type"] == "gaussian" and only["noise_multiplier"] < release["noise_multiplier"]
    assert 3.9 < alone.epsilon_bound <= 4.0


def test_once_needs_the_frozen_matching_setup():
    with pytest.raises(UsageError, match="phase2_release=once"):
        DPAFMethod().config("tiny", {**ONCE, "train_conv2": True}, INFO)
    with pytest.raises(UsageError, match="release_share"):
        DPAFMethod().config("tiny", {**ONCE, "release_share": 1.0}, INFO)


def test_trainer_releases_once_at_the_boundary_and_reads_no_batch_after(one_torch_thread):
    config, _, trainer = _trainer(math.inf)  # no noise: the release is the exact class sums
    x, y = _digits(60)
    c_steps = config["c_steps"]
    assert [trainer.reads_batch(s) for s in range(c_steps + 2)] == [True] * c_steps + [False] * 2
    for step in range(c_steps):
        trainer.release_whole_data(step, x, y)
        assert not bool(trainer.released_sum.any())
        trainer.step(x[:16], y[:16])
    trainer.release_whole_data(c_steps, x, y)
    blocks = trainer.released_sum.view(10, -1)
    counts = torch.bincount(y, minlength=10).float()
    torch.testing.assert_close(blocks[:, -1] / config["count_feature"], counts)
    with torch.no_grad():
        h = trainer.features(x, torch.nn.functional.one_hot(y, 10).float())
    torch.testing.assert_close(blocks[3, :-1], h[y == 3].sum(0), rtol=1e-5, atol=1e-4)
    released = trainer.released_sum.clone()
    g_before = [p.clone() for p in trainer.net_g.parameters()]
    stats = trainer.step(x[:0], y[:0])  # phase 2: generator steps on the release only
    assert math.isfinite(stats["g_loss"])
    assert any(
        not torch.equal(a, b) for a, b in zip(g_before, trainer.net_g.parameters(), strict=True)
    )
    trainer.release_whole_data(c_steps + 1, x, y)  # no second release
    assert torch.equal(trainer.released_sum, released)


def test_once_run_cut_at_the_release_resumes_to_the_straight_run(tmp_path, one_torch_thread):
    from dpsynth.ledger import Ledger

    # tiny: c_steps = 2, so the cut run stops just before the release
    straight, cut, resumed, a, b = straight_and_cut_runs(
        tmp_path, {**ONCE, "windows": 5}, cut_after=2, privacy_seed=31
    )
    assert float(straight["epsilon"]) <= 4.0
    spend = Ledger(tmp_path / "straight.jsonl").spend(straight["ledger_seq"])
    assert [e["type"] for e in spend["events"]] == ["poisson_gaussian", "gaussian"]
    assert cut["interrupted"]
    assert resumed["ledger_status"] == "completed"
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=0, msg=key)


def test_the_anchor_check_counts_only_the_reading_steps():
    from dpsynth.errors import AnchorError
    from dpsynth.privacy.accounting.plan_check import check_plan_parameters

    _, plan, _ = _trainer(4.0)
    kwargs = dict(
        private=True,
        noise_multiplier=plan.noise_multiplier,
        sampling_rate=plan.sampling_rate,
        run_name="run",
    )
    check_plan_parameters(plan.events, steps=plan.steps, **kwargs)
    for edited in (plan.steps + 1, plan.steps - 1):  # an edited T in config.json is refused
        with pytest.raises(AnchorError, match="does not match"):
            check_plan_parameters(plan.events, steps=edited, **kwargs)
    for bad in ("5", -1, 2.5):
        events = [*plan.events[:-1], {**plan.events[-1].to_json(), "loop_steps_without_reads": bad}]
        with pytest.raises(AnchorError, match="whole number"):
            check_plan_parameters(events, steps=plan.steps, **kwargs)


def test_progress_epsilon_counts_the_one_off_release_from_the_first_step():
    from dpsynth.privacy.accounting.compose import compose_epsilon
    from dpsynth.training.progress import EpsilonCurve

    _, plan, _ = _trainer(4.0)
    release = plan.events[-1]
    curve = EpsilonCurve(plan)
    assert curve.at(1) >= compose_epsilon([release], plan.delta).epsilon
    assert curve.at(plan.steps) == plan.epsilon_bound


def test_28x28_gets_the_curriculum_presets_and_mnist_still_releases_once():
    mnist = DataInfo(
        spec="mnist-5k",
        kind="images",
        n=4000,
        shape=(1, 28, 28),
        classes=tuple(str(c) for c in range(10)),
        fingerprint="test",
        dataset_id="mnist-5k",
    )
    method = DPAFMethod()
    assert method.recommended_preset(mnist, 10.0) == "mnist-freq"
    assert method.recommended_preset(mnist, math.inf) == "mnist-freq"
    assert method.recommended_preset(mnist, 1.0) == "mnist-freq-eps1"  # pooled covariance
    assert method.recommended_preset(INFO, 10.0) == "small"
    assert method.recommended_preset(INFO, 1.0) == "small"
    config = method.config("mnist", {}, mnist)
    plan = method.plan(mnist, PrivacyTarget(10.0, 1e-5), config)
    assert [e.kind for e in plan.events] == ["poisson_gaussian", "gaussian"]
    assert plan.events[-1].annotation("loop_steps_without_reads") == config["windows"]
    assert plan.epsilon_bound <= 10.0
    # The curriculum: the frequency model's release first, then phase 1 and the one release,
    # all composed to the target.
    for preset in ("mnist-freq", "mnist-freq-eps1"):
        config = method.config(preset, {}, mnist)
        plan = method.plan(mnist, PrivacyTarget(10.0, 1e-5), config)
        assert config["phase2_release"] == "once"
        assert config["frequency_share"] > 0
        assert [e.kind for e in plan.events][-2:] == ["poisson_gaussian", "gaussian"]
        assert len(plan.events) > 2  # the frequency model's own events come first
        assert plan.epsilon_bound <= 10.0
