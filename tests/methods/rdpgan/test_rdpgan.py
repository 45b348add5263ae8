"""The RDP-GAN backend (sound mode): the mechanism on D's real-loss term (clip, noise, exact
fake term), the generator as post-processing, σ schedules accounted step by step against
dp-accounting's PLD, resume, and train → sample through the CLI."""

from __future__ import annotations

import copy
import functools
import json
import math

import numpy as np
import pytest
import torch
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant
from torch.nn import functional as F
from typer.testing import CliRunner

from dpsynth.cli import app
from dpsynth.data.images import DataInfo
from dpsynth.errors import UsageError
from dpsynth.methods.base import PrivacyTarget
from dpsynth.methods.rdpgan import RDPGANMethod
from dpsynth.methods.rdpgan import schedule as sched
from dpsynth.methods.rdpgan.trainer import RDPGANTrainer
from dpsynth.privacy.accounting.compose import compose_epsilon
from dpsynth.privacy.accounting.events import events_to_json
from dpsynth.privacy.accounting.plan_check import check_plan_parameters
from dpsynth.privacy.mechanisms.randomness import PrivateRandomness

DIGITS_INFO = DataInfo(
    spec="digits",
    kind="images",
    n=1437,
    shape=(1, 8, 8),
    classes=tuple(str(c) for c in range(10)),
    fingerprint="test",
    dataset_id="digits",
)


def _digits(n: int = 40) -> tuple[torch.Tensor, torch.Tensor]:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = torch.tensor(bunch.images[:n], dtype=torch.float32)[:, None] / 8.0 - 1.0
    return x, torch.tensor(bunch.target[:n], dtype=torch.int64)


@functools.lru_cache
def _plan(epsilon: float, overrides: tuple[tuple[str, str], ...] = ()):
    method = RDPGANMethod()
    config = method.config("tiny", dict(overrides), DIGITS_INFO)
    method.validate_config(config, DIGITS_INFO)
    return config, method.plan(DIGITS_INFO, PrivacyTarget(epsilon, 1e-5), config)


def _trainer(epsilon: float = 2.0, seed: int = 0, lr_d: float | None = None, **overrides):
    config, plan = _plan(epsilon, tuple(sorted(overrides.items())))
    if lr_d is not None:  # lr_d = 0 (refused by validation) freezes D in a test
        config = {**config, "lr_d": lr_d}
    return RDPGANTrainer(DIGITS_INFO, config, plan, torch.device("cpu"), seed, PrivateRandomness(7))


def _pld_epsilon(events: list[dict], delta: float) -> float:
    accountant = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-3)
    for event in events_to_json(events):
        accountant.compose(
            dp_event.PoissonSampledDpEvent(
                event["sampling_rate"], dp_event.GaussianDpEvent(event["noise_multiplier"])
            ),
            event["steps"],
        )
    return accountant.get_epsilon(delta)


def _captured_d_gradient(trainer: RDPGANTrainer, x, y, sigma: float):
    """The gradient D's optimiser steps with, and the exact fake-term gradient of that step
    (recomputed with the same latents, replayed from the latents stream)."""
    trainer.sigmas = [sigma] * len(trainer.sigmas)
    latents_state = trainer.rng_latents.get_state()
    d_copy = {n: p.detach().clone() for n, p in trainer.net_d.named_parameters()}
    captured = {}
    original = trainer.opt_d.step

    def capture(*args, **kwargs):
        captured.update({n: p.grad.clone() for n, p in trainer.net_d.named_parameters()})
        return original(*args, **kwargs)

    trainer.opt_d.step = capture
    trainer.discriminator_step(x, y)
    trainer.opt_d.step = original
    # Independent recomputation of the fake term at the weights before the step.
    trainer.rng_latents.set_state(latents_state)
    with torch.no_grad():
        fakes, onehot = trainer._fakes(trainer.batch_size)
        for n, p in trainer.net_d.named_parameters():
            p.copy_(d_copy[n])
    loss = F.softplus(trainer.net_d(fakes, onehot)).mean()
    fake = torch.autograd.grad(loss, list(trainer.net_d.parameters()))
    return captured, dict(zip(dict(trainer.net_d.named_parameters()), fake, strict=True))


