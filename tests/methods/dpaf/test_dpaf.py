"""The DPAF backend: SIN, DPAGG sensitivity and noise, window sampling and accounting, the
plan and ledger events, resume, and an end-to-end train → sample run."""

from __future__ import annotations

import functools
import json
import math

import pytest
import torch
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant, privacy_loss_distribution
from scipy.stats import binom

from dpsynth.data.images import DataInfo
from dpsynth.errors import AnchorError, UsageError
from dpsynth.methods.base import PrivacyTarget
from dpsynth.methods.dpaf import DPAFMethod
from dpsynth.methods.dpaf.model import Classifier, CondGenerator, Features, sin
from dpsynth.privacy.accounting.compose import compose_epsilon
from dpsynth.privacy.accounting.events import events_to_json
from dpsynth.privacy.accounting.plan_check import check_plan_parameters
from dpsynth.privacy.mechanisms.aggregation import (
    noisy_feature_sum,
    private_gradient_sum,
    split_window_noise,
    window_noise_multiplier,
    window_patterns,
    window_sampling_rate,
)
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


def _digits(n: int = 200) -> tuple[torch.Tensor, torch.Tensor]:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = torch.tensor(bunch.images[:n], dtype=torch.float32)[:, None] / 8.0 - 1.0
    return x, torch.tensor(bunch.target[:n], dtype=torch.int64)


@functools.lru_cache
def _plan(epsilon: float, **overrides):
    method = DPAFMethod()
    config = method.config("tiny", overrides, DIGITS_INFO)
    return config, method.plan(DIGITS_INFO, PrivacyTarget(epsilon, 1e-5), config)


def _features(seed: int = 0) -> Features:
    torch.manual_seed(seed)
    return Features((1, 8, 8), 10, width=8, conv1_layers=1, conv2_layers=1)


# --------------------------------------------------------------------------- SIN, DPAGG


def test_sin_gives_every_sample_the_norm_sqrt_m_p():
    maps = torch.randn(5, 16, 4, 4) * (torch.rand(5, 16, 1, 1) + 0.5) * 10 + 3.0
    rows = sin(maps)
    assert rows.shape == (5, 16 * 16)
    torch.testing.assert_close(rows.norm(dim=1), torch.full((5,), math.sqrt(16 * 16.0)))
    # every channel is standardised on its own, whatever the other samples are
    torch.testing.assert_close(sin(maps[2:3]), rows[2:3])


def test_features_rows_stay_within_the_bound_and_no_batchnorm_before_the_aggregation():
    features = _features()
    x, y = _digits(32)
    h = features(x, torch.nn.functional.one_hot(y, 10).float())
    assert features.bound == math.sqrt(features.dim) == 16.0  # m = 16 channels, p = 4
    assert (h.norm(dim=1) <= features.bound * (1 + 1e-6)).all()
    classifier = Classifier(_features(1), 16)
    for module in (features, classifier):
        assert not any(
            isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in module.modules()
        )
        assert not any(
            isinstance(m, (torch.nn.GroupNorm, torch.nn.LayerNorm)) for m in module.modules()
        )
    # a per-sample function: a record's features do not depend on the rest of the batch
    torch.testing.assert_close(
        features(x[3:4], torch.nn.functional.one_hot(y[3:4], 10).float()), h[3:4]
    )


def test_dpagg_sensitivity_on_neighbouring_batches_is_at_most_the_bound():
    features = _features()
    x, y = _digits(40)
    h = features(x, torch.nn.functional.one_hot(y, 10).float()).detach()
    # One hostile record: a feature row far outside the bound (as a numerical accident could
    # give); the defensive renorm must still cap its contribution.
    h = torch.cat([h, h[:1] * 1e4])
    zero = torch.Generator().manual_seed(0)
    full = noisy_feature_sum(h, features.bound, 0.0, zero)
    changes = []
    for index in range(h.shape[0]):  # remove one record
        rest = torch.cat([h[:index], h[index + 1 :]])
        changes.append(float((full - noisy_feature_sum(rest, features.bound, 0.0, zero)).norm()))
    extra = features(x[:1] * -1.0, torch.nn.functional.one_hot(y[:1], 10).float()).detach()
    added = noisy_feature_sum(torch.cat([h, extra]), features.bound, 0.0, zero)  # add one
    changes.append(float((added - full).norm()))
    assert max(changes) <= features.bound * (1 + 1e-5)
    assert changes[-2] == pytest.approx(features.bound, rel=1e-5)  # the hostile row, renormed
    assert min(changes) > 0.5 * features.bound  # SIN rows sit near the bound, not far below


