"""`dpsynth audit`: the one-run bound's statistics; the white-box audit's soundness and power."""

from __future__ import annotations

import itertools
import json
import math

import pytest
import torch
from scipy.stats import binom
from typer.testing import CliRunner

import dpsynth.privacy.mechanisms.per_record as per_record
from dpsynth.auditing import planned_audit as audit_run
from dpsynth.auditing.bound import epsilon_lower_bound, p_value
from dpsynth.auditing.functional import canary_block
from dpsynth.auditing.whitebox import mechanism_steps
from dpsynth.cli import app
from dpsynth.errors import UsageError
from dpsynth.methods.recommend import recommend_method
from dpsynth.methods.registry import get_method, method_names
from dpsynth.privacy.accounting.compose import poisson_gaussian_event
from dpsynth.privacy.accounting.dpsgd_plan import plan_poisson_gaussian
from dpsynth.privacy.accounting.events import NonPrivate, PureDp
from dpsynth.privacy.accounting.plan import PrivacyTarget
from dpsynth.privacy.mechanisms.functional import derivative_kernel_covariance

runner = CliRunner()


def _direct_tail(guesses: int, correct: int, accuracy: float) -> float:
    """P[Binomial(guesses, accuracy) ≥ correct] summed term by term."""
    return sum(
        math.comb(guesses, j) * accuracy**j * (1 - accuracy) ** (guesses - j)
        for j in range(correct, guesses + 1)
    )


def _direct_p_value(m: int, guesses: int, correct: int, eps: float, delta: float) -> float:
    """Theorem 5.2's p-value computed by the plain double loop of the paper's algorithm."""
    accuracy = math.exp(eps) / (1 + math.exp(eps))
    pmf = [
        math.comb(guesses, j) * accuracy**j * (1 - accuracy) ** (guesses - j)
        for j in range(guesses + 1)
    ]
    alpha = max(sum(pmf[correct - i : correct]) / i for i in range(1, correct + 1))
    return min(1.0, _direct_tail(guesses, correct, accuracy) + 2 * m * delta * alpha)


@pytest.mark.parametrize(
    ("m", "guesses", "correct", "eps", "delta"),
    [
        (100, 40, 30, 0.5, 0.0),
        (100, 40, 40, 2.0, 0.0),
        (1000, 60, 50, 1.0, 1e-5),
        (50, 20, 11, 0.1, 1e-3),
    ],
)
def test_p_value_matches_a_direct_binomial_computation(m, guesses, correct, eps, delta):
    assert p_value(m, guesses, correct, eps, delta) == pytest.approx(
        _direct_p_value(m, guesses, correct, eps, delta), rel=1e-9, abs=1e-15
    )


def test_lower_bound_is_the_largest_rejected_epsilon():
    m, guesses, correct, beta = 2000, 100, 90, 0.05
    lb = epsilon_lower_bound(m, guesses, correct, 0.0, 1 - beta)
    # Pure ε: the bound is where the binomial tail crosses β.
    assert _direct_tail(guesses, correct, 1 / (1 + math.exp(-lb))) < beta
    assert _direct_tail(guesses, correct, 1 / (1 + math.exp(-(lb + 1e-3)))) >= beta
    assert binom.sf(correct - 1, guesses, 1 / (1 + math.exp(-lb))) < beta


def test_lower_bound_is_monotone_and_zero_without_evidence():
    bounds = [epsilon_lower_bound(5000, 200, v, 1e-5, 0.95) for v in range(100, 201, 10)]
    assert bounds[0] == 0.0  # half right: a coin flip proves nothing
    assert all(a <= b for a, b in itertools.pairwise(bounds))
    assert bounds[-1] > 3.0
    # More confidence or more δ can only lower the bound.
    assert epsilon_lower_bound(5000, 200, 190, 1e-5, 0.99) < epsilon_lower_bound(
        5000, 200, 190, 1e-5, 0.95
    )
    assert epsilon_lower_bound(5000, 200, 190, 1e-3, 0.95) < epsilon_lower_bound(
        5000, 200, 190, 0.0, 0.95
    )


