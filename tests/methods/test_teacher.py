"""The DP teacher shared by backends (`methods.blocks`): its plan, training hook and filter."""

from __future__ import annotations

import math

import pytest
import torch
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.privacy_accountant import NeighboringRelation
from torch import nn

from dpsynth.data.images import DataInfo
from dpsynth.errors import UsageError
from dpsynth.methods.base import Generator
from dpsynth.methods.blocks import (
    TEACHER_DEFAULTS,
    Teacher,
    TeacherFilter,
    check_teacher_config,
    plan_with_stages,
    teacher_from_state,
)
from dpsynth.privacy.accounting.compose import compose_epsilon
from dpsynth.privacy.accounting.dpsgd_plan import plan_poisson_gaussian
from dpsynth.privacy.accounting.events import events_to_json
from dpsynth.privacy.accounting.plan import PrivacyTarget
from dpsynth.privacy.mechanisms.randomness import PrivateRandomness

INFO = DataInfo("test", "test", 200, (1, 8, 8), ("a", "b", "c"), "f" * 64, "d")


def _config(**over) -> dict:
    return {**TEACHER_DEFAULTS, "teacher_batch": 40, "teacher_epochs": 2.0, **over}


def _rest(goal=PrivacyTarget(2.0, 1e-5), prior=()):
    return plan_poisson_gaussian(goal, 200, 20, 100, 1.0, prior)


def _pld(events: list[dict], delta: float) -> float:
    accountant = pld_privacy_accountant.PLDAccountant(
        neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE,
        value_discretization_interval=1e-4,
    )
    for e in events_to_json(events):
        gaussian = dp_event.GaussianDpEvent(e["noise_multiplier"])
        accountant.compose(dp_event.PoissonSampledDpEvent(e["sampling_rate"], gaussian), e["steps"])
    return accountant.get_epsilon(delta)


def test_the_teacher_fills_what_the_backend_leaves_and_everything_composes_under_the_target():
    target = PrivacyTarget(2.0, 1e-5)
    plan = plan_with_stages(INFO, target, _config(teacher_share=0.5), (), _rest)
    teacher, loop = events_to_json(plan.events)
    assert teacher["mechanism"] == "dp_classifier" and teacher["steps"] == 10
    assert teacher["sampling_rate"] == pytest.approx(0.2)
    # The backend alone plans for half of ε; the teacher takes the rest up to ε, which is
    # more than the other half (composition is not addition); both under ε, by ours and PLD.
    assert compose_epsilon([loop], 1e-5).epsilon == pytest.approx(1.0, rel=0.01)
    assert compose_epsilon([teacher], 1e-5).epsilon > 1.1
    assert 1.98 <= plan.epsilon_bound <= 2.0 and plan.total_epsilon_bound <= 2.0
    assert plan.target_epsilon == 2.0
    assert _pld([teacher, loop], 1e-5) <= 2.0 * 1.002
    assert loop["noise_multiplier"] > _rest().noise_multiplier
    assert plan.noise_multiplier == loop["noise_multiplier"]
    # Without a share the backend's plan is untouched.
    assert plan_with_stages(INFO, target, _config(), (), _rest) == _rest()
    # An earlier spend on the data set is composed in.
    prior = ({"type": "gaussian", "noise_multiplier": 4.0, "count": 1},)
    after = plan_with_stages(INFO, target, _config(teacher_share=0.5), prior, _rest)
    assert after.total_epsilon_bound <= 2.0
    assert compose_epsilon([*prior, *after.events], 1e-5).epsilon <= 2.0


def test_teacher_settings_are_checked_before_anything_is_spent():
    check_teacher_config(_config())
    check_teacher_config(_config(teacher_share=0.3))
    for bad in (
        {"teacher_share": 1.0},
        {"teacher_share": 0.3, "teacher_filter": "vote"},
        {"teacher_share": 0.3, "teacher_oversample": 0.5},
        {"teacher_share": 0.3, "teacher_lr": 0.0},
    ):
        with pytest.raises(UsageError):
            check_teacher_config(_config(**bad))


