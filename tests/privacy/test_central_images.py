"""DP central images (`dpsynth.privacy.releases.central`): the mechanism's sensitivity and noise
measured empirically, its budget split and composition with DP-SGD re-accounted with dp-accounting,
and
the warm start through the training loop (PGE), exactly once per run, resume included."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from dpsynth.privacy.accounting.dpsgd_plan import plan_poisson_gaussian
from dpsynth.privacy.accounting.events import events_to_json
from dpsynth.privacy.accounting.plan import PrivacyTarget
from dpsynth.privacy.releases.central import (
    CentralImagesPlan,
    central_plan_in,
    central_statistics,
    noisy_statistics,
    plan_dpsgd_with_central_images,
    release_central_images,
)


def _pld_epsilon(events: list[dict], delta: float) -> float:
    """ε of the events under dp-accounting's PLD accountant (an independent implementation)."""
    dp_event = pytest.importorskip("dp_accounting.dp_event")
    pld = pytest.importorskip("dp_accounting.pld.pld_privacy_accountant")
    accountant = pld.PLDAccountant()
    for event in events_to_json(events):
        if event["type"] == "gaussian":
            accountant.compose(
                dp_event.GaussianDpEvent(event["noise_multiplier"]), int(event["count"])
            )
        else:
            assert event["type"] == "poisson_gaussian", event
            accountant.compose(
                dp_event.PoissonSampledDpEvent(
                    event["sampling_rate"], dp_event.GaussianDpEvent(event["noise_multiplier"])
                ),
                int(event["steps"]),
            )
    return accountant.get_epsilon(delta)


@pytest.mark.parametrize("weight", [0.5, 1.0])
def test_sensitivity_is_sqrt_one_plus_w_squared(weight: float) -> None:
    """Removing any one record (small, huge, any class) moves the released vector by at most
    √(1 + w²) in L2, and a record above the clipping norm attains it."""
    plan = CentralImagesPlan(noise_multiplier=1.0, clip_norm=3.0, count_weight=weight)
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(40, 1, 4, 4, generator=gen) * 2 - 1
    x[:5] *= 10.0  # far above the clipping norm (norm up to 40 before clipping)
    y = torch.randint(0, 3, (40,), generator=gen)
    full = central_statistics(x, y, 3, plan)
    shifts = []
    for i in range(40):
        keep = torch.arange(40) != i
        shifts.append(float((full - central_statistics(x[keep], y[keep], 3, plan)).norm()))
    bound = math.sqrt(1.0 + weight**2)
    assert plan.sensitivity == pytest.approx(bound)
    assert max(shifts) <= bound * (1 + 1e-9)
    assert max(shifts) >= bound * (1 - 1e-6)  # a clipped record moves it by exactly Δ


def test_noise_std_and_mean_are_the_plans() -> None:
    """Released coordinates are the exact statistics plus N(0, (σΔ)²), from the generator."""
    plan = CentralImagesPlan(noise_multiplier=2.0, clip_norm=2.0, count_weight=0.5)
    x = torch.rand(30, 1, 2, 2, generator=torch.Generator().manual_seed(1)) * 2 - 1
    y = torch.arange(30) % 2
    exact = central_statistics(x, y, 2, plan)
    gen = torch.Generator().manual_seed(2)
    draws = torch.stack([noisy_statistics(x, y, 2, plan, gen) for _ in range(3000)])
    deviation = draws - exact
    assert plan.noise_std == pytest.approx(2.0 * math.sqrt(1.25))
    assert deviation.std(dim=0).mean().item() == pytest.approx(plan.noise_std, rel=0.03)
    assert deviation.mean(dim=0).abs().max().item() < 4 * plan.noise_std / math.sqrt(3000)
    # The same secret stream gives the same release (a resume redraws the same noise).
    a = release_central_images(x, y, 2, plan, torch.Generator().manual_seed(7))
    b = release_central_images(x, y, 2, plan, torch.Generator().manual_seed(7))
    assert torch.equal(a.means, b.means) and a.means.shape == (2, 1, 2, 2)
    assert float(a.means.abs().max()) <= 1.0


def test_exact_release_is_the_class_mean() -> None:
    """σ = 0 (non-private runs) with a large clip gives the class means and counts."""
    plan = CentralImagesPlan(noise_multiplier=0.0, clip_norm=100.0, count_weight=1.0)
    x = torch.rand(12, 1, 3, 3, generator=torch.Generator().manual_seed(3)) * 2 - 1
    y = torch.arange(12) % 3
    out = release_central_images(x, y, 3, plan, torch.Generator().manual_seed(0))
    for k in range(3):
        assert torch.allclose(out.means[k], x[y == k].mean(dim=0), atol=1e-6)
    assert out.counts.tolist() == [4.0, 4.0, 4.0]