def test_real_term_is_clipped_per_record_and_the_fake_term_is_exact(one_torch_thread):
    trainer = _trainer()
    with torch.no_grad():  # larger weights: every record's gradient is above C
        for p in trainer.net_d.parameters():
            p.mul_(4.0)
    x, y = _digits(12)
    captured, fake = _captured_d_gradient(trainer, x, y, sigma=0.0)
    m = trainer.plan.expected_batch_size
    clip = trainer.plan.max_grad_norm
    # Reference: a per-record loop with plain autograd, clipped to C.
    reference = {n: torch.zeros_like(p) for n, p in trainer.net_d.named_parameters()}
    for i in range(x.shape[0]):
        onehot = F.one_hot(y[i : i + 1], 10).float()
        loss = F.softplus(-trainer.net_d(x[i : i + 1], onehot)).sum()
        grads = torch.autograd.grad(loss, list(trainer.net_d.parameters()))
        norm = torch.sqrt(sum((g**2).sum() for g in grads))
        assert norm > clip  # the clip is active
        scale = min(1.0, clip / (float(norm) + 1e-6))
        for (n, _), g in zip(trainer.net_d.named_parameters(), grads, strict=True):
            reference[n] += g * scale
    real_sum = {n: (captured[n] - fake[n]) * m for n in captured}
    for n in captured:
        torch.testing.assert_close(real_sum[n], reference[n], rtol=1e-4, atol=1e-5)
    # One record moves the sum by at most C.
    one, fake_one = _captured_d_gradient(_trainer(), x[:1], y[:1], sigma=0.0)
    flat = torch.cat([((one[n] - fake_one[n]) * m).flatten() for n in one])
    assert float(flat.norm()) <= clip * (1 + 1e-5)
    # An empty batch with σ = 0: the applied gradient IS the exact fake gradient.
    empty, fake_empty = _captured_d_gradient(_trainer(), x[:0], y[:0], sigma=0.0)
    for n in empty:
        torch.testing.assert_close(empty[n], fake_empty[n], rtol=0, atol=0)


def test_noise_on_the_real_term_has_std_sigma_c_and_nothing_else_is_noised(one_torch_thread):
    trainer = _trainer()
    x, y = _digits(1)
    sigma = 3.0
    captured, fake = _captured_d_gradient(trainer, x[:0], y[:0], sigma=sigma)
    m, clip = trainer.plan.expected_batch_size, trainer.plan.max_grad_norm
    noise = torch.cat([((captured[n] - fake[n]) * m).flatten() for n in captured]).double()
    assert noise.numel() > 3000
    assert abs(float(noise.mean())) < 4 * sigma * clip / math.sqrt(noise.numel())
    assert float(noise.std()) == pytest.approx(sigma * clip, rel=0.05)


