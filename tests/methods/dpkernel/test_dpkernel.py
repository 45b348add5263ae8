"""The DP-Kernel backend: private read, plan, trainer, resume, generator and end-to-end run."""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import math
import sys
from typing import ClassVar

import pytest
import torch

from dpsynth.data.images import DataInfo
from dpsynth.errors import UsageError
from dpsynth.methods.base import ClippedGaussianSum, PrivacyTarget
from dpsynth.methods.dpkernel import (
    DPKernelGenerator,
    DPKernelMethod,
    VectorGenerator,
    raw_embedding_gradient,
)
from dpsynth.privacy.accounting.events import events_to_json
from dpsynth.privacy.mechanisms.functional import functional_sensitivity
from dpsynth.privacy.mechanisms.randomness import PrivateRandomness

DIGITS_INFO = DataInfo(
    spec="digits",
    kind="images",
    n=1000,
    shape=(1, 8, 8),
    classes=tuple(str(c) for c in range(10)),
    fingerprint="test",
    dataset_id="digits",
)


def _digits(n: int = 1000) -> tuple[torch.Tensor, torch.Tensor]:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = torch.tensor(bunch.images[:n], dtype=torch.float32)[:, None] / 8.0 - 1.0
    return x, torch.tensor(bunch.target[:n], dtype=torch.int64)


@functools.lru_cache
def _plan(epsilon: float, steps: int):
    # Calibration is the slow part; plans depend only on ε and the steps here.
    method = DPKernelMethod()
    config = method.config("tiny", {"steps": steps}, DIGITS_INFO)
    return method.plan(DIGITS_INFO, PrivacyTarget(epsilon, 1e-5), config)


def _trainer(
    epsilon: float, seed: int = 0, randomness: PrivateRandomness | None = None, **overrides
):
    method = DPKernelMethod()
    config = method.config("tiny", overrides, DIGITS_INFO)
    plan = _plan(epsilon, config["steps"])
    return (
        method,
        config,
        plan,
        method.trainer(DIGITS_INFO, config, plan, torch.device("cpu"), seed, randomness),
    )


def _poisson_batches(x, y, q: float, steps: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        mask = torch.rand(len(y), generator=gen) < q
        yield x[mask], y[mask]


def test_private_gradient_matches_autograd_of_the_embedding():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(9, 2, 3, 2, generator=gen, dtype=torch.float64)
    y = torch.randint(0, 3, (9,), generator=gen)
    points = torch.randn(4, 12, generator=gen, dtype=torch.float64, requires_grad=True)
    labels = torch.tensor([0, 1, 2, 1])
    bandwidths, normalizer = (1.0, 3.0), 5.0
    flat = x.reshape(9, -1)
    same = (y[:, None] == labels[None, :]).double()
    sq = (flat[:, None, :] - points[None, :, :]).pow(2).sum(-1)
    f_values = (same * sum(torch.exp(-sq / (2 * b * b)) for b in bandwidths)).sum(0) / normalizer
    (expected,) = torch.autograd.grad(f_values.sum(), points)
    got = raw_embedding_gradient(x, y, points, labels, bandwidths, normalizer)
    assert torch.allclose(got, expected, atol=1e-12)
    empty = raw_embedding_gradient(x[:0], y[:0], points, labels, bandwidths, normalizer)
    assert empty.shape == (4, 12) and empty.abs().max() == 0


def test_config_derives_sensitivity_and_refuses_unsafe_overrides():
    method = DPKernelMethod()
    config = method.config("tiny", {"bandwidths": "8,16", "sensitivity": "add_remove"}, DIGITS_INFO)
    assert config["bandwidths"] == [8.0, 16.0]
    assert config["max_grad_norm"] == pytest.approx(math.sqrt(2))
    with pytest.raises(UsageError):
        method.config("tiny", {"max_grad_norm": "0.1"}, DIGITS_INFO)
    with pytest.raises(UsageError):
        method.config("tiny", {"bandwidths": "-1"}, DIGITS_INFO)
    assert set(method.presets) >= {
        "tiny",
        "small",
        "small-eps1",
        "mnist",
        "mnist-eps1",
        "paper-200k",
    }


def test_plan_events_are_within_target_under_dp_accounting():
    dp_event = pytest.importorskip("dp_accounting.dp_event")
    pld = pytest.importorskip("dp_accounting.pld.pld_privacy_accountant")
    method = DPKernelMethod()
    config = method.config("tiny", {}, DIGITS_INFO)
    for epsilon in (1.0, 10.0):
        plan = _plan(epsilon, config["steps"])
        assert plan.sampling_rate == pytest.approx(config["batch_size"] / DIGITS_INFO.n)
        assert plan.max_grad_norm == pytest.approx(math.sqrt(3))  # √n_L: exact add/remove
        (event,) = events_to_json(plan.events)
        assert event["type"] == "poisson_gaussian"
        assert event["noise_multiplier"] == plan.noise_multiplier
        accountant = pld.PLDAccountant()
        accountant.compose(
            dp_event.PoissonSampledDpEvent(
                event["sampling_rate"], dp_event.GaussianDpEvent(event["noise_multiplier"])
            ),
            event["steps"],
        )
        assert accountant.get_epsilon(1e-5) <= epsilon


class _Tracked(torch.Tensor):
    """A tensor that records the Python call stack of every torch operation on it."""

    stacks: ClassVar[list[list[str]]] = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        names, frame = [], sys._getframe(1)
        while frame is not None:
            names.append(frame.f_code.co_name)
            frame = frame.f_back
        cls.stacks.append(names)
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **(kwargs or {}))