@pytest.mark.parametrize(("epsilon", "share"), [(1.0, 0.2), (10.0, 0.1)])
def test_budget_split_and_composition_against_dp_accounting(epsilon: float, share: float) -> None:
    """The release gets its share; release + DP-SGD compose to the target under an
    independent accountant, and the plan's printed bound is above that reference."""
    target = PrivacyTarget(epsilon, 1e-5)
    plan = plan_dpsgd_with_central_images(
        target, 1400, 256, 50, 1.0, share=share, clip_norm=8.0, count_weight=0.5
    )
    release = central_plan_in(plan.events)
    assert release is not None and plan.events[0].annotation("mechanism") == "central_images"
    release_alone = _pld_epsilon([plan.events[0]], 1e-5)
    assert release_alone == pytest.approx(share * epsilon, rel=0.02)
    reference = _pld_epsilon(list(plan.events), 1e-5)
    assert reference <= plan.epsilon_bound * 1.001  # printed ε is an upper bound
    assert plan.epsilon_bound <= epsilon
    assert reference >= 0.97 * epsilon  # and not loose: the budget is used
    # The release was charged: DP-SGD runs at more noise than it would without it.
    alone = plan_poisson_gaussian(target, 1400, 256, 50, 1.0)
    assert plan.noise_multiplier > alone.noise_multiplier * 1.005
    assert _pld_epsilon([plan.events[1]], 1e-5) < reference