def test_generator_step_touches_no_private_data(one_torch_thread):
    # With D frozen (lr_d = 0), G's update must be identical whatever the private batch.
    x, y = _digits(40)
    after = []
    for batch in (slice(0, 20), slice(20, 40)):
        trainer = _trainer(n_d=1, lr_d=0.0)
        g_before = [p.clone() for p in trainer.net_g.parameters()]
        trainer.step(x[batch], y[batch])
        after.append([p.detach().clone() for p in trainer.net_g.parameters()])
        assert any(not torch.equal(a, b) for a, b in zip(g_before, after[-1], strict=True))
    for a, b in zip(*after, strict=True):
        assert torch.equal(a, b)
    # Control: with D learning, the batch does reach G through D.
    moved = []
    for batch in (slice(0, 20), slice(20, 40)):
        trainer = _trainer(n_d=1)
        trainer.step(x[batch], y[batch])
        moved.append(torch.cat([p.detach().flatten() for p in trainer.net_g.parameters()]))
    assert not torch.equal(*moved)


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"schedule": "step", "decay": 0.5, "step_every": 2, "n_g": 6},
        {"schedule": "exp", "decay": 0.3, "n_g": 5},
    ],
)
def test_schedule_events_reaccounted_under_pld_and_used_step_by_step(overrides):
    config, plan = _plan(3.0, tuple(sorted((k, str(v)) for k, v in overrides.items())))
    n_d, n_g = int(config["n_d"]), int(config["n_g"])
    assert plan.steps == n_d * n_g == sum(e.steps for e in plan.events)
    assert plan.epsilon_bound <= 3.0
    # dp-accounting's PLD on the recorded events: never above the printed ε.
    assert _pld_epsilon(list(plan.events), plan.delta) <= plan.epsilon_bound
    # The trainer's σ at every step is z₀·f(t) of the schedule (t = generator iteration).
    trainer = RDPGANTrainer(DIGITS_INFO, config, plan, torch.device("cpu"), 0, PrivateRandomness(1))
    raw = sched.factors(config["schedule"], n_g, float(config["decay"]), int(config["step_every"]))
    z0 = plan.events[0].noise_multiplier
    for step in range(plan.steps):
        expected = z0 * raw[step // n_d]
        assert trainer.sigma_at(step) == pytest.approx(expected, rel=1e-12)
    assert plan.noise_multiplier == min(trainer.sigma_at(s) for s in range(plan.steps))
    # The loop's anchor check accepts the schedule plan, and refuses another σ.
    check = functools.partial(
        check_plan_parameters, plan.events, private=True, sampling_rate=plan.sampling_rate,
        steps=plan.steps, run_name="run",
    )  # fmt: skip
    check(noise_multiplier=plan.noise_multiplier)
    if len(plan.events) > 1:
        from dpsynth.errors import AnchorError

        with pytest.raises(AnchorError):
            check(noise_multiplier=z0)
    # And the trainer applies it: the σ it reports per step follows the events.
    x, y = _digits(4)
    seen = [trainer.step(x[:0], y[:0])["noise_multiplier"] for _ in range(plan.steps)]
    assert seen == [trainer.sigma_at(s) for s in range(plan.steps)]


@pytest.mark.parametrize(
    "stage",
    [
        {"frequency_share": "0.5", "frequency_band": "4"},
        {"teacher_share": "0.3", "teacher_epochs": "1"},
    ],
)
def test_a_schedule_beside_a_shared_stage_passes_the_anchor_check_and_nothing_else(stage):
    # The frequency model's `gaussian` event and the teacher's own `poisson_gaussian` (another
    # q) are not the loop's steps: the schedule is read from the other events (a resumed run
    # was refused as "config.json was edited" before), and another σ is still refused.
    from dpsynth.errors import AnchorError

    overrides = {"schedule": "step", "decay": "0.5", "step_every": "2", "n_g": "6", **stage}
    config, plan = _plan(3.0, tuple(sorted(overrides.items())))
    mechanisms = [e.annotation("mechanism") for e in plan.events]
    assert mechanisms[0] in ("frequency_model", "dp_classifier") and len(plan.events) == 4
    trainer = RDPGANTrainer(DIGITS_INFO, config, plan, torch.device("cpu"), 0, PrivateRandomness(1))
    assert plan.noise_multiplier == min(trainer.sigma_at(s) for s in range(plan.steps))
    check = functools.partial(
        check_plan_parameters, plan.events, private=True, sampling_rate=plan.sampling_rate,
        steps=plan.steps, run_name="run",
    )  # fmt: skip
    check(noise_multiplier=plan.noise_multiplier)
    for sigma in (plan.events[1].noise_multiplier, 1.01 * plan.noise_multiplier):
        with pytest.raises(AnchorError):
            check(noise_multiplier=sigma)
    with pytest.raises(AnchorError):
        check(noise_multiplier=plan.noise_multiplier, steps=plan.steps + 1)


def test_decaying_schedule_spends_no_more_than_constant_and_decays():
    _, constant = _plan(3.0, (("n_g", "6"),))
    _, step = _plan(
        3.0, (("decay", "0.5"), ("n_g", "6"), ("schedule", "step"), ("step_every", "2"))
    )
    sigmas = [e.noise_multiplier for e in step.events]
    assert sigmas == sorted(sigmas, reverse=True) and len(sigmas) == 3
    assert sigmas[1] == pytest.approx(0.5 * sigmas[0]) and sigmas[2] == pytest.approx(
        0.25 * sigmas[0]
    )
    # z₀ is calibrated for the whole schedule: above the constant σ, ending below it.
    assert sigmas[0] > constant.noise_multiplier > sigmas[-1]


def test_smooth_schedules_are_rounded_down_onto_a_geometric_grid():
    raw = sched.factors("time", 1000, 0.05, 100)
    rounded, ratio = sched.rounded_factors(raw)
    assert ratio is not None and ratio >= sched.MIN_GRID_RATIO
    assert len(set(rounded)) <= sched.MAX_SEGMENTS
    for f, r in zip(raw, rounded, strict=True):
        assert r <= f and r * ratio >= f * (1 - 1e-9)  # never more noise than the formula
    segments = sched.segments(rounded, 5)
    assert sum(n for _, n in segments) == 5000
    assert [f for f, _ in segments] == sorted({f for f, _ in segments}, reverse=True)
    # Few distinct values (the step schedule) are kept exactly.
    assert sched.rounded_factors(sched.factors("step", 1000, 0.6, 100)) == (
        sched.factors("step", 1000, 0.6, 100),
        None,
    )


def test_plan_needs_only_the_public_description():
    # The plan is a function of DataInfo (N, shape, classes), the target and the config:
    # it is fixed before any record is read.
    a = _plan(2.0)[1]
    b = RDPGANMethod().plan(DIGITS_INFO, PrivacyTarget(2.0, 1e-5), _plan(2.0)[0])
    assert a.events == b.events
    info = DataInfo(**{**DIGITS_INFO.__dict__, "fingerprint": "other"})
    c = RDPGANMethod().plan(info, PrivacyTarget(2.0, 1e-5), _plan(2.0)[0])
    assert c.events == a.events


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"mode": "paper-additive"}, "never reaches the gradient"),
        ({"mode": "paper-multiplicative"}, "not differentially private"),
        ({"schedule": "ant"}, "Rényi filter"),
        ({"arch": "conv", "width": "8"}, None),
        ({"n_d": "0"}, "n_d"),
        ({"decay": "1.5", "schedule": "step"}, "decay"),
        ({"frequency_anchor": "1"}, "frequency_share > 0"),
        ({"frequency_anchor": "-1", "frequency_share": "0.5"}, "frequency_anchor"),
    ],
)
def test_paper_modes_ant_and_bad_settings_are_refused(overrides, message):
    method = RDPGANMethod()
    config = method.config("tiny", overrides, DIGITS_INFO)
    if message is None:  # 8×8 is divisible by 4: conv is fine on digits
        method.validate_config(config, DIGITS_INFO)
        return
    with pytest.raises(UsageError, match=message):
        method.validate_config(config, DIGITS_INFO)


