"""`dpsynth audit` through the DP classifier's (a backend's teacher) and DPAF's windows' own
code: the training function and the aggregation functions run on canary records, and a
deliberate error in them is caught."""

from __future__ import annotations

import pytest
import torch

import dpsynth.auditing.dpaf as audit_dpaf
import dpsynth.auditing.teacher as audit_teacher
from dpsynth.auditing import planned_audit as audit_run
from dpsynth.auditing.releases import split_releases
from dpsynth.privacy.accounting.events import PoissonGaussian
from dpsynth.privacy.mechanisms.aggregation import (
    noisy_feature_sum,
    noisy_group_sums,
    private_gradient_sum,
)
from dpsynth.privacy.releases.classifier import train_private_classifier

TEACHER = ("freq", "mnist-teacher", "mnist-5k")


def _part(result, name):
    return next(p for p in result.parts if p["mechanism"].startswith(name))


def test_the_teacher_is_trained_by_its_own_function_on_the_canaries(monkeypatch):
    calls = []

    def spy(model, x, y, plan, schedule, **kwargs):
        calls.append((int(x.shape[0]), plan.steps))
        return train_private_classifier(model, x, y, plan, schedule, **kwargs)

    monkeypatch.setattr(audit_teacher, "train_private_classifier", spy)
    method, preset, data = TEACHER
    result = audit_run.run_audit(method, preset, 1.0, canaries=1000, seed=1, data=data)
    plan = audit_run.plan_for(method, preset, 1.0, data)
    teacher = next(e for e in plan.events if e.annotation("mechanism") == "dp_classifier")
    teacher_steps = teacher.steps
    assert len(calls) == 1 and 0 < calls[0][0] < 1000 and calls[0][1] == teacher_steps
    assert result.mode.startswith("white-box (dp classifier")
    assert result.verdict == "pass" and _part(result, "dp classifier")["verdict"] == "pass"


def test_the_teacher_audit_runs_ghost_clipping(monkeypatch):
    """The DP classifier's gradients go through ghost clipping (`auto` picks it for the probe's
    linear layer), so the teacher row audits that path; the DP-SGD row audits the vmap one."""
    import dpsynth.privacy.mechanisms.dpsgd as dpsgd

    modes = []
    original = dpsgd.PrivateGradient.__init__

    def spy(self, *args, **kwargs):
        original(self, *args, **kwargs)
        modes.append(self.active_mode)

    monkeypatch.setattr(dpsgd.PrivateGradient, "__init__", spy)
    method, preset, data = TEACHER
    audit_run.run_audit(method, preset, 1.0, canaries=300, seed=0, data=data)
    assert modes == ["ghost"]
    modes.clear()
    audit_run.run_audit("pge", "tiny", 1.0, canaries=300, seed=0)
    assert modes and set(modes) == {"vmap"}


@pytest.mark.parametrize("broken", ["noise:4", "clip:4"])
def test_a_wrong_noise_or_clip_in_the_teacher_is_caught(broken):
    method, preset, data = TEACHER
    result = audit_run.run_audit(
        method, preset, 1.0, canaries=2000, seed=3, data=data, break_mode=broken
    )
    part = _part(result, "dp classifier")
    assert part["lower_bound"] > part["claimed_epsilon"] and result.verdict == "FAIL"


def test_the_teacher_probe_reads_each_canary_on_its_own_coordinate():
    """A canary always sampled (q = 1) with almost no noise shows C on its coordinate only."""
    event = PoissonGaussian(
        1e-6, 1.0, 2, annotations={"mechanism": "dp_classifier", "max_grad_norm": 0.5}
    )
    included = torch.tensor([True, False, True, False])
    scores = audit_teacher.classifier_scores(event, (1, 8, 8), included, torch.Generator())
    peak = scores["max"] * 1e-6 * 0.5  # back to the released value
    assert torch.allclose(peak, torch.tensor([0.5, 0.0, 0.5, 0.0], dtype=torch.float64), atol=1e-6)


def test_dpaf_windows_run_through_the_aggregation_functions(monkeypatch):
    calls = {"agg": 0, "conv2": 0}

    def agg(*args, **kwargs):
        calls["agg"] += 1
        return noisy_feature_sum(*args, **kwargs)

    def conv2(*args, **kwargs):
        calls["conv2"] += 1
        return private_gradient_sum(*args, **kwargs)

    monkeypatch.setattr(audit_dpaf, "noisy_feature_sum", agg)
    monkeypatch.setattr(audit_dpaf, "private_gradient_sum", conv2)
    plan = audit_run.plan_for("dpaf", "tiny", 1.0, "digits")
    releases, rest = split_releases(plan.events)
    (window,) = releases
    result = audit_run.run_audit("dpaf", "tiny", 1.0, canaries=500, seed=1)
    windows = window.annotation("window")
    assert calls == {"agg": windows * window.steps, "conv2": window.steps}
    assert rest and result.mode == "white-box (dpaf windows + dpsgd)"
    assert result.verdict == "pass"


def test_dpaf_small_passes():
    result = audit_run.run_audit("dpaf", "small", 1.0, canaries=1000, seed=2)
    assert result.verdict == "pass" and result.lower_bound <= result.claimed_epsilon


@pytest.mark.parametrize("broken", ["noise:4", "sensitivity:4"])
def test_a_wrong_noise_or_bound_in_dpaf_aggregation_is_caught(broken):
    result = audit_run.run_audit("dpaf", "small", 1.0, canaries=1000, seed=2, break_mode=broken)
    part = _part(result, "dpaf windows")
    assert part["lower_bound"] > part["claimed_epsilon"] and result.verdict == "FAIL"


def test_dpaf_released_once_runs_through_noisy_group_sums_and_a_loose_bound_is_caught(
    monkeypatch,
):
    calls = []

    def spy(rows, groups, num_groups, bound, noise_multiplier, generator):
        calls.append((int(rows.shape[0]), num_groups))
        return noisy_group_sums(rows, groups, num_groups, bound, noise_multiplier, generator)

    monkeypatch.setattr(audit_dpaf, "noisy_group_sums", spy)
    sound = audit_run.run_audit("dpaf", "mnist", 1.0, canaries=3000, seed=0, data="mnist-5k")
    assert len(calls) == 1 and 0 < calls[0][0] < 3000 and calls[0][1] == 3000
    assert sound.mode == "white-box (dpaf release + dpsgd)" and sound.verdict == "pass"
    broken = audit_run.run_audit(
        "dpaf", "mnist", 1.0, canaries=3000, seed=0, data="mnist-5k", break_mode="sensitivity:4"
    )
    part = _part(broken, "dpaf release")
    assert part["lower_bound"] > part["claimed_epsilon"] and broken.verdict == "FAIL"