def test_the_teacher_trains_once_at_step_zero_and_round_trips():
    target = PrivacyTarget(3.0, 1e-5)
    config = _config(teacher_share=0.5)
    plan = plan_with_stages(INFO, target, config, (), _rest)
    teacher = Teacher(INFO, config, plan, torch.device("cpu"), 0, PrivateRandomness(5))
    assert teacher.active
    before = {k: v.clone() for k, v in teacher.state_tensors().items()}
    x = torch.rand(200, 1, 8, 8) * 2 - 1
    y = torch.randint(0, 3, (200,))
    teacher.release_whole_data(1, x, y)  # not step 0: nothing read
    assert all(torch.equal(before[k], v) for k, v in teacher.state_tensors().items())
    teacher.release_whole_data(0, x, y)
    state = teacher.state_tensors()
    assert int(state["teacher_trained"]) == 1
    assert any(not torch.equal(before[k], state[k]) for k in before if k != "teacher_trained")
    # a resumed trainer restores it and does not train again
    again = Teacher(INFO, config, plan, torch.device("cpu"), 0, PrivateRandomness(6))
    again.load_state_tensors(state)
    again.release_whole_data(0, x, y)
    assert all(torch.equal(state[k], v) for k, v in again.state_tensors().items())
    # no teacher in the plan: inactive, nothing saved
    none = Teacher(INFO, _config(), _rest(), torch.device("cpu"), 0, PrivateRandomness(7))
    assert not none.active and none.state_tensors() == {}


class _Fixed(Generator):
    """Candidates whose single pixel value encodes the class a 'teacher' will read."""

    def __init__(self) -> None:
        self.classes = ("a", "b", "c")
        self.shape = (1, 8, 8)
        self.device = torch.device("cpu")
        self.truncation = 1.0
        self.calls: list[torch.Tensor] = []

    def sample(self, labels, batch_size, generator):
        self.calls.append(labels.clone())
        # candidate i has value i (mod 256): the teacher below prefers larger values for c
        values = torch.arange(len(labels)) % 256
        yield values.view(-1, 1, 1, 1).expand(-1, 1, 8, 8).to(torch.uint8)


class _ByBrightness(nn.Module):
    """p(class 0) grows with the brightness, p(class 1) falls with it, class 2 never."""

    def forward(self, x):
        mean = x.mean(dim=(1, 2, 3))
        return torch.stack([10 * mean, -10 * mean, torch.full_like(mean, -100.0)], dim=1)


def test_the_filter_keeps_for_each_label_the_candidates_the_teacher_rates_highest():
    base = _Fixed()
    config = _config(teacher_share=0.3, teacher_oversample=3.0, teacher_filter="rank")
    filtered = TeacherFilter(base, _ByBrightness(), config)
    labels = torch.tensor([0, 0, 1, 1])
    (out,) = list(filtered.sample(labels, 10, torch.Generator().manual_seed(0)))
    assert len(base.calls[0]) == 12  # 3 candidates per requested image
    assert torch.equal(base.calls[0][:4], labels)  # rank: the requested labels, repeated
    values = out[:, 0, 0, 0].tolist()
    assert values[:2] == [11, 10]  # the brightest two for class 0
    assert values[2:] == [0, 1]  # the darkest two for class 1, never one already taken
    filtered.truncation = 0.5  # `sample --truncation` reaches the backend's latent
    assert base.truncation == 0.5 and filtered.truncation == 0.5
    relabel = TeacherFilter(_Fixed(), _ByBrightness(), {**config, "teacher_filter": "relabel"})
    list(relabel.sample(labels, 10, torch.Generator().manual_seed(0)))
    assert set(relabel.base.calls[0].tolist()) == {0, 1, 2}  # candidates of every class