def test_conv_networks_have_no_batchnorm_in_d_and_the_right_shapes():
    from dpsynth.methods.rdpgan.generator import build_discriminator, build_generator

    for shape in ((1, 8, 8), (1, 28, 28)):
        info = DataInfo(**{**DIGITS_INFO.__dict__, "shape": shape})
        config = {"arch": "conv", "width": 8, "hidden": 16, "latent_dim": 4}
        d, g = build_discriminator(info, config), build_generator(info, config)
        assert not any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in d.modules())
        images = g(torch.randn(3, 4), F.one_hot(torch.arange(3), 10).float())
        assert images.shape == (3, *shape) and float(images.detach().abs().max()) <= 1.0
        assert d(images, F.one_hot(torch.arange(3), 10).float()).shape == (3,)


# --------------------------------------------------------------------------- end to end


def _train(tmp_path, name: str, **kwargs):
    from dpsynth.training import train_run

    return train_run(
        method="rdpgan",
        data="digits",
        epsilon=kwargs.pop("epsilon", 4.0),
        preset="tiny",
        out=tmp_path / name,
        ledger_path=tmp_path / f"{name}-ledger.jsonl",
        device="cpu",
        privacy_seed=4242,
        overrides=kwargs.pop("overrides", {"schedule": "step", "decay": "0.5", "step_every": "2"}),
        **kwargs,
    )