def test_dpagg_and_conv2_noise_have_the_calibrated_std():
    gen = torch.Generator().manual_seed(3)
    draws = torch.stack(
        [noisy_feature_sum(torch.zeros(0, 256), 16.0, 0.7, gen) for _ in range(200)]
    )
    assert draws.std().item() == pytest.approx(0.7 * 16.0, rel=0.02)
    grads = {"w": torch.zeros(0, 100, 50)}
    noisy = torch.stack(
        [
            private_gradient_sum(
                grads, keep_fraction=0.9, max_norm=2.0, noise_multiplier=1.3, generator=gen
            )["w"]
            for _ in range(20)
        ]
    )
    assert noisy.std().item() == pytest.approx(1.3 * 2.0, rel=0.02)


def test_gradient_sum_compresses_and_clips_each_record():
    big = torch.arange(1.0, 101.0).repeat(3, 1) * torch.tensor([[1.0], [0.001], [50.0]])
    summed = private_gradient_sum(
        {"w": big},
        keep_fraction=0.9,
        max_norm=1.0,
        noise_multiplier=0.0,
        generator=torch.Generator(),
    )["w"]
    # each record keeps its 90 largest entries, then is clipped to norm ≤ 1
    kept = big.clone()
    kept[:, :10] = 0.0
    norms = kept.norm(dim=1, keepdim=True)
    expected = (kept * (1.0 / (norms + 1e-6)).clamp(max=1.0)).sum(0)
    torch.testing.assert_close(summed, expected)


# --------------------------------------------------------------------------- window sampling


def test_window_patterns_make_independent_poisson_batches():
    q, window, n = 0.05, 4, 400_000
    gen = torch.Generator().manual_seed(7)
    q_w = window_sampling_rate(q, window)
    union = torch.rand(n, generator=gen, dtype=torch.float64) < q_w
    patterns = torch.zeros(n, window, dtype=torch.bool)
    patterns[union] = window_patterns(int(union.sum()), window, q, gen)
    assert patterns[union].any(dim=1).all()  # every member joins at least one step
    rates = patterns.double().mean(0)
    assert torch.allclose(rates, torch.full((window,), q, dtype=torch.float64), rtol=0.03)
    both = (patterns[:, 0] & patterns[:, 1]).double().mean().item()
    assert both == pytest.approx(q * q, rel=0.1)  # independent steps, not q/μ-style splits
    counts = patterns.sum(1)
    for k in range(window + 1):
        expected = binom.pmf(k, window, q)
        # within 4 standard errors of the frequency
        assert (counts == k).double().mean().item() == pytest.approx(
            expected, abs=4 * math.sqrt(expected * (1 - expected) / n)
        )


# --------------------------------------------------------------------------- accounting


def _mixture_event(q: float, window: int, agg_sigma: float, conv2_sigma: float):
    shifts = [0.0] + [
        math.sqrt(k / agg_sigma**2 + 1 / conv2_sigma**2) for k in range(1, window + 1)
    ]
    probs = [float(binom.pmf(k, window, q)) for k in range(window + 1)]
    return dp_event.MixtureOfGaussiansDpEvent(1.0, shifts, probs)