class _Uniform(_Fixed):
    """Candidates of uniformly random brightness, whatever label they were drawn for."""

    def sample(self, labels, batch_size, generator):
        self.calls.append(labels.clone())
        values = torch.randint(0, 256, (len(labels),), generator=generator)
        yield values.view(-1, 1, 1, 1).expand(-1, 1, 8, 8).to(torch.uint8)


def test_relabel_gives_each_label_only_images_the_teacher_assigns_to_it_even_in_one_class_batches():
    # `sample` asks for labels sorted by class, so a batch is often one class: each label
    # must still get images the teacher calls that class (bright → 0, dark → 1), and a
    # class the teacher never predicts (2) must not make sampling loop forever.
    base = _Uniform()
    config = _config(teacher_share=0.3, teacher_oversample=1.0, teacher_filter="relabel")
    relabel = TeacherFilter(base, _ByBrightness(), config)
    labels = torch.tensor([0] * 8 + [1] * 8 + [2] * 4)
    out = torch.cat(list(relabel.sample(labels, 8, torch.Generator().manual_seed(0))))
    assert out.shape == (20, 1, 8, 8)
    values = out[:, 0, 0, 0].long()
    assert bool((values[:8] > 127).all())  # the teacher's class 0: bright
    assert bool((values[8:16] < 128).all())  # class 1: dark
    # candidates are drawn over every class; class 1 was served partly from the pool that
    # filled while class 0 was drawn; class 2 ended in `rank` on its own label after a
    # bounded number of rounds
    assert set(base.calls[0].tolist()) == {0, 1, 2}
    assert torch.equal(base.calls[-1], torch.tensor([2] * 4))
    assert len(base.calls) <= 3 * 3 + 1  # RELABEL_ROUNDS_PER_CLASS × 3 classes per batch, + rank


def test_relabel_carries_its_pools_across_calls_on_one_stream_and_not_across_streams():
    # The sampler calls `sample` once per chunk of labels with one stream: what the teacher
    # assigned to class 1 while class 0 was drawn serves the next call, so relabelling costs
    # about `teacher_oversample` × the draws, not × the number of classes.
    base = _Uniform()
    config = _config(teacher_share=0.3, teacher_oversample=1.0, teacher_filter="relabel")
    relabel = TeacherFilter(base, _ByBrightness(), config)
    stream = torch.Generator().manual_seed(0)
    list(relabel.sample(torch.tensor([0] * 8), 8, stream))
    drawn = sum(len(c) for c in base.calls)
    (ones,) = list(relabel.sample(torch.tensor([1] * 4), 8, stream))
    assert sum(len(c) for c in base.calls) == drawn  # served from the pool: no new draw
    assert bool((ones[:, 0, 0, 0] < 128).all())
    list(relabel.sample(torch.tensor([1] * 4), 8, torch.Generator().manual_seed(1)))
    assert sum(len(c) for c in base.calls) > drawn  # a new stream starts with empty pools


def test_a_saved_run_samples_through_its_teacher():
    target = PrivacyTarget(3.0, 1e-5)
    config = _config(teacher_share=0.5)
    plan = plan_with_stages(INFO, target, config, (), _rest)
    teacher = Teacher(INFO, config, plan, torch.device("cpu"), 0, PrivateRandomness(5))
    base = _Fixed()
    assert teacher_from_state(base, INFO, config, teacher.state_tensors()) is base  # untrained
    teacher.release_whole_data(0, torch.rand(200, 1, 8, 8) * 2 - 1, torch.randint(0, 3, (200,)))
    wrapped = teacher_from_state(base, INFO, config, teacher.state_tensors())
    assert isinstance(wrapped, TeacherFilter)
    (out,) = list(wrapped.sample(torch.tensor([0, 1, 2]), 10, torch.Generator()))
    assert out.shape == (3, 1, 8, 8) and out.dtype == torch.uint8
    assert math.isclose(wrapped.oversample, 2.0)