def test_resume_is_bit_identical_across_a_sigma_change(tmp_path, one_torch_thread):
    from safetensors.torch import load_file

    from dpsynth.training import train_run

    straight = _train(tmp_path, "straight")
    cut = _train(tmp_path, "cut", stop_after_steps=3)  # n_d = 2: inside iteration 1
    assert cut["interrupted"] and cut["steps"] == 3
    resumed = train_run(
        method="rdpgan", data="digits", epsilon=4.0, out=tmp_path / "cut", ledger_path=None,
        resume=True, device="cpu",
    )  # fmt: skip
    assert resumed["steps"] == straight["steps"] and resumed["ledger_status"] == "completed"
    a = load_file(str(tmp_path / "straight" / "checkpoint.safetensors"))
    b = load_file(str(tmp_path / "cut" / "checkpoint.safetensors"))
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=0, msg=key)


_ANCHORED = {"frequency_share": "0.5", "frequency_fit_steps": "20", "n_g": "8", "n_d": "1"}


def _anchor_distance(trainer: RDPGANTrainer, anchor: torch.nn.Module) -> float:
    """Mean squared distance of G's images to `anchor`'s at the same public latents."""
    z = torch.randn(64, trainer.net_g.latent_dim, generator=torch.Generator().manual_seed(3))
    onehot = F.one_hot(torch.arange(64) % 10, 10).float()
    with torch.no_grad():
        return float(F.mse_loss(trainer.net_g(z, onehot), anchor(z, onehot)))


def test_frequency_anchor_holds_g_near_its_copy_fitted_to_the_model(one_torch_thread):
    # The anchor is G as fitted to the DP frequency model, frozen: the GAN steps move G away
    # from it, and a heavy anchor keeps G closer. Off, the checkpoint holds no anchor.
    x, y = _digits(64)
    distances = {}
    for weight in ("0", "100"):
        trainer = _trainer(4.0, **_ANCHORED, frequency_anchor=weight)
        trainer.release_whole_data(0, x, y)
        fitted = copy.deepcopy(trainer.net_g)  # G as fitted to the model
        for _ in range(8):
            trainer.step(x[:32], y[:32])
        on = weight != "0"
        assert any(k.startswith("anchor.") for k in trainer.state_tensors()) == on
        if on:  # frozen: the anchor's weights are those G had after its fit
            pairs = zip(trainer.fit_penalty.net.parameters(), fitted.parameters(), strict=True)
            for frozen, start in pairs:
                assert torch.equal(frozen, start) and not frozen.requires_grad
        distances[weight] = _anchor_distance(trainer, fitted)
    assert distances["0"] > 0
    assert distances["100"] < 0.5 * distances["0"], distances