@pytest.mark.parametrize(
    "q, window, agg_sigma, conv2_sigma, windows",
    [(0.01, 4, 3.0, 1.5, 50), (0.02, 8, 2.0, 2.0, 20), (0.05, 2, 1.0, 4.0, 10)],
)
def test_window_fallback_dominates_the_mixture_in_both_directions(
    q, window, agg_sigma, conv2_sigma, windows
):
    delta = 1e-5
    sigma_w = window_noise_multiplier(agg_sigma, conv2_sigma, window)
    q_w = window_sampling_rate(q, window)
    mixture = privacy_loss_distribution.from_mixture_gaussian_mechanism(
        standard_deviation=1.0,
        sensitivities=_mixture_event(q, window, agg_sigma, conv2_sigma).sensitivities,
        sampling_probs=_mixture_event(q, window, agg_sigma, conv2_sigma).sampling_probs,
        value_discretization_interval=1e-3,
    ).self_compose(windows)
    # dp-accounting builds both directions for the mixture and reports their maximum
    assert not mixture._symmetric
    eps_remove = mixture._pmf_remove.get_epsilon_for_delta(delta)
    eps_add = mixture._pmf_add.get_epsilon_for_delta(delta)
    assert mixture.get_epsilon_for_delta(delta) == max(eps_remove, eps_add)
    assert eps_remove != eps_add
    fallback = compose_epsilon(
        [
            {
                "type": "poisson_gaussian",
                "noise_multiplier": sigma_w,
                "sampling_rate": q_w,
                "steps": windows,
            }
        ],
        delta,
    ).epsilon
    assert fallback >= eps_remove and fallback >= eps_add
    # the same fallback under dp-accounting's own PLD also dominates (not an accountant quirk)
    accountant = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-3)
    accountant.compose(
        dp_event.PoissonSampledDpEvent(q_w, dp_event.GaussianDpEvent(sigma_w)), windows
    )
    assert accountant.get_epsilon(delta) >= max(eps_remove, eps_add)


def test_window_noise_split_is_exact():
    for ratio in (0.5, 1.0, 2.0):
        agg, conv2 = split_window_noise(1.3, 8, ratio)
        assert agg / conv2 == pytest.approx(ratio)
        assert window_noise_multiplier(agg, conv2, 8) == pytest.approx(1.3)


def test_plan_events_phases_and_target():
    config, plan = _plan(5.0)
    phase1, phase2 = events_to_json(plan.events)
    assert plan.steps == config["c_steps"] + config["windows"]
    assert phase1["steps"] == config["c_steps"] and phase2["steps"] == config["windows"]
    q = config["batch_size"] / DIGITS_INFO.n
    assert plan.sampling_rate == pytest.approx(1 - (1 - q) ** config["window"])
    assert "fallback" in phase2["accounting"] and "mixture" in phase2["accounting"]
    assert window_noise_multiplier(
        phase2["agg_noise_multiplier"], phase2["conv2_noise_multiplier"], config["window"]
    ) == pytest.approx(plan.noise_multiplier)
    assert plan.epsilon_bound <= 5.0
    assert compose_epsilon(plan.events, plan.delta).epsilon == pytest.approx(plan.epsilon_bound)
    # the loop's (σ, q, T) are covered by the phases together; an edited σ is not
    check_plan_parameters(
        plan.events,
        private=True,
        noise_multiplier=plan.noise_multiplier,
        sampling_rate=plan.sampling_rate,
        steps=plan.steps,
        run_name="r",
    )
    with pytest.raises(AnchorError):
        check_plan_parameters(
            plan.events,
            private=True,
            noise_multiplier=plan.noise_multiplier * 0.9,
            sampling_rate=plan.sampling_rate,
            steps=plan.steps,
            run_name="r",
        )
    _, random_plan = _plan(5.0, conv1_init="random")
    assert len(random_plan.events) == 1 and random_plan.steps == config["windows"]


def test_paper_mode_and_bad_settings_are_refused():
    method = DPAFMethod()
    # mode=paper exists only behind the explicit flag (tests/methods/dpaf/test_dpaf_paper.py), never
    # with the strict presets' learning, and no other mode is accepted
    with pytest.raises(UsageError, match="paper"):
        method.config("small", {"mode": "paper"}, DIGITS_INFO)
    with pytest.raises(UsageError, match="mode"):
        method.config("tiny", {"mode": "loose"}, DIGITS_INFO)
    with pytest.raises(UsageError):
        method.config("tiny", {"batch_size": "5000"}, DIGITS_INFO)
    with pytest.raises(UsageError):
        method.config("tiny", {"grad_keep": "0"}, DIGITS_INFO)


def test_trainer_uses_the_planned_noise_and_a_secret_stream():
    config, plan = _plan(5.0)
    trainer = DPAFMethod().trainer(DIGITS_INFO, config, plan, torch.device("cpu"), 0)
    assert trainer.c_sigma == plan.noise_multiplier
    assert window_noise_multiplier(trainer.agg_sigma, trainer.conv2_sigma, trainer.window) == (
        pytest.approx(plan.noise_multiplier)
    )
    x, y = _digits(40)
    # same public seed, different secrets: different updates (noise from the secret only)
    outs = []
    for secret in (1, 2):
        t = DPAFMethod().trainer(
            DIGITS_INFO, config, plan, torch.device("cpu"), 0, PrivateRandomness(secret)
        )
        for _ in range(config["c_steps"] + 1):
            t.step(x, y)
        outs.append(torch.cat([p.flatten() for p in t.net_g.parameters()]))
    assert not torch.equal(outs[0], outs[1])