def test_only_the_private_function_reads_the_batch():
    x, y = _digits(40)
    for epsilon in (1.0, math.inf):
        _, _, _, trainer = _trainer(epsilon)
        _Tracked.stacks.clear()
        trainer.step(x.as_subclass(_Tracked), y.as_subclass(_Tracked))
        assert _Tracked.stacks, "the batch was never read"
        assert all("raw_embedding_gradient" in names for names in _Tracked.stacks)


def test_huge_noise_makes_the_update_independent_of_the_batch():
    # With σ → ∞ the released gradient is pure noise: two different batches give the same
    # update for the same seed; at the planned σ they do not.
    x, y = _digits(200)
    method = DPKernelMethod()
    config = method.config("tiny", {}, DIGITS_INFO)
    plan = _plan(1.0, config["steps"])
    for sigma, should_match in ((1e9, True), (plan.noise_multiplier, False)):
        params = []
        for batch in (slice(0, 100), slice(100, 200)):
            noisy = dataclasses.replace(
                plan, gaussian_sum=ClippedGaussianSum(sigma, plan.max_grad_norm)
            )
            trainer = method.trainer(
                DIGITS_INFO, config, noisy, torch.device("cpu"), 0, PrivateRandomness(11)
            )
            trainer.step(x[batch], y[batch])
            params.append(torch.cat([p.flatten() for p in trainer.net.parameters()]))
        assert torch.allclose(params[0], params[1], rtol=0, atol=1e-7) == should_match