# Every image backend, with its tiny preset and a small teacher, through the real loop.
_TINY_TEACHER = {
    "teacher_share": "0.5",
    "teacher_batch": "64",
    "teacher_epochs": "0.5",
    "teacher_width": "4",
}


@pytest.mark.parametrize("method", ["dpkernel", "psg", "pge", "dpaf", "rdpgan"])
def test_every_backend_trains_its_teacher_composes_it_and_samples_through_it(tmp_path, method):
    from safetensors.torch import load_file

    from dpsynth.ledger import Ledger
    from dpsynth.sampling import generate
    from dpsynth.training import train_run

    secret = 0x0123456789ABCDEF0123456789ABCDEF
    common = dict(
        method=method, data="digits", epsilon=4.0, preset="tiny", device="cpu", seed=1,
        overrides=dict(_TINY_TEACHER), privacy_seed=secret,
    )  # fmt: skip
    result = train_run(out=tmp_path / "run", ledger_path=tmp_path / "a.jsonl", **common)
    assert result["ledger_status"] == "completed" and float(result["epsilon"]) <= 4.0
    (spend,) = [e for e in Ledger(tmp_path / "a.jsonl").entries() if e["kind"] == "spend"]
    teacher = [e for e in spend["events"] if e.get("mechanism") == "dp_classifier"]
    assert len(teacher) == 1  # charged in the ledger, composed with the backend's events
    assert compose_epsilon(spend["events"], spend["delta"]).epsilon <= 4.0
    tensors = load_file(tmp_path / "run" / "checkpoint.safetensors")
    assert int(tensors["trainer/teacher_trained"]) == 1
    x, y, _ = generate(tmp_path / "run", 20, device="cpu")
    assert x.shape == (20, 1, 8, 8) and torch.equal(torch.bincount(y), torch.full((10,), 2))
    if method == "dpkernel":  # an interrupted run resumes to the same teacher
        part = train_run(
            out=tmp_path / "part", ledger_path=tmp_path / "b.jsonl", stop_after_steps=3, **common
        )
        assert part["interrupted"]
        train_run(
            out=tmp_path / "part", ledger_path=tmp_path / "b.jsonl", resume=True,
            **{k: v for k, v in common.items() if k not in ("overrides", "privacy_seed")},
        )  # fmt: skip
        again = load_file(tmp_path / "part" / "checkpoint.safetensors")
        for key, value in tensors.items():
            if key.startswith("trainer/teacher"):
                assert torch.equal(value, again[key]), key


@pytest.mark.parametrize("method", ["dpkernel", "psg", "pge", "dpaf", "rdpgan"])
def test_the_frequency_model_is_released_once_and_warm_starts_the_backend(
    tmp_path, method, monkeypatch
):
    from dpsynth.ledger import Ledger
    from dpsynth.methods import registry
    from dpsynth.training import train_run

    started = []
    trainer_class = type(
        registry.get_method(method).trainer(
            INFO, registry.get_method(method).config("tiny", {}, INFO), _rest(), "cpu", 0
        )
    )
    # every backend takes the release in its `warm_start` (the GANs fit G to it by MMD)
    hook = "warm_start"
    assert hook in vars(trainer_class)
    original = getattr(trainer_class, hook)

    def spy(self, release):
        started.append(release)
        return original(self, release)

    monkeypatch.setattr(trainer_class, hook, spy)
    overrides = {"frequency_share": "0.5", "frequency_band": "4"}
    if method == "pge":
        overrides["warm_start_steps"] = "3"
    if method in ("dpaf", "rdpgan"):
        overrides["frequency_fit_steps"] = "3"
    result = train_run(
        method=method, data="digits", epsilon=3.0, preset="tiny", device="cpu", seed=1,
        out=tmp_path / "run", ledger_path=tmp_path / "l.jsonl", overrides=overrides,
    )  # fmt: skip
    assert result["ledger_status"] == "completed" and float(result["epsilon"]) <= 3.0
    (spend,) = [e for e in Ledger(tmp_path / "l.jsonl").entries() if e["kind"] == "spend"]
    assert [e["mechanism"] for e in spend["events"][:1]] == ["frequency_model"]
    assert compose_epsilon(spend["events"], spend["delta"]).epsilon <= 3.0
    assert len(started) == 1 and started[0].model is not None  # the model, not just means
    assert started[0].means.shape == (10, 1, 8, 8)
    if method in ("dpaf", "rdpgan"):
        return  # no central images to replace
    with pytest.raises(UsageError, match="replaces the central images"):  # never both
        train_run(
            method=method, data="digits", epsilon=3.0, preset="tiny", device="cpu",
            out=tmp_path / "two", ledger_path=tmp_path / "l.jsonl",
            overrides={**overrides, "warm_start_share": "0.3"},
        )  # fmt: skip