def test_generator_shapes():
    for shape in ((1, 8, 8), (1, 28, 28), (3, 32, 32)):
        net = CondGenerator(shape, 10, 16, 8)
        out = net(torch.randn(3, 16), torch.eye(10)[:3])
        assert out.shape == (3, *shape) and out.abs().max() <= 1.0
    mnist = Features((1, 28, 28), 10, width=64, conv1_layers=2, conv2_layers=1)
    assert (mnist.channels, mnist.dim, mnist.bound) == (256, 4096, 64.0)  # spec §2.8


# --------------------------------------------------------------------------- end to end


def _train(tmp_path, name: str, **kwargs):
    from dpsynth.training import train_run

    return train_run(
        method="dpaf",
        data="digits",
        epsilon=kwargs.pop("epsilon", 8.0),
        preset="tiny",
        out=tmp_path / name,
        ledger_path=tmp_path / f"{name}-ledger.jsonl",  # separate budgets: equal plans
        device="cpu",
        privacy_seed=kwargs.pop("privacy_seed", 4242),
        **kwargs,
    )


def _weights(run) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(run / "checkpoint.safetensors"))


def test_resume_across_the_phase_boundary_equals_the_straight_run(tmp_path, one_torch_thread):
    straight = _train(tmp_path, "straight")
    cut = _train(tmp_path, "cut", stop_after_steps=3)  # c_steps = 2: stops inside phase 2
    assert cut["interrupted"] and cut["steps"] == 3
    from dpsynth.training import train_run

    resumed = train_run(
        method="dpaf",
        data="digits",
        epsilon=8.0,
        out=tmp_path / "cut",
        ledger_path=None,
        resume=True,
        device="cpu",
    )
    assert resumed["steps"] == straight["steps"] and resumed["ledger_status"] == "completed"
    a, b = _weights(tmp_path / "straight"), _weights(tmp_path / "cut")
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=0, msg=key)


def test_end_to_end_ledger_reaccounted_under_pld_and_sample(tmp_path, one_torch_thread):
    from dpsynth.ledger import Ledger
    from dpsynth.sampling import sample_run

    result = _train(tmp_path, "run", epsilon=3.0)
    printed = float(result["epsilon"])
    assert printed <= 3.0
    spend = Ledger(tmp_path / "run-ledger.jsonl").spend(result["ledger_seq"])
    assert spend["status"] == "completed"
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert spend["events"] == config["privacy"]["events"]  # the phases, not rewritten
    # Re-account the recorded events with dp-accounting's PLD, the window as the exact
    # mixture-of-Gaussians event: it must not exceed the printed ε.
    accountant = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-3)
    for event in spend["events"]:
        if "window" in event:
            mixture = _mixture_event(
                event["step_sampling_rate"],
                event["window"],
                event["agg_noise_multiplier"],
                event["conv2_noise_multiplier"],
            )
            accountant.compose(mixture, event["steps"])
        else:
            accountant.compose(
                dp_event.PoissonSampledDpEvent(
                    event["sampling_rate"], dp_event.GaussianDpEvent(event["noise_multiplier"])
                ),
                event["steps"],
            )
    assert accountant.get_epsilon(spend["delta"]) <= printed
    out = sample_run(
        tmp_path / "run",
        n=30,
        out_dir=tmp_path / "synth",
        ledger_path=tmp_path / "run-ledger.jsonl",
        device="cpu",
    )
    assert out["n"] == 30
    pngs = sorted((tmp_path / "synth").glob("**/*.png"))
    assert len(pngs) == 30