def test_bad_counts_are_a_usage_error():
    with pytest.raises(UsageError):
        p_value(10, 5, 6, 1.0, 0.0)
    with pytest.raises(UsageError):
        epsilon_lower_bound(10, 5, 3, 0.0, 1.0)


def _audit(*args: str) -> tuple[int, dict]:
    result = runner.invoke(
        app, ["audit", "--method", "pge", "--preset", "tiny", "--epsilon", "1", *args, "--json"]
    )
    return result.exit_code, json.loads(result.stdout)


def test_sound_pge_tiny_passes():
    code, out = _audit("--canaries", "3000", "--seed", "11")
    assert code == 0
    assert out["verdict"] == "pass"
    assert 0.0 <= out["lower_bound"] <= out["claimed_epsilon"] <= 1.0
    assert out["mode"] == "white-box (dpsgd)" and out["broken"] is None
    assert out["canaries"] == 3000 and 0 < out["guesses"] <= 3000
    assert "no user data is read" in out["note"]


@pytest.mark.parametrize("broken", ["noise:4", "clip:4"])
def test_broken_pge_tiny_fails(broken):
    code, out = _audit("--canaries", "3000", "--seed", "12", "--break", broken)
    assert code == 1
    assert out["verdict"] == "FAIL" and out["broken"] == broken
    assert out["lower_bound"] > out["claimed_epsilon"]


def test_the_audit_runs_the_privacy_layers_own_clipping(monkeypatch):
    """A bug in the per-record clipping (not the audit's --break switch) is caught."""
    monkeypatch.setattr(
        per_record, "_clip_factors", lambda norms, max_norm: norms.new_ones(norms.shape)
    )
    result = audit_run.run_audit("pge", "tiny", 1.0, canaries=3000, seed=13)
    assert result.broken is None
    assert result.lower_bound > result.claimed_epsilon


def test_every_registered_method_audits_or_says_why_not():
    for name in method_names():
        try:
            result = audit_run.run_audit(name, "tiny", 1.0, canaries=1000, seed=14)
        except UsageError as exc:
            assert "audit" in str(exc), f"{name}: {exc}"
            continue
        assert result.method == name
        assert result.lower_bound <= result.claimed_epsilon, name
        plan = audit_run.plan_for(name, "tiny", 1.0, "digits")
        assert plan.events == result.events
        assert result.to_json()["events"] == [e.to_json() for e in plan.events]


def test_a_new_backend_joins_through_its_plan(monkeypatch):
    """The audit uses whatever events a registered backend's plan lists: a plan that claims
    ε ≈ 1 but whose event carries a quarter of the noise is caught."""
    pge = get_method("pge")

    class UnderNoised(type(pge)):
        def plan(self, info, target, config, prior_events=()):
            honest = plan_poisson_gaussian(
                target=target,
                n=info.n,
                expected_batch_size=float(config["batch_size"]),
                steps=int(config["steps"]),
                max_grad_norm=float(config["max_grad_norm"]),
            )
            event = honest.events[0]
            weak = poisson_gaussian_event(
                event.noise_multiplier / 4, event.sampling_rate, event.steps
            )
            return type(honest)(**{**honest.__dict__, "events": (weak,)})

    monkeypatch.setattr(audit_run, "get_method", lambda name: UnderNoised())
    result = audit_run.run_audit("new", "tiny", 1.0, canaries=3000, seed=15)
    assert result.lower_bound > result.claimed_epsilon


def test_events_the_audit_cannot_run_are_named():
    with pytest.raises(UsageError, match="'pure_dp'"):
        mechanism_steps([PureDp(0.5, 1)])
    with pytest.raises(UsageError, match="'non_private'"):
        mechanism_steps([NonPrivate()])
    assert mechanism_steps([poisson_gaussian_event(1.0, 0.1, 3)])[0].steps == 3


def test_black_box_of_an_image_method_needs_a_built_in_image_set():
    result = runner.invoke(
        app,
        ["audit", "--method", "pge", "--epsilon", "1", "--black-box", "--data", "german-credit"],
    )
    assert result.exit_code == 2
    assert "built-in set" in result.output