@pytest.mark.parametrize("method", ["rdpgan", "pge", "psg", "dpkernel", "dpaf", "freq"])
def test_no_recommended_28x28_preset_has_a_teacher_and_mnist_teacher_charges_one(method):
    """Issue 45: the teacher does not lift the accuracy of a recommended preset; it stays a
    named option (`mnist-teacher`), whose DP-SGD is an event of the plan, composed with the
    backend's under the target."""
    from dpsynth.methods.registry import get_method

    backend = get_method(method)
    mnist = DataInfo("mnist", "images", 4000, (1, 28, 28), tuple("0123456789"), "f" * 64, "m")
    for epsilon in (10.0, 1.0):
        preset = backend.recommended_preset(mnist, epsilon)
        config = backend.config(preset, {}, mnist)
        backend.validate_config(config, mnist)
        plan = backend.plan(mnist, PrivacyTarget(epsilon, 1e-5), config)
        assert not [e for e in plan.events if e.annotation("mechanism") == "dp_classifier"], preset
    if "mnist-teacher" not in backend.presets:
        return
    config = backend.config("mnist-teacher", {}, mnist)
    plan = backend.plan(mnist, PrivacyTarget(10.0, 1e-5), config)
    teachers = [e for e in plan.events if e.annotation("mechanism") == "dp_classifier"]
    assert len(teachers) == 1 and compose_epsilon(plan.events, 1e-5).epsilon <= 10.0
    assert config["teacher_filter"] == "relabel" and config["teacher_pretrain"] > 0


@pytest.mark.parametrize("method", ["rdpgan", "pge", "psg", "dpkernel", "dpaf"])
def test_every_recommended_image_preset_gives_the_own_mechanism_half_of_epsilon(method):
    """Issue 45: at least half of ε goes to the method's own mechanism in every preset `auto`
    recommends for images (digits and 28×28, small and large ε), by the settings' split and
    by the accountant: the shared stages' events alone stay within half of the target."""
    from dpsynth.methods.blocks import stage_shares
    from dpsynth.methods.registry import get_method

    backend = get_method(method)
    digits = DataInfo("digits", "builtin", 1437, (1, 8, 8), tuple("0123456789"), "f" * 64, "d")
    mnist = DataInfo("mnist", "images", 4000, (1, 28, 28), tuple("0123456789"), "f" * 64, "m")
    shared = {"frequency_model", "central_images", "dp_classifier"}
    for info in (digits, mnist):
        for epsilon in (10.0, 1.0):
            preset = backend.recommended_preset(info, epsilon)
            config = backend.config(preset, {}, info)
            assert stage_shares(config)["own"] >= 0.5 - 1e-9, (info.spec, preset)
            plan = backend.plan(info, PrivacyTarget(epsilon, 1e-5), config)
            stages = [e for e in plan.events if e.annotation("mechanism") in shared]
            if stages:
                bound = compose_epsilon(stages, 1e-5).epsilon
                assert bound <= 0.5 * epsilon * 1.02, (info.spec, preset, bound)