def test_resume_with_the_anchor_is_bit_identical(tmp_path, one_torch_thread):
    from safetensors.torch import load_file

    from dpsynth.training import train_run

    overrides = {**_ANCHORED, "frequency_anchor": "10"}
    straight = _train(tmp_path, "straight", overrides=overrides)
    cut = _train(tmp_path, "cut", overrides=overrides, stop_after_steps=3)
    assert cut["interrupted"]
    resumed = train_run(
        method="rdpgan", data="digits", epsilon=4.0, out=tmp_path / "cut", ledger_path=None,
        resume=True, device="cpu",
    )  # fmt: skip
    assert resumed["steps"] == straight["steps"]
    a = load_file(str(tmp_path / "straight" / "checkpoint.safetensors"))
    b = load_file(str(tmp_path / "cut" / "checkpoint.safetensors"))
    assert a.keys() == b.keys() and any(k.startswith("trainer/anchor.") for k in a)
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=0, msg=key)


def _cli_train_then_sample(
    tmp_path, epsilon: str, preset: str, sets: list[str], sample_args: list[str]
) -> tuple[dict, dict, dict]:
    """`train` rdpgan on digits into tmp_path/run (its own ledger), then `sample` 20 images into
    tmp_path/synth; the train JSON, the ledger's spend and the sample JSON."""
    from dpsynth.ledger import Ledger

    runner = CliRunner()
    ledger = tmp_path / "ledger.jsonl"
    options = [item for pair in (("--set", s) for s in sets) for item in pair]
    train = runner.invoke(
        app,
        ["train", "--method", "rdpgan", "--data", "digits", "--epsilon", epsilon,
         "--preset", preset, "--out", str(tmp_path / "run"), "--ledger", str(ledger),
         "--device", "cpu", *options, "--json"],
    )  # fmt: skip
    assert train.exit_code == 0, train.output
    result = json.loads(train.stdout)
    spend = Ledger(ledger).spend(result["ledger_seq"])
    sample = runner.invoke(
        app,
        ["sample", str(tmp_path / "run"), "--n", "20", "--out", str(tmp_path / "synth"),
         "--ledger", str(ledger), "--device", "cpu", *sample_args, "--json"],
    )  # fmt: skip
    assert sample.exit_code == 0, sample.output
    return result, spend, json.loads(sample.stdout)


def test_cli_train_sample_ledger_within_epsilon(tmp_path, one_torch_thread):
    result, spend, sample = _cli_train_then_sample(
        tmp_path, "2", "tiny", ["schedule=exp", "decay=0.2"], []
    )
    assert result["private"] and float(result["epsilon"]) <= 2.0
    assert spend["status"] == "completed" and float(spend["epsilon"]) <= 2.0
    assert _pld_epsilon(spend["events"], spend["delta"]) <= float(spend["epsilon"])
    assert len(spend["events"]) == 4  # one event per generator iteration's σ (n_g = 4)
    assert len(list((tmp_path / "synth").glob("**/*.png"))) == 20
    assert "ε ≤" in sample["privacy"]


def test_cli_refuses_the_paper_mode_without_spending_or_printing_an_epsilon(tmp_path):
    runner = CliRunner()
    ledger = tmp_path / "ledger.jsonl"
    result = runner.invoke(
        app,
        ["train", "--method", "rdpgan", "--data", "digits", "--epsilon", "0.5", "--preset",
         "tiny", "--out", str(tmp_path / "run"), "--ledger", str(ledger), "--device", "cpu",
         "--set", "mode=paper-additive"],
    )  # fmt: skip
    assert result.exit_code == 2
    assert "error:" in result.output and "never reaches the gradient" in result.output
    assert "ε ≤" not in result.output and "epsilon" not in result.output.lower().replace(
        "--epsilon inf", ""
    )
    assert not ledger.exists() or ledger.read_text().strip() == ""
    assert not (tmp_path / "run").exists()