def test_resume_continues_exactly():
    x, y = _digits()
    batches = list(_poisson_batches(x, y, 16 / 1000, 6))
    _, _, _, straight = _trainer(1.0, randomness=PrivateRandomness(7), optimizer="rmsprop")
    for bx, by in batches:
        straight.step(bx, by)
    first_randomness = PrivateRandomness(7)
    method, config, plan, first = _trainer(1.0, randomness=first_randomness, optimizer="rmsprop")
    for bx, by in batches[:3]:
        first.step(bx, by)
    saved = {k: v.clone() for k, v in first.state_tensors().items()}
    saved_streams = first_randomness.state()  # the secret streams, saved privately by the loop
    resumed_randomness = PrivateRandomness(8)  # a different seed and secret: all from saved
    resumed = method.trainer(
        DIGITS_INFO, config, plan, torch.device("cpu"), seed=123, randomness=resumed_randomness
    )
    resumed.load_state_tensors(saved)
    resumed_randomness.load_state(saved_streams)
    for bx, by in batches[3:]:
        resumed.step(bx, by)
    a, b = straight.state_tensors(), resumed.state_tensors()
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_ema_weights_average_the_steps_resume_and_drive_the_sampler():
    x, y = _digits()
    batches = list(_poisson_batches(x, y, 16 / 1000, 6))
    randomness = PrivateRandomness(11)
    method, config, plan, trainer = _trainer(1.0, randomness=randomness, ema=0.9)
    start = [p.detach().clone() for p in trainer.net.parameters()]
    for bx, by in batches[:3]:
        trainer.step(bx, by)
    raw = [p.detach() for p in trainer.net.parameters()]
    averaged = [p.detach() for p in trainer.ema.parameters()]
    # The EMA lies strictly between the start and the raw weights, not on either.
    assert not any(torch.equal(a, r) for a, r in zip(averaged, raw, strict=True))
    assert not any(torch.equal(a, s) for a, s in zip(averaged, start, strict=True))
    saved = {k: v.clone() for k, v in trainer.state_tensors().items()}
    assert any(k.startswith("ema.") for k in saved)
    saved_streams = randomness.state()  # the secret streams, saved privately by the loop
    resumed_randomness = PrivateRandomness(12)
    resumed = method.trainer(
        DIGITS_INFO, config, plan, torch.device("cpu"), seed=0, randomness=resumed_randomness
    )
    resumed.load_state_tensors(saved)
    resumed_randomness.load_state(saved_streams)
    for bx, by in batches[3:]:
        trainer.step(bx, by)
        resumed.step(bx, by)
    a, b = trainer.state_tensors(), resumed.state_tensors()
    assert all(torch.equal(a[key], b[key]) for key in a)
    # The saved run and the in-memory trainer both sample from the EMA weights.
    labels = torch.arange(20) % 10
    from_state = method.generator_from_state(DIGITS_INFO, config, a, torch.device("cpu"))
    draw = [
        torch.cat(list(g.sample(labels, 20, torch.Generator().manual_seed(0))))
        for g in (from_state, trainer.generator())
    ]
    assert torch.equal(draw[0], draw[1])
    trainer.net.load_state_dict(trainer.ema.state_dict())
    direct = DPKernelGenerator(trainer.net, DIGITS_INFO.classes, torch.device("cpu"))
    assert torch.equal(draw[0], next(direct.sample(labels, 20, torch.Generator().manual_seed(0))))
    with pytest.raises(UsageError, match="ema"):
        method.config("tiny", {"ema": 1.0}, DIGITS_INFO)


def test_generator_shapes_and_paper_parameter_counts():
    conditional = VectorGenerator((1, 32, 32), 10, 10, 64, "conv", "batch")
    unconditional = VectorGenerator((1, 32, 32), 0, 10, 64, "conv", "batch")
    assert sum(p.numel() for p in conditional.parameters()) == 698_450  # spec §2.4
    assert sum(p.numel() for p in unconditional.parameters()) == 698_240
    mnist = VectorGenerator((1, 28, 28), 10, 10, 8, "conv", "group")
    assert mnist(torch.randn(3, 10), torch.eye(10)[:3]).shape == (3, 784)
    table_row = VectorGenerator((13,), 2, 4, 16, "mlp", "none")
    out = table_row(torch.randn(5, 4), torch.eye(2)[[0, 1, 0, 1, 0]])
    assert out.shape == (5, 13) and out.abs().max() <= 1

    method, config, _, trainer = _trainer(1.0)
    sampler = method.generator_from_state(
        DIGITS_INFO, config, trainer.state_tensors(), torch.device("cpu")
    )
    labels = torch.arange(23) % 10
    batches = list(sampler.sample(labels, 10, torch.Generator().manual_seed(0)))
    assert [b.shape[0] for b in batches] == [10, 10, 3]
    assert all(b.dtype == torch.uint8 and b.shape[1:] == (1, 8, 8) for b in batches)