def test_target_must_be_private():
    assert PrivacyTarget(math.inf, 1e-5).private is False
    result = runner.invoke(app, ["audit", "--method", "pge", "--epsilon", "inf"])
    assert result.exit_code == 2
    assert "nothing to audit" in result.output


def test_dpkernel_is_audited_through_its_functional_mechanism():
    """DP-Kernel's released gradient field with σ/2 inside the audit is caught at ε = 1 by the
    trials test (the sound run passes in the registry test above)."""
    broken = audit_run.run_audit(
        "dpkernel", "tiny", 1.0, canaries=50_000, seed=0, break_mode="noise:2"
    )
    assert broken.mode == "white-box (functional)"
    # each test on its own catches it: the trials test and the family test
    assert broken.trials is not None and broken.trials["lower_bound"] > broken.claimed_epsilon
    assert broken.family is not None and broken.family["lower_bound"] > broken.claimed_epsilon
    assert broken.family["factor"] > 1.0


def test_the_functional_audit_sees_most_of_the_sensitivity():
    """The canary's field, whitened by the derivative-GP covariance, carries most of the RKHS
    norm √n_L a record can have (so the audit is not weak by construction), and never more."""
    bandwidths = (4.0, 8.0, 16.0)
    points, field, whitened = canary_block(bandwidths)
    strength = float(field @ whitened)
    assert 0.9 * len(bandwidths) < strength <= len(bandwidths)
    assert torch.allclose(
        derivative_kernel_covariance(points, None, bandwidths) @ whitened, field, atol=1e-10
    )


def test_audit_is_listed_with_its_options():
    help_text = runner.invoke(app, ["audit", "--help"]).output
    assert "--break" in help_text and "--canaries" in help_text and "--runs" in help_text
    assert "audit" in runner.invoke(app, ["--help"]).output