def test_paper_preset_takes_a_step_at_mnist_size(one_torch_thread):
    info = DataInfo(**{**DIGITS_INFO.__dict__, "shape": (1, 28, 28), "n": 60_000})
    method = RDPGANMethod()
    config = method.config("paper", {"batch_size": "8"}, info)
    method.validate_config(config, info)
    plan = method.plan(info, PrivacyTarget(5.0, 1e-5), config)
    assert plan.steps == 5000 and plan.epsilon_bound <= 5.0
    trainer = RDPGANTrainer(info, config, plan, torch.device("cpu"), 0, PrivateRandomness(3))
    x = torch.rand(6, 1, 28, 28) * 2 - 1
    before = [p.clone() for p in trainer.net_d.parameters()]
    stats = trainer.step(x, torch.arange(6) % 10)
    assert math.isnan(stats["g_loss"])  # n_d = 5: no G step yet
    assert any(
        not torch.equal(a, b) for a, b in zip(before, trainer.net_d.parameters(), strict=True)
    )


def test_auto_picks_the_frequency_model_presets_for_images():
    # Public facts choose (the modality, the shape and ε): 28×28 images get `mnist` /
    # `mnist-eps1`, smaller images `small-freq` / `small-eps1` (ε ≤ 3).
    mnist = DataInfo(**{**DIGITS_INFO.__dict__, "shape": (1, 28, 28), "n": 4000})
    method = RDPGANMethod()
    assert method.recommended_preset(DIGITS_INFO, 10.0) == "small-freq"
    assert method.recommended_preset(DIGITS_INFO, 1.0) == "small-eps1"
    assert method.recommended_preset(DIGITS_INFO, 3.0) == "small-eps1"
    assert method.recommended_preset(mnist, 10.0) == "mnist"
    assert method.recommended_preset(mnist, 1.0) == "mnist-eps1"
    table = DataInfo(**{**DIGITS_INFO.__dict__, "modality": "table"})
    assert method.recommended_preset(table, 10.0) == "small"  # tables: TABLE_PRESETS
    cases = (("mnist", "class", mnist), ("mnist-eps1", "pooled", mnist))
    small = (("small-freq", "pooled", DIGITS_INFO), ("small-eps1", "pooled", DIGITS_INFO))
    for preset, covariance, info in (*cases, *small):
        config = method.config(preset, {}, info)
        method.validate_config(config, info)
        plan = method.plan(info, PrivacyTarget(1.0, 1e-5), config)
        (release,) = [e for e in plan.events if e.annotation("mechanism") == "frequency_model"]
        assert release.annotation("covariance") == covariance
        assert plan.epsilon_bound <= 1.0
        assert compose_epsilon(plan.events, 1e-5).epsilon <= 1.0
        # No teacher in a recommended preset (issue 45), and the GAN trains: ≥ 1,000 D steps.
        assert not [e for e in plan.events if e.annotation("mechanism") == "dp_classifier"]
        assert config["n_g"] * config["n_d"] >= 1000


def test_cli_auto_on_small_images_releases_the_fitted_frequency_model(tmp_path, one_torch_thread):
    # `--preset auto` on the 8×8 digits at ε = 1: `small-eps1`, whose frequency model covers
    # the whole image (the 10×10 band clipped to 8×8), G anchored to its fit; its release is
    # charged, and `sample` gives 8×8 images. A short fit keeps the test quick.
    result, spend, _ = _cli_train_then_sample(
        tmp_path, "1", "auto", ["frequency_fit_steps=5"], ["--format", "npz"]
    )
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["preset"] == "small-eps1" and float(result["epsilon"]) <= 1.0
    assert config["config"]["frequency_anchor"] == 0.3
    (model,) = [e for e in spend["events"] if e.get("mechanism") == "frequency_model"]
    assert model["covariance"] == "pooled" and model["band"] == 10
    assert not [e for e in spend["events"] if e.get("mechanism") == "dp_classifier"]
    assert compose_epsilon(spend["events"], spend["delta"]).epsilon <= 1.0
    with np.load(tmp_path / "synth" / "samples.npz") as images:
        assert images["x"].shape == (20, 1, 8, 8) and images["x"].std() > 0