def _mmd2(a: torch.Tensor, b: torch.Tensor, bandwidths=(4.0, 8.0)) -> float:
    def mean_kernel(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        sq = torch.cdist(u, v).pow(2)
        return sum(torch.exp(-sq / (2 * w * w)) for w in bandwidths).mean()

    return float(mean_kernel(a, a) + mean_kernel(b, b) - 2 * mean_kernel(a, b))


def test_non_private_training_lowers_mmd_on_digits():
    x, y = _digits()
    _, _, _, trainer = _trainer(math.inf, steps=60)

    def mmd() -> float:
        labels = torch.arange(300) % 10
        probe = torch.Generator().manual_seed(5)
        fake = torch.cat(list(trainer.generator().sample(labels, 300, probe)))
        return _mmd2(x[:300].flatten(1), fake.float().div(127.5).sub(1).flatten(1))

    before = mmd()
    for bx, by in _poisson_batches(x, y, 16 / 1000, 60):
        trainer.step(bx, by)
    assert mmd() < 0.7 * before


@pytest.mark.skipif(
    importlib.util.find_spec("dpsynth.training") is None, reason="training loop not present"
)
def test_end_to_end_train_resume_and_sample(tmp_path):
    from dpsynth.ledger import Ledger
    from dpsynth.rundir import RunDir
    from dpsynth.sampling import sample_run
    from dpsynth.training import train_run

    common = {
        "method": "dpkernel",
        "data": "digits",
        "epsilon": 5.0,
        "preset": "tiny",
        "device": "cpu",
        "seed": 0,
        "overrides": {"steps": "12"},
        "privacy_seed": 12345,  # the same secret for both runs (injectable in tests only)
    }
    train_run(out=tmp_path / "a", ledger_path=tmp_path / "a.jsonl", **common)
    train_run(out=tmp_path / "b", ledger_path=tmp_path / "b.jsonl", stop_after_steps=5, **common)
    train_run(out=tmp_path / "b", ledger_path=tmp_path / "b.jsonl", resume=True, **common)

    (straight, straight_state), (resumed, resumed_state) = (
        RunDir(tmp_path / name).load_checkpoint() for name in ("a", "b")
    )
    assert straight_state["step"] == resumed_state["step"] == 12
    trainer_keys = [k for k in straight if k.startswith("trainer/")]
    assert any("generator." in k for k in trainer_keys)
    for key in trainer_keys:
        assert torch.equal(straight[key], resumed[key]), key

    # One spend for the interrupted-and-resumed run, within the target under dp-accounting.
    dp_event = pytest.importorskip("dp_accounting.dp_event")
    pld = pytest.importorskip("dp_accounting.pld.pld_privacy_accountant")
    delta = RunDir(tmp_path / "b").read_config()["privacy"]["delta"]
    events = Ledger(tmp_path / "b.jsonl").events_for("digits")
    assert [e["type"] for e in events] == ["poisson_gaussian"]
    assert events[0]["steps"] == 12
    accountant = pld.PLDAccountant()
    accountant.compose(
        dp_event.PoissonSampledDpEvent(
            events[0]["sampling_rate"], dp_event.GaussianDpEvent(events[0]["noise_multiplier"])
        ),
        events[0]["steps"],
    )
    assert accountant.get_epsilon(delta) <= 5.0

    out = tmp_path / "synth"
    sample_run(tmp_path / "a", 25, out, ledger_path=tmp_path / "a.jsonl", device="cpu")
    assert len(list(out.rglob("*.png"))) == 25
    assert len((out / "labels.csv").read_text().strip().splitlines()) == 26
    assert (out / "manifest.json").exists()


def test_every_preset_states_its_kernels_sensitivity_and_small_eps1_uses_one_kernel():
    method = DPKernelMethod()
    for name, preset in method.presets.items():
        config = method.config(name, {}, DIGITS_INFO)
        expected = functional_sensitivity(len(preset["bandwidths"]), preset["sensitivity"])
        assert preset["max_grad_norm"] == pytest.approx(expected), name
        assert config["max_grad_norm"] == pytest.approx(expected), name
    small_eps1 = method.config("small-eps1", {}, DIGITS_INFO)
    assert small_eps1["bandwidths"] == [6.0]
    # one unit-diagonal kernel under add/remove: √n_L = 1 (the replace-one bound would be √2)
    assert small_eps1["sensitivity"] == "add_remove"
    assert small_eps1["max_grad_norm"] == pytest.approx(1.0)
    small = method.config("small", {}, DIGITS_INFO)
    unchanged = ("batch_size", "generated_points", "steps", "width", "lr", "ema")
    assert {k: small_eps1[k] for k in unchanged} == {k: small[k] for k in unchanged}


MNIST_INFO = dataclasses.replace(
    DIGITS_INFO, spec="mnist-5k", n=4000, shape=(1, 28, 28), dataset_id="mnist-5k"
)


def test_recommended_preset_follows_the_public_shape_and_epsilon():
    method = DPKernelMethod()
    assert method.recommended_preset(DIGITS_INFO, 10.0) == "small-eps1"
    assert method.recommended_preset(DIGITS_INFO, 1.0) == "small-eps1"
    assert method.recommended_preset(MNIST_INFO, 10.0) == "mnist"
    assert method.recommended_preset(MNIST_INFO, 1.0) == "mnist-eps1"
    assert method.recommended_preset(MNIST_INFO, math.inf) == "mnist"
    # The 200,000-step paper setting is named for its length and never recommended.
    assert "paper" not in method.presets and method.presets["paper-200k"]["steps"] == 200_000
    with pytest.raises(UsageError, match="paper-200k"):
        method.config("paper", {}, MNIST_INFO)


@pytest.mark.parametrize("preset", ["mnist", "mnist-eps1"])
def test_mnist_presets_train_a_step_on_28x28_and_sample(preset):
    method = DPKernelMethod()
    config = method.config(preset, {"steps": 1}, MNIST_INFO)
    assert config["max_grad_norm"] == pytest.approx(
        functional_sensitivity(len(config["bandwidths"]), config["sensitivity"])
    )
    plan = method.plan(MNIST_INFO, PrivacyTarget(10.0, 1e-5), config)
    assert plan.sampling_rate == pytest.approx(config["batch_size"] / MNIST_INFO.n)
    trainer = method.trainer(MNIST_INFO, config, plan, torch.device("cpu"), 0)
    x = torch.rand(60, 1, 28, 28, generator=torch.Generator().manual_seed(0)) * 2 - 1
    stats = trainer.step(x, torch.arange(60) % 10)
    assert math.isfinite(stats["loss"]) and stats["released_grad_norm"] > 0
    images = torch.cat(
        list(trainer.generator().sample(torch.arange(12) % 10, 6, torch.Generator()))
    )
    assert images.shape == (12, 1, 28, 28) and images.dtype == torch.uint8


def test_label_input_layers_feeds_the_label_to_every_layer():
    net = VectorGenerator((1, 28, 28), 10, 10, 8, "conv", "group", label_input="layers")
    convs = [m for m in net.modules() if isinstance(m, torch.nn.ConvTranspose2d)]
    # Every transposed convolution sees the K label channels beside its usual input.
    assert [c.in_channels for c in convs] == [10 + 10, 32 + 10, 16 + 10, 8 + 10]
    z = torch.randn(1, 10).expand(10, -1)
    out = net(z, torch.eye(10))
    assert out.shape == (10, 784) and out.abs().max() <= 1
    assert (out[0] - out[1]).abs().max() > 0  # one latent, two labels: two images
    with pytest.raises(UsageError, match="label_input"):
        VectorGenerator((1, 28, 28), 10, 10, 8, "conv", "group", label_input="once")

    method, config, _, trainer = _trainer(1.0, label_input="layers")
    x, y = _digits()
    for bx, by in _poisson_batches(x, y, 0.05, 3):
        trainer.step(bx, by)
    sampler = method.generator_from_state(
        DIGITS_INFO, config, trainer.state_tensors(), torch.device("cpu")
    )
    images = next(sampler.sample(torch.arange(10), 10, torch.Generator().manual_seed(0)))
    assert images.shape == (10, 1, 8, 8) and images.dtype == torch.uint8
    with pytest.raises(UsageError, match="label_input"):
        method.validate_config({**config, "label_input": "once"}, DIGITS_INFO)


def test_sample_truncation_scales_the_latent_and_narrows_the_samples():
    """`sample_truncation` t samples net(t·z): the same draws as t = 1, scaled, so the samples
    of one class spread less; a config saved before the key existed samples at t = 1."""
    method = DPKernelMethod()
    config = method.config("tiny", {}, DIGITS_INFO)
    assert config["sample_truncation"] == 1.0
    torch.manual_seed(0)
    trainer = method.trainer(
        DIGITS_INFO,
        config,
        method.plan(DIGITS_INFO, PrivacyTarget(math.inf, 1e-5), config),
        torch.device("cpu"),
        0,
    )
    net = trainer.generator().net
    labels = torch.full((400,), 3)

    def draw(t: float) -> torch.Tensor:
        gen = DPKernelGenerator(net, DIGITS_INFO.classes, torch.device("cpu"), truncation=t)
        return torch.cat(list(gen.sample(labels, 200, torch.Generator().manual_seed(7)))).float()

    z = torch.randn(400, net.latent_dim, generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        expected = net(0.5 * z, torch.nn.functional.one_hot(labels, 10).float())
    half = draw(0.5)
    assert (half.reshape(400, -1) - (expected.clamp(-1, 1) + 1) * 127.5).abs().max() <= 1.0
    assert half.std(dim=0).mean() < draw(1.0).std(dim=0).mean()
    tensors = trainer.state_tensors()
    legacy = {k: v for k, v in config.items() if k != "sample_truncation"}
    assert method.generator_from_state(DIGITS_INFO, legacy, tensors, "cpu").truncation == 1.0
    for bad in (0.0, -1.0, 5.0):
        with pytest.raises(UsageError, match="sample_truncation"):
            method.config("tiny", {"sample_truncation": bad}, DIGITS_INFO)


@pytest.mark.parametrize(
    "teacher_preset, base, epsilon",
    [("mnist-teacher", "mnist", 10.0), ("mnist-eps1-teacher", "mnist-eps1", 1.0)],
)
def test_teacher_presets_are_the_measured_rows_and_compose_their_stages_within_epsilon(
    teacher_preset: str, base: str, epsilon: float
):
    """The teacher presets name the ablation rows they were chosen on (the base preset with the
    relabelling teacher on half of ε: docs/leaderboard.md), `auto` never picks them, and each
    plan gives the frequency model and the DP-MMD steps half of ε between them and the
    teacher's DP-SGD the rest, composed within the target."""
    from dpsynth.privacy.accounting.compose import compose_epsilon

    method = DPKernelMethod()
    named = method.config(teacher_preset, {}, MNIST_INFO)
    measured = method.config(
        base,
        {"teacher_share": 0.5, "teacher_filter": "relabel", "teacher_pretrain": 10000},
        MNIST_INFO,
    )
    assert {**named, "preset": base} == measured
    assert teacher_preset not in {method.recommended_preset(MNIST_INFO, e) for e in (1.0, 10.0)}
    plan = method.plan(MNIST_INFO, PrivacyTarget(epsilon, 1e-5), named)
    teacher = [e for e in plan.events if e.annotation("mechanism") == "dp_classifier"]
    frequency = [e for e in plan.events if e.annotation("mechanism") == "frequency_model"]
    rest = [e for e in plan.events if e.annotation("mechanism") != "dp_classifier"]
    assert len(teacher) == 1 and len(frequency) == 1 and len(rest) > 1
    # The backend's stages are planned for half of ε alone (the frequency model for half of
    # that); the teacher's DP-SGD fills the rest up to ε under PRV composition, so alone it
    # bounds more than half (composition is sub-additive).
    assert compose_epsilon(rest, 1e-5).epsilon == pytest.approx(epsilon / 2, rel=0.02)
    assert compose_epsilon(frequency, 1e-5).epsilon == pytest.approx(epsilon / 4, rel=0.02)
    assert epsilon / 2 < compose_epsilon(teacher, 1e-5).epsilon < epsilon
    assert plan.epsilon_bound <= epsilon + 1e-9


def test_the_public_preset_is_the_measured_row_and_gives_half_of_epsilon_to_the_mechanism():
    """`mnist-eps1-public` is the ε = 1 row measured with typeset digits as the public set
    (docs/leaderboard.md): `mnist-eps1-teacher` with the generator started from 1,000 public
    steps instead of the frequency model, so the functional mechanism and the teacher hold half
    of ε each, composed within the target; `auto` never picks it."""
    from dpsynth.privacy.accounting.compose import compose_epsilon

    method = DPKernelMethod()
    named = method.config("mnist-eps1-public", {}, MNIST_INFO)
    measured = method.config(
        "mnist-eps1-teacher", {"frequency_share": 0, "public_pretrain_steps": 1000}, MNIST_INFO
    )
    assert {**named, "preset": "mnist-eps1-teacher"} == measured
    assert "mnist-eps1-public" in method.public_presets
    assert "mnist-eps1-public" not in {
        method.recommended_preset(MNIST_INFO, e) for e in (1.0, 10.0)
    }
    plan = method.plan(MNIST_INFO, PrivacyTarget(1.0, 1e-5), named)
    mechanisms = {e.annotation("mechanism") for e in plan.events}
    assert "frequency_model" not in mechanisms and "dp_classifier" in mechanisms
    own = [e for e in plan.events if e.annotation("mechanism") != "dp_classifier"]
    assert compose_epsilon(own, 1e-5).epsilon == pytest.approx(0.5, rel=0.02)
    assert plan.epsilon_bound <= 1.0 + 1e-9