def test_auto_audits_what_train_would_pick_for_the_data_and_epsilon():
    """`--method auto --preset auto` audits the method and preset `train`'s auto rule picks on
    the built-in's public description, at each ε (psg's preset on digits differs between ε = 1
    and 10; `--method auto` picks dpkernel's `small-eps1` at both)."""
    info = audit_run.public_info("digits")
    picks = {eps: audit_run.resolve_auto("auto", "auto", eps, "digits") for eps in (1.0, 10.0)}
    for eps, (name, preset) in picks.items():
        assert name == recommend_method(info, eps)
        assert preset == get_method(name).recommended_preset(info, eps)
    assert picks[1.0] == picks[10.0] == ("dpkernel", "small-eps1")
    psg = {eps: audit_run.resolve_auto("psg", "auto", eps, "digits") for eps in (1.0, 10.0)}
    assert psg[1.0] == ("psg", "small-eps1") and psg[10.0] == ("psg", "small")
    assert audit_run.resolve_auto("auto", "tiny", 10.0, "digits") == (picks[10.0][0], "tiny")
    assert audit_run.resolve_auto("psg", "auto", 1.0, "digits")[0] == "psg"
    result = runner.invoke(
        app,
        [
            "audit",
            "--method",
            "auto",
            "--preset",
            "auto",
            "--epsilon",
            "1",
            "--canaries",
            "1000",
            "--seed",
            "3",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert (out["method"], out["preset"]) == picks[1.0]
    assert out["lower_bound"] <= out["claimed_epsilon"] <= 1.0


def test_the_audit_noise_comes_from_the_audit_seed():
    """Each step's noise is drawn from the audit's own stream: two seeds give different
    releases, one seed the same (a fresh `torch.Generator()` per step gave every step and every
    --seed the same first noise vector)."""
    from dpsynth.auditing.whitebox import MechanismStep, canary_scores

    steps = [MechanismStep(1.0, 1.0, 1), MechanismStep(1.0, 1.0, 1)]
    included = torch.zeros(64, dtype=torch.bool)  # no canary in: the scores are noise only

    def scores(seed: int) -> torch.Tensor:
        return canary_scores(steps, 1.0, included, torch.Generator().manual_seed(seed))["llr"]

    assert torch.equal(scores(1), scores(1))
    assert not torch.allclose(scores(1), scores(2))


@pytest.mark.parametrize("break_mode", [None, "clip:2"])
def test_the_ghost_and_vmap_paths_release_the_same_noisy_sums(break_mode):
    """The audit's two `PrivateGradient` paths (per-record gradients, ghost norms) draw the same
    noise from one seed and clip the canaries alike, so their scores agree to float32 rounding;
    the ghost path is the one a plan's steps behind a release take."""
    from dpsynth.auditing.whitebox import MechanismStep, canary_scores

    steps = [MechanismStep(1.5, 0.3, 6)]
    included = torch.rand(200, generator=torch.Generator().manual_seed(4)) < 0.5

    def scores(mode: str) -> dict[str, torch.Tensor]:
        generator = torch.Generator().manual_seed(9)
        return canary_scores(steps, 0.5, included, generator, break_mode, grad_mode=mode)

    ghost, vmap = scores("ghost"), scores("vmap")
    for name in ("llr", "max"):
        assert torch.allclose(ghost[name], vmap[name], atol=1e-5)
    assert float(ghost["llr"][included].mean()) > float(ghost["llr"][~included].mean())


def test_full_batch_events_score_without_a_math_domain_error():
    """q = 1 (the frequency model's full-batch release) is the unmixed ratio, not log1p(−1)."""
    from dpsynth.auditing.whitebox import mixture_log_ratio

    ratio = torch.tensor([-1.0, 0.0, 2.5], dtype=torch.float64)
    assert torch.equal(mixture_log_ratio(ratio, 1.0), ratio)
    half = mixture_log_ratio(ratio, 0.5)
    assert torch.allclose(half, torch.log(0.5 + 0.5 * torch.exp(ratio)))


def test_runs_pool_into_the_trials_test_and_a_two_fold_error_is_caught():
    """5,000 canaries × 20 runs = 100,000 trials: the trials test judges; pge tiny with σ/2 at
    ε = 1 fails (its bound about 1.6) and the sound run passes, from the CLI."""
    code, out = _audit("--canaries", "5000", "--runs", "20", "--seed", "3", "--break", "noise:2")
    assert code == 1 and out["runs"] == 20
    assert out["trials"]["trials_in"] + out["trials"]["trials_out"] == 100_000 - 100_000 // 8
    # each test on its own sees the error
    assert out["trials"]["lower_bound"] > out["claimed_epsilon"]
    assert out["family"]["lower_bound"] > out["claimed_epsilon"]
    code, out = _audit("--canaries", "5000", "--runs", "20", "--seed", "3")
    assert code == 0 and out["lower_bound"] <= out["claimed_epsilon"]
    assert out["trials"]["lower_bound"] <= out["family"]["lower_bound"] <= out["claimed_epsilon"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--runs", "0"), "--runs must be a positive integer"),
        (("--break", "noise:one"), "the factor must be a number"),
        (("--break", "noise:0.5"), "the factor must be a finite number above 1"),
        (("--break", "delta:2"), "--break must be one of"),
    ],
)
def test_bad_runs_and_break_factors_are_refused(args, message):
    result = runner.invoke(
        app, ["audit", "--method", "pge", "--preset", "tiny", "--epsilon", "1", *args]
    )
    assert result.exit_code == 2 and message in result.output


def test_set_audits_the_plan_you_train():
    """`--set` reaches the plan as `train --set` does: a central-images share adds that release
    (audited through its own code, judged against its own claim), and the JSON says so."""
    result = runner.invoke(
        app,
        ["audit", "--method", "dpkernel", "--epsilon", "1", "--canaries", "500", "--seed", "0",
         "--set", "warm_start_share=0.5", "--json"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert payload["overrides"] == ["warm_start_share=0.5"]
    assert payload["mode"] == "white-box (central images + functional)"
    (part,) = payload["parts"]
    assert part["claimed_epsilon"] < payload["claimed_epsilon"]
    plain = audit_run.run_audit("dpkernel", "tiny", 1.0, canaries=500, seed=0)
    assert plain.mode == "white-box (functional)" and plain.overrides == ()