def test_progress_epsilon_includes_the_release_from_the_first_step() -> None:
    """The ε the loop shows and logs after t steps counts the release made before step 1:
    never below the release's own ε (dp-accounting's PLD), and the plan's bound at the end."""
    from dpsynth.training.progress import EpsilonCurve

    plan = plan_dpsgd_with_central_images(
        PrivacyTarget(4.0, 1e-5), 1400, 64, 400, 1.0, share=0.3, clip_norm=8.0
    )
    curve = EpsilonCurve(plan)
    release_alone = _pld_epsilon([plan.events[0]], 1e-5)
    assert curve.at(1) >= release_alone * 0.999
    steps = [1, plan.steps // 4, plan.steps // 2, plan.steps]
    shown = [curve.at(t) for t in steps]
    assert shown == sorted(shown) and shown[-1] == plan.epsilon_bound
    for t, value in zip(steps[:-1], shown[:-1], strict=True):  # an upper bound at every t
        prefix = dataclasses.replace(plan.events[1], steps=t)
        assert value >= _pld_epsilon([plan.events[0], prefix], 1e-5) * 0.999


def test_prior_spends_are_composed_in() -> None:
    """With an earlier spend on the data set, prior + release + DP-SGD fit the target."""
    prior = ({"type": "gaussian", "noise_multiplier": 3.0, "count": 1},)
    target = PrivacyTarget(6.0, 1e-5)
    plan = plan_dpsgd_with_central_images(
        target, 1400, 128, 40, 1.0, share=0.2, clip_norm=8.0, prior_events=prior
    )
    total = _pld_epsilon([*prior, *plan.events], 1e-5)
    assert total <= plan.total_epsilon_bound * 1.001 <= 6.0 * 1.001
    assert total >= 0.97 * 6.0


def test_pge_warm_start_through_the_loop_once_per_run(tmp_path) -> None:
    """A PGE run with the warm start: the ledger charges the release with the steps (total
    within the target under dp-accounting), the released means are in the checkpoint, and a
    run cut right after the warm start and resumed ends with the same weights as a straight
    one (the release is neither redone nor redrawn)."""
    from safetensors.torch import load_file

    from dpsynth import training
    from dpsynth.ledger import Ledger

    common = dict(
        method="pge",
        data="digits",
        epsilon=5.0,
        delta=1e-5,
        preset="tiny",
        device="cpu",
        seed=3,
        overrides={
            "steps": 3,
            "warm_start_share": 0.3,
            "warm_start_steps": 3,
            "warm_start_batch": 16,
            "sampler_init": "central",
        },
        privacy_seed=2**127 + 9,
    )
    training.train_run(out=tmp_path / "straight", ledger_path=tmp_path / "a.jsonl", **common)
    ledger = tmp_path / "b.jsonl"
    cut = training.train_run(out=tmp_path / "cut", ledger_path=ledger, stop_after_steps=0, **common)
    assert cut.get("interrupted")
    training.train_run(out=tmp_path / "cut", ledger_path=ledger, resume=True, **common)
    for path in (tmp_path / "a.jsonl", ledger):
        events = Ledger(path).events_for("digits")
        assert events[0].get("mechanism") == "central_images"
        assert len(events) == 2  # the release and the DP-SGD steps, one spend
        assert _pld_epsilon(events, 1e-5) <= 5.0 * 1.001

    def weights(run: str) -> dict[str, torch.Tensor]:
        return load_file(str(sorted((tmp_path / run).rglob("*.safetensors"))[-1]))

    a, b = weights("straight"), weights("cut")
    means = next(k for k in a if k.endswith("central.means"))
    assert a[means].shape == (10, 1, 8, 8)
    for key in a:
        if key.startswith("trainer/"):
            assert torch.equal(a[key], b[key]), key


def test_pge_presets_use_it_and_auto_picks_by_epsilon() -> None:
    """`small` and `small-eps1` plan the release (the latter with the larger share); `tiny`
    does not; `--preset auto` takes `small-eps1` at ε ≤ 3."""
    from dpsynth.data.images import DataInfo
    from dpsynth.methods.pge import PGEMethod

    info = DataInfo("digits", "builtin", 1437, (1, 8, 8), tuple("0123456789"), "f", "digits")
    method = PGEMethod()
    assert method.recommended_preset(info, 1.0) == "small-eps1"
    assert method.recommended_preset(info, 10.0) == "small"
    target = PrivacyTarget(1.0, 1e-5)
    shares = {}
    for preset in ("tiny", "small", "small-eps1"):
        plan = method.plan(info, target, method.config(preset, {}, info))
        release = central_plan_in(plan.events)
        shares[preset] = None if release is None else _pld_epsilon([plan.events[0]], 1e-5)
    assert shares["tiny"] is None
    assert shares["small"] == pytest.approx(0.3, rel=0.02)
    assert shares["small-eps1"] == pytest.approx(0.5, rel=0.02)


@pytest.mark.parametrize("method_name", ["pge", "psg", "dpkernel"])
@pytest.mark.parametrize("shape", [(1, 8, 8), (1, 28, 28), (3, 32, 32)])
def test_clip_zero_is_the_largest_norm_in_the_unit_box(method_name: str, shape) -> None:
    """`warm_start_clip=0` resolves to √d from the public shape (no record is clipped), for
    every backend with a warm start; an explicit clip is kept."""
    from dpsynth.data.images import DataInfo
    from dpsynth.methods.registry import get_method

    info = DataInfo("x", "builtin", 1000, shape, tuple("0123456789"), "f", "x")
    method = get_method(method_name)
    config = method.config("tiny", {"warm_start_clip": 0.0}, info)
    assert config["warm_start_clip"] == pytest.approx(math.sqrt(math.prod(shape)))
    assert math.sqrt(math.prod(shape)) >= torch.ones(shape).norm().item() - 1e-4
    assert method.config("tiny", {"warm_start_clip": 3.5}, info)["warm_start_clip"] == 3.5


def test_audit_runs_a_plan_with_the_release() -> None:
    """The white-box audit takes the release's `gaussian` event as a full-batch step."""
    from dpsynth.auditing.whitebox import mechanism_steps

    plan = plan_dpsgd_with_central_images(
        PrivacyTarget(10.0, 1e-5), 1437, 256, 100, 1.0, share=0.3, clip_norm=8.0
    )
    steps = mechanism_steps(list(plan.events))
    assert [(s.sampling_rate, s.steps) for s in steps] == [(1.0, 1), (plan.sampling_rate, 100)]


def test_gaussian_sigma_for_share_takes_its_share_of_what_is_left() -> None:
    from dpsynth.errors import BudgetExceededError
    from dpsynth.privacy.accounting.calibration import gaussian_sigma_for_share
    from dpsynth.privacy.accounting.compose import compose_epsilon

    prior = ({"type": "gaussian", "noise_multiplier": 2.0, "count": 1},)
    left = 5.0 - compose_epsilon(prior, 1e-5).epsilon
    sigma = gaussian_sigma_for_share(5.0, 1e-5, 0.4, prior)
    release = {"type": "gaussian", "noise_multiplier": sigma, "count": 1}
    assert _pld_epsilon([release], 1e-5) == pytest.approx(0.4 * left, rel=0.02)
    spent = ({"type": "gaussian", "noise_multiplier": 0.3, "count": 1},)
    with pytest.raises(BudgetExceededError, match="leaves nothing"):
        gaussian_sigma_for_share(5.0, 1e-5, 0.4, spent)