def test_paper_preset_runs_a_window_at_mnist_size(one_torch_thread):
    info = DataInfo("mnist", "images", 5000, (1, 28, 28), DIGITS_INFO.classes, "t", "mnist")
    method = DPAFMethod()
    config = method.config("paper", {"conv1_init": "random"}, info)
    plan = method.plan(info, PrivacyTarget(10.0, 1e-5), config)
    trainer = method.trainer(info, config, plan, torch.device("cpu"), 0, PrivateRandomness(1))
    assert trainer.features.dim == 4096 and trainer.window == 8
    before = [p.clone() for p in trainer.conv2_params.values()]
    x = torch.rand(6, 1, 28, 28) * 2 - 1
    stats = trainer.step(x, torch.arange(6))
    assert math.isfinite(stats["d_loss"])
    assert all(
        not torch.equal(a, b) for a, b in zip(before, trainer.conv2_params.values(), strict=True)
    )
    images = next(trainer.generator().sample(torch.arange(4), 4, torch.Generator()))
    assert images.shape == (4, 1, 28, 28) and images.dtype == torch.uint8


@pytest.mark.parametrize("transfer_conv2", [False, True])
def test_phase1_trains_c_privately_and_transfers_conv1(transfer_conv2, one_torch_thread):
    config, plan = _plan(5.0, transfer_conv2=transfer_conv2)
    trainer = DPAFMethod().trainer(
        DIGITS_INFO, config, plan, torch.device("cpu"), 0, PrivateRandomness(5)
    )
    classifier = trainer.classifier
    c_conv1_start = [p.clone() for p in classifier.features.conv1_parameters()]
    d_conv2_start = [p.clone() for p in trainer.conv2_params.values()]
    x, y = _digits(60)
    for _ in range(config["c_steps"]):
        assert trainer.d_steps == 0  # phase 1 touches neither D's head nor G
        trainer.step(x, y)
    assert trainer.classifier is None  # phase 1 is over after c_steps loop steps
    c_conv1 = list(classifier.features.conv1_parameters())
    assert all(not torch.equal(a, b) for a, b in zip(c_conv1, c_conv1_start, strict=True))
    for d, c in zip(trainer.features.conv1_parameters(), c_conv1, strict=True):
        assert torch.equal(d, c) and not d.requires_grad
    conv2_copied = [
        torch.equal(d, c)
        for d, c in zip(
            trainer.conv2_params.values(), classifier.features.conv2.parameters(), strict=True
        )
    ]
    assert all(conv2_copied) == transfer_conv2
    if not transfer_conv2:
        for d, start in zip(trainer.conv2_params.values(), d_conv2_start, strict=True):
            assert torch.equal(d, start)


def test_conv2_per_record_gradients_equal_a_per_record_loop(monkeypatch):
    import dpsynth.methods.dpaf.phase2 as module

    config, plan = _plan(5.0)
    trainer = DPAFMethod().trainer(DIGITS_INFO, config, plan, torch.device("cpu"), 0)
    features = trainer.features
    x, y = _digits(5)
    onehot = torch.nn.functional.one_hot(y, 10).float()
    weights = torch.randn(5, features.dim)
    grads = {}

    def capture(per_record, **kwargs):
        grads.update(per_record)
        return {n: torch.zeros_like(g[0]) for n, g in per_record.items()}

    monkeypatch.setattr(module, "private_gradient_sum", capture)
    no_fake = [(x[:1], onehot[:1], torch.zeros(features.dim))]
    trainer._conv2_step(x, onehot, weights, no_fake)
    for i in range(5):
        features.zero_grad()
        (features(x[i : i + 1], onehot[i : i + 1])[0] * weights[i]).sum().backward()
        for name, p in trainer.conv2_params.items():
            scale = float(p.grad.abs().max())  # float32 sums of terms of size ~50
            torch.testing.assert_close(grads[name][i], p.grad, rtol=1e-5, atol=1e-5 * scale)


@pytest.mark.parametrize("view", ["sample", "aggregate"])
def test_generator_step_updates_only_the_generator(view):
    config, plan = _plan(5.0, g_view=view)
    trainer = DPAFMethod().trainer(DIGITS_INFO, config, plan, torch.device("cpu"), 0)
    d_before = [p.clone() for p in [*trainer.features.parameters(), *trainer.head.parameters()]]
    g_before = [p.clone() for p in trainer.net_g.parameters()]
    loss = trainer._generator_step()  # takes no data argument: G never sees a record
    assert math.isfinite(loss)
    d_after = [*trainer.features.parameters(), *trainer.head.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(d_before, d_after, strict=True))
    assert any(
        not torch.equal(a, b) for a, b in zip(g_before, trainer.net_g.parameters(), strict=True)
    )
