"""PSG backend: mechanism, match loss, plan, trainer, resume, sampling and end-to-end runs."""

from __future__ import annotations

import dataclasses
import functools
import math

import pytest
import torch
from torch.nn import functional as F

from dpsynth.data.images import DataInfo
from dpsynth.errors import UsageError
from dpsynth.methods.base import ClippedGaussianSum, PrivacyTarget
from dpsynth.methods.psg import PSGMethod
from dpsynth.methods.psg.generator import PSGGenerator
from dpsynth.methods.psg.matching import layer_distance, match_loss
from dpsynth.methods.psg.model import ConvNet
from dpsynth.privacy.mechanisms.dpsgd import per_sample_grads
from dpsynth.privacy.mechanisms.poisson import PoissonSampler
from dpsynth.privacy.mechanisms.randomness import PrivateRandomness

pytestmark = pytest.mark.usefixtures("one_torch_thread")

CPU = torch.device("cpu")


def _info(n: int = 1000) -> DataInfo:
    return DataInfo(
        spec="digits",
        kind="images",
        n=n,
        shape=(1, 8, 8),
        classes=tuple(str(c) for c in range(10)),
        fingerprint="test",
        dataset_id="digits",
    )


@functools.lru_cache
def _digits(split: str = "train") -> tuple[torch.Tensor, torch.Tensor]:
    from dpsynth.data.sources import load_data

    data = load_data("digits" if split == "train" else "digits:test")
    return data.as_float(), data.y


@functools.lru_cache
def _plan(epsilon: float, **overrides):
    method = PSGMethod()
    config = method.config("tiny", overrides, _info())
    return config, method.plan(_info(), PrivacyTarget(epsilon, 1e-5), config)


def _trainer(epsilon: float, seed: int = 0, randomness=None, plan=None, **overrides):
    config, default_plan = _plan(epsilon, **overrides)
    plan = plan or default_plan
    trainer = PSGMethod().trainer(_info(), config, plan, CPU, seed, randomness)
    return config, plan, trainer


def _loop_clipped_sum(trainer, x, y, clip: float) -> list[torch.Tensor]:
    """Σ_i clip(∇_θ ℓ(x_i, y_i)) by plain autograd, one record at a time (flat norm)."""
    total = [torch.zeros_like(p) for p in trainer.net.parameters()]
    for i in range(x.shape[0]):
        trainer.net.zero_grad()
        F.cross_entropy(trainer.net(x[i : i + 1]), y[i : i + 1]).backward()
        grads = [p.grad.detach().clone() for p in trainer.net.parameters()]
        norm = torch.sqrt(sum(g.pow(2).sum() for g in grads))
        factor = min(1.0, clip / (float(norm) + 1e-6))
        total = [t + factor * g for t, g in zip(total, grads, strict=True)]
    trainer.net.zero_grad(set_to_none=True)
    return total


def test_per_example_gradients_match_a_loop_and_clip_flat_to_c():
    x, y = _digits()
    x, y = x[:12], y[:12]
    _, plan, trainer = _trainer(10.0)
    names = [n for n, _ in trainer.net.named_parameters()]
    batched = per_sample_grads(trainer.net, trainer._record_loss, (x, y))
    for i in range(3):
        trainer.net.zero_grad()
        F.cross_entropy(trainer.net(x[i : i + 1]), y[i : i + 1]).backward()
        for name, p in trainer.net.named_parameters():
            assert torch.allclose(batched[name][i], p.grad, atol=1e-6, rtol=1e-4), name
    # The mechanism with its noise switched off releases exactly Σ clip(g_i) / B, with the
    # clip over ALL parameters flattened together (biases and norm affines included).
    silent = dataclasses.replace(plan, gaussian_sum=ClippedGaussianSum(0.0, plan.max_grad_norm))
    _, _, quiet = _trainer(10.0, plan=silent)
    quiet.private_gradient.compute(x, y)
    released = [p.grad.clone() for p in quiet.net.parameters()]
    expected = _loop_clipped_sum(quiet, x, y, plan.max_grad_norm)
    for name, got, want in zip(names, released, expected, strict=True):
        want = want / plan.expected_batch_size
        assert torch.allclose(got, want, atol=1e-8, rtol=1e-4), name
    # every record's raw gradient is larger than C here, so clipping matters
    norms = torch.stack([g.flatten(1).norm(dim=1) for g in batched.values()]).norm(dim=0)
    assert (norms > plan.max_grad_norm).all()
    total = torch.sqrt(sum(g.pow(2).sum() for g in released)) * plan.expected_batch_size
    assert total <= x.shape[0] * plan.max_grad_norm * (1 + 1e-5)


def test_noise_std_is_sigma_c_and_comes_from_the_secret_stream():
    _, plan, trainer = _trainer(1.0, randomness=PrivateRandomness(5))
    empty_x, empty_y = torch.zeros(0, 1, 8, 8), torch.zeros(0, dtype=torch.int64)
    draws = []
    for _ in range(10):  # a release with no record in it is pure noise
        trainer.private_gradient.compute(empty_x, empty_y)
        draws.append(torch.cat([p.grad.flatten() for p in trainer.net.parameters()]))
    assert not torch.equal(draws[0], draws[1])  # a fresh draw per release
    noise = torch.cat(draws) * plan.expected_batch_size  # the noise on the SUM
    assert noise.numel() > 5000
    want = plan.noise_multiplier * plan.max_grad_norm
    assert abs(float(noise.std()) / want - 1.0) < 4.0 / math.sqrt(noise.numel())
    assert abs(float(noise.mean())) < 4.0 * want / math.sqrt(noise.numel())
    # The same secret gives the same noise whatever the public seed; another secret differs.
    first = draws[0]
    draws = []
    for seed, secret in ((0, 5), (99, 5), (0, 6)):
        _, _, other = _trainer(1.0, seed=seed, randomness=PrivateRandomness(secret))
        other.private_gradient.compute(empty_x, empty_y)
        draws.append(torch.cat([p.grad.flatten() for p in other.net.parameters()]))
    assert torch.equal(draws[0], first)
    assert torch.equal(draws[0], draws[1])
    assert not torch.allclose(draws[0], draws[2])


def test_match_loss_equals_the_row_cosine_formula():
    gen = torch.Generator().manual_seed(0)
    shapes = [(4, 3, 3, 3), (4,), (5, 6), (2, 3, 4), (5,)]
    syn = [torch.randn(s, generator=gen, dtype=torch.float64) for s in shapes]
    real = [torch.randn(s, generator=gen, dtype=torch.float64) for s in shapes]
    want = 0.0
    for a, b in zip(syn, real, strict=True):
        if a.dim() == 1:
            continue  # 1-D tensors are not matched
        rows_a, rows_b = a.reshape(a.shape[0], -1), b.reshape(b.shape[0], -1)
        for i in range(rows_a.shape[0]):
            dot = float(torch.dot(rows_a[i], rows_b[i]))
            norms = float(rows_a[i].norm()) * float(rows_b[i].norm())
            want += 1.0 - dot / (norms + 1e-6)
    assert float(match_loss(syn, real)) == pytest.approx(want, rel=1e-12)
    # 1-D parameters contribute 0, whatever their values
    assert float(layer_distance(syn[1], -real[1])) == 0.0
    # invariant to a positive rescaling of each row of the real gradient
    scaled = [
        b
        * (torch.rand(b.shape[0], generator=gen, dtype=torch.float64) * 9 + 0.1).view(
            -1, *([1] * (b.dim() - 1))
        )
        for b in real
    ]
    assert float(match_loss(syn, scaled)) == pytest.approx(want, rel=1e-6)  # up to the 1e-6
    # zero for identical gradients (up to the 1e-6 term), 2 per row for opposite ones
    assert float(match_loss(syn, syn)) == pytest.approx(0.0, abs=1e-5)
    rows = sum(a.shape[0] for a in syn if a.dim() > 1)
    assert float(match_loss(syn, [-a for a in syn])) == pytest.approx(2.0 * rows, rel=1e-5)


def test_convnet_parameter_counts_and_no_batchnorm():
    assert sum(p.numel() for p in ConvNet((1, 28, 28), 10).parameters()) == 317_706
    assert sum(p.numel() for p in ConvNet((3, 32, 32), 10).parameters()) == 320_010
    assert ConvNet((1, 28, 28), 10)(torch.zeros(2, 1, 28, 28)).shape == (2, 10)
    with pytest.raises(UsageError):
        PSGMethod().config("tiny", {"norm": "batch"}, _info())


def test_plan_counts_every_release_and_steps_cannot_be_overridden():
    method = PSGMethod()
    config = method.config("tiny", {"runs": "3", "outer_loop": "2", "batches": "4"}, _info())
    assert config["steps"] == 3 * 2 * 4
    plan = method.plan(_info(), PrivacyTarget(5.0, 1e-5), config)
    assert plan.steps == 24
    assert plan.sampling_rate == pytest.approx(config["batch_size"] / 1000)
    (event,) = plan.events
    assert event.to_json() == {
        "type": "poisson_gaussian",
        "noise_multiplier": plan.noise_multiplier,
        "sampling_rate": plan.sampling_rate,
        "steps": 24,
    }
    with pytest.raises(UsageError):
        method.config("tiny", {"steps": "5"}, _info())
    with pytest.raises(UsageError):
        method.plan(_info(), PrivacyTarget(5.0, 1e-5), {**config, "steps": 23})
    assert {"tiny", "small", "quick", "paper-multi-hour"} <= set(method.presets)


def test_poisson_rate_and_empty_batches_are_counted_steps():
    _, plan, trainer = _trainer(1.0, randomness=PrivateRandomness(3))
    sampler = PoissonSampler(1000, plan.sampling_rate, PrivateRandomness(4).generator("b"))
    sizes = torch.tensor([float(sampler.next().numel()) for _ in range(2000)])
    expected = plan.sampling_rate * 1000
    assert abs(float(sizes.mean()) - expected) < 4 * math.sqrt(expected / 2000)
    before = trainer.images.detach().clone()
    trainer.step(torch.zeros(0, 1, 8, 8), torch.zeros(0, dtype=torch.int64))
    assert trainer.steps_done == 1
    assert not torch.equal(before, trainer.images.detach())  # a noise-only release still moves S


def test_network_is_redrawn_each_run_and_trained_on_s_between_rounds():
    x, y = _digits()
    config, _, trainer = _trainer(math.inf)
    per_run = config["outer_loop"] * config["batches"]

    def weights(net) -> torch.Tensor:
        return torch.cat([p.detach().flatten() for p in net.parameters()])

    after = []
    initial = weights(trainer.net)
    for _ in range(per_run + 1):
        trainer.step(x[:16], y[:16])
        after.append(weights(trainer.net))
    # the K batches of a round share θ; after a round's last batch θ trains on S ...
    assert torch.equal(after[0], initial)
    assert not torch.equal(after[1], initial)
    # ... except after the run's last round; the next run starts from a fresh public init
    assert torch.equal(after[per_run - 1], after[per_run - 2])
    assert not torch.allclose(after[per_run], after[per_run - 1])
    assert not torch.allclose(after[per_run], initial)
    _, _, other = _trainer(1.0)  # same public seed: the same network for run 1
    other._fresh_network(1)
    assert torch.equal(weights(other.net), after[per_run])


@pytest.mark.parametrize(
    ("overrides", "optimiser_key"),
    [
        ({}, "synthetic.momentum"),
        ({"prior": "dcgan", "prior_width": 8}, "prior.optimizer.0.exp_avg"),
    ],
    ids=["pixels", "prior"],
)
def test_resume_continues_exactly(overrides, optimiser_key):
    x, y = _digits()
    gen = torch.Generator().manual_seed(1)
    batches = []
    for _ in range(8):  # two runs of the tiny preset: crosses a network redraw and θ's epochs
        mask = torch.rand(len(y), generator=gen) < 16 / len(y)
        batches.append((x[mask], y[mask]))
    _, _, straight = _trainer(1.0, randomness=PrivateRandomness(7), **overrides)
    for bx, by in batches:
        straight.step(bx, by)
    first_randomness = PrivateRandomness(7)
    config, plan, first = _trainer(1.0, randomness=first_randomness, **overrides)
    for bx, by in batches[:3]:
        first.step(bx, by)
    saved = {k: v.clone() for k, v in first.state_tensors().items()}
    assert optimiser_key in saved  # S's optimiser state (momentum, or the prior's Adam)
    saved_streams = first_randomness.state()
    resumed_randomness = PrivateRandomness(8)
    resumed = PSGMethod().trainer(_info(), config, plan, CPU, 0, resumed_randomness)
    resumed.load_state_tensors(saved)
    resumed_randomness.load_state(saved_streams)
    for bx, by in batches[3:]:
        resumed.step(bx, by)
    a, b = straight.state_tensors(), resumed.state_tensors()
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def _accuracy_of_a_classifier_trained_on(images, labels) -> float:
    x_test, y_test = _digits("test")
    torch.manual_seed(0)
    net = ConvNet((1, 8, 8), 10, width=16, depth=2)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
    for _ in range(200):
        loss = F.cross_entropy(net(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        return float((net(x_test).argmax(1) == y_test).float().mean())


def test_non_private_psg_learns_digits():
    x, y = _digits()
    overrides = {"spc": 5, "runs": 6, "outer_loop": 5, "batches": 4, "inner_loop": 5}
    overrides |= {"width": 16, "batch_size": 64, "lr_syn": 1.0}
    _, plan, trainer = _trainer(math.inf, **overrides)
    assert not plan.private
    before = _accuracy_of_a_classifier_trained_on(trainer.images.detach(), trainer.labels)
    sampler = PoissonSampler(len(y), 64 / len(y), torch.Generator().manual_seed(0))
    for _ in range(plan.steps):
        index = sampler.next()
        trainer.step(x[index], y[index])
    after = _accuracy_of_a_classifier_trained_on(trainer.images.detach(), trainer.labels)
    assert before < 0.2
    assert after > 0.5


def _marked_set(spc: int = 3, classes: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """S whose member j of class c is a constant image with value distinct per member."""
    labels = torch.arange(classes).repeat_interleave(spc)
    values = torch.linspace(-0.9, 0.9, classes * spc)
    images = values.view(-1, 1, 1, 1).expand(-1, 1, 8, 8).clone()
    images[:, :, 2:6, 3:5] = 1.0  # structure, so an augmentation changes pixels
    return images, labels


def _draw(generator: PSGGenerator, labels: torch.Tensor, batch: int, seed: int) -> torch.Tensor:
    rng = torch.Generator().manual_seed(seed)
    out = []
    for start in range(0, labels.numel(), batch):  # chunked, as dpsynth.sampling calls it
        out += list(generator.sample(labels[start : start + batch], batch, rng))
    return torch.cat(out)


def test_sample_cycles_per_class_and_augments_repeats_deterministically():
    from dpsynth.data.images import to_uint8

    images, labels = _marked_set()
    classes = ("a", "b", "c", "d")
    wanted = torch.arange(4).repeat_interleave(7)  # 7 per class with spc 3: 3 exact + 4 repeats
    fresh = functools.partial(PSGGenerator, images, labels, classes, CPU)
    out = _draw(fresh(), wanted, batch=5, seed=1)
    assert out.shape == (28, 1, 8, 8) and out.dtype == torch.uint8
    base = to_uint8(images)
    for c in range(4):
        got = out[wanted == c]
        for j in range(3):  # first copies: the members in order, unchanged
            assert torch.equal(got[j], base[3 * c + j])
        repeats = got[3:]
        changed = [not torch.equal(r, base[3 * c + j % 3]) for j, r in enumerate(repeats)]
        assert sum(changed) >= 3  # augmented (a zero shift can leave one unchanged)
    assert torch.equal(out, _draw(fresh(), wanted, batch=28, seed=1))  # chunking-invariant
    assert not torch.equal(out, _draw(fresh(), wanted, batch=5, seed=2))
    exact = _draw(fresh(augment_replicas=False), wanted, batch=5, seed=1)
    for c in range(4):
        got = exact[wanted == c]
        for j in range(7):
            assert torch.equal(got[j], base[3 * c + j % 3])
    details = fresh().release_details(torch.bincount(wanted, minlength=4).tolist())
    assert details["unique_base_samples"] == 12 and details["spc"] == 3
    assert details["replication_factor"] == 3 and details["augmented"] is True
    assert fresh().release_details([1, 1, 1, 1])["augmented"] is False


def test_end_to_end_train_resume_sample_and_ledger(tmp_path):
    from dpsynth.ledger import Ledger
    from dpsynth.rundir import RunDir
    from dpsynth.sampling import manifest_of, sample_run
    from dpsynth.training import train_run

    common = {
        "method": "psg",
        "data": "digits",
        "epsilon": 5.0,
        "preset": "tiny",
        "device": "cpu",
        "seed": 0,
        "privacy_seed": 4242,  # the same secret for both runs (injectable in tests only)
    }
    train_run(out=tmp_path / "a", ledger_path=tmp_path / "a.jsonl", **common)
    train_run(out=tmp_path / "b", ledger_path=tmp_path / "b.jsonl", stop_after_steps=3, **common)
    train_run(out=tmp_path / "b", ledger_path=tmp_path / "b.jsonl", resume=True, **common)
    (straight, s_state), (resumed, r_state) = (
        RunDir(tmp_path / name).load_checkpoint() for name in ("a", "b")
    )
    assert s_state["step"] == r_state["step"] == 8  # R·T·K = 2·2·2
    keys = [k for k in straight if k.startswith("trainer/")]
    assert "trainer/synthetic.images" in keys
    for key in keys:
        assert torch.equal(straight[key], resumed[key]), key

    dp_event = pytest.importorskip("dp_accounting.dp_event")
    pld = pytest.importorskip("dp_accounting.pld.pld_privacy_accountant")
    run_config = RunDir(tmp_path / "b").read_config()
    events = Ledger(tmp_path / "b.jsonl").events_for("digits")
    assert [e["type"] for e in events] == ["poisson_gaussian"]
    assert events[0]["steps"] == run_config["privacy"]["steps"] == 8
    accountant = pld.PLDAccountant()
    accountant.compose(
        dp_event.PoissonSampledDpEvent(
            events[0]["sampling_rate"], dp_event.GaussianDpEvent(events[0]["noise_multiplier"])
        ),
        events[0]["steps"],
    )
    assert accountant.get_epsilon(run_config["privacy"]["delta"]) <= float(
        run_config["privacy"]["epsilon_bound"]
    )
    assert float(run_config["privacy"]["epsilon_bound"]) <= 5.0

    out = tmp_path / "synth"
    result = sample_run(tmp_path / "a", 45, out, ledger_path=tmp_path / "a.jsonl", device="cpu")
    assert len(list(out.rglob("*.png"))) == 45
    manifest = manifest_of(out)
    assert manifest["label_counts"] == [5] * 5 + [4] * 5
    details = manifest["generator"]
    assert details["unique_base_samples"] == 20 and details["spc"] == 2
    assert details["replication_factor"] == 3 and details["augmented"] is True
    assert result["generator"] == details


def test_paper_setting_releases_and_the_papers_sigma_under_our_accountant():
    # Spec §3.4/§9.3.5: MNIST (N = 60 000, B = 256, spc 10: T = 10, K = 10). The paper's
    # RDP-calibrated σ gives a PRV upper bound just below its target ε.
    from dpsynth.privacy.accounting.compose import epsilon_for

    mnist = dataclasses.replace(_info(60_000), shape=(1, 28, 28))
    method = PSGMethod()
    config = method.config("paper-multi-hour", {}, mnist)
    assert config["steps"] == 1000 * 10 * 10
    assert method.config("paper-multi-hour", {"runs": "200"}, mnist)["steps"] == 20_000
    q = config["batch_size"] / mnist.n
    at_ten = epsilon_for(0.9657, q, 100_000, 1e-5)
    assert 9.29 <= at_ten.epsilon <= 9.36 and at_ten.estimate == pytest.approx(9.291, abs=0.01)
    at_one = epsilon_for(2.553, q, 20_000, 1e-5)
    assert 0.914 <= at_one.epsilon <= 0.93 and at_one.estimate == pytest.approx(0.914, abs=0.003)


def test_warm_start_initialises_s_from_the_released_means():
    from dpsynth.privacy.releases.central import CentralImages

    means = torch.linspace(-0.9, 0.9, 10)[:, None, None, None].expand(10, 1, 8, 8).clone()
    release = CentralImages(means=means, counts=torch.full((10,), 100.0))
    _, _, trainer = _trainer(1.0, warm_start_share=0.3, warm_start_jitter=0.0)
    assert not torch.allclose(trainer.images.detach(), means[trainer.labels])  # N(0, 1) before
    trainer.warm_start(release)
    assert torch.equal(trainer.images.detach(), means[trainer.labels])
    _, _, jittered = _trainer(1.0, warm_start_share=0.3, warm_start_jitter=0.1)
    jittered.warm_start(release)
    residual = jittered.images.detach() - means[jittered.labels]
    assert 0.08 < float(residual.std()) < 0.12 and abs(float(residual.mean())) < 0.03
    first, second = jittered.images.detach()[:2]  # two members of class 0 differ
    assert not torch.equal(first, second)
    # The jitter is public randomness from the seed: the same seed gives the same S.
    _, _, again = _trainer(1.0, warm_start_share=0.3, warm_start_jitter=0.1)
    again.warm_start(release)
    assert torch.equal(again.images.detach(), jittered.images.detach())


def test_warm_start_through_the_loop_once_and_both_events_in_the_ledger(tmp_path, monkeypatch):
    """A tiny PSG run with the warm start: the release is one `gaussian` event next to the
    R·T·K DP-SGD steps (re-accounted with dp-accounting within the printed ε), S starts from
    it, and a run cut after 3 releases resumes without releasing again, ending equal to a
    straight run."""
    from dpsynth.ledger import Ledger
    from dpsynth.methods.psg.trainer import PSGTrainer
    from dpsynth.rundir import RunDir
    from dpsynth.training import train_run

    calls: list[torch.Tensor] = []
    original = PSGTrainer.warm_start

    def counting(self, release):
        calls.append(release.means.clone())
        original(self, release)

    monkeypatch.setattr(PSGTrainer, "warm_start", counting)
    common = {
        "method": "psg",
        "data": "digits",
        "epsilon": 5.0,
        "preset": "tiny",
        "device": "cpu",
        "seed": 0,
        "overrides": {"warm_start_share": 0.3, "warm_start_jitter": 0.0},
        "privacy_seed": 4242,
    }
    train_run(out=tmp_path / "a", ledger_path=tmp_path / "a.jsonl", **common)
    assert len(calls) == 1
    train_run(out=tmp_path / "b", ledger_path=tmp_path / "b.jsonl", stop_after_steps=3, **common)
    assert len(calls) == 2 and torch.equal(calls[0], calls[1])
    train_run(out=tmp_path / "b", ledger_path=tmp_path / "b.jsonl", resume=True, **common)
    assert len(calls) == 2  # resume restores S from the checkpoint: no second release
    (straight, _), (resumed, _) = (RunDir(tmp_path / n).load_checkpoint() for n in ("a", "b"))
    for key in (k for k in straight if k.startswith("trainer/")):
        assert torch.equal(straight[key], resumed[key]), key
    # S moved from the released means by matching only (8 small steps), not from N(0, 1).
    released = calls[0][torch.arange(10).repeat_interleave(2)]
    assert float((straight["trainer/synthetic.images"] - released).abs().mean()) < 0.5

    dp_event = pytest.importorskip("dp_accounting.dp_event")
    pld = pytest.importorskip("dp_accounting.pld.pld_privacy_accountant")
    privacy = RunDir(tmp_path / "b").read_config()["privacy"]
    events = Ledger(tmp_path / "b.jsonl").events_for("digits")
    assert [e["type"] for e in events] == ["gaussian", "poisson_gaussian"]
    assert events[0]["mechanism"] == "central_images" and events[0]["count"] == 1
    assert events[1]["steps"] == 8
    accountant = pld.PLDAccountant()
    accountant.compose(dp_event.GaussianDpEvent(events[0]["noise_multiplier"]), 1)
    accountant.compose(
        dp_event.PoissonSampledDpEvent(
            events[1]["sampling_rate"], dp_event.GaussianDpEvent(events[1]["noise_multiplier"])
        ),
        events[1]["steps"],
    )
    assert accountant.get_epsilon(1e-5) <= float(privacy["epsilon_bound"]) <= 5.0


def test_presets_warm_start_and_recommendation_follows_epsilon():
    method = PSGMethod()
    assert method.recommended_preset(_info(), 1.0) == "small-eps1"
    assert method.recommended_preset(_info(), 10.0) == "small"
    assert method.recommended_preset(_info(), math.inf) == "small"
    mnist = dataclasses.replace(_info(4000), shape=(1, 28, 28))
    assert method.recommended_preset(mnist, 10.0) == "mnist"
    assert method.recommended_preset(mnist, 1.0) == "mnist-eps1"
    small = method.config("small", {}, _info())
    eps1 = method.config("small-eps1", {}, _info())
    assert 0 < small["warm_start_share"] < eps1["warm_start_share"] < 1
    assert eps1["steps"] < small["steps"]
    assert small["warm_start_clip"] == 8.0  # 0 in the preset: √d for 8×8 in [-1, 1]
    assert method.config("tiny", {}, _info())["warm_start_share"] == 0.0  # tests stay fast
    with pytest.raises(UsageError):
        method.config("small", {"warm_start_jitter": "-1"}, _info())


def test_prior_outputs_are_s_and_only_the_generator_weights_learn():
    """With `prior=dcgan` S is G(z_j, y_j; φ) at fixed codes: a release moves φ (not the
    codes), S stays exactly G's outputs, and the labels stay balanced."""
    from dpsynth.methods.psg.prior import PriorGenerator

    x, y = _digits()
    _, _, trainer = _trainer(1.0, prior="dcgan", prior_width=8)
    assert isinstance(trainer.prior, PriorGenerator)
    assert trainer.images.shape == (20, 1, 8, 8) and not trainer.images.requires_grad
    codes = trainer.codes.clone()
    weights = [p.detach().clone() for p in trainer.prior.parameters()]
    before = trainer.images.clone()
    trainer.step(x[:16], y[:16])
    assert torch.equal(trainer.codes, codes)
    assert any(
        not torch.equal(a, p.detach())
        for a, p in zip(weights, trainer.prior.parameters(), strict=True)
    )
    with torch.no_grad():
        assert torch.equal(trainer.images, trainer.prior(trainer.codes, trainer.labels))
    assert not torch.equal(before, trainer.images)
    assert torch.equal(trainer.labels, torch.arange(10).repeat_interleave(2))


def test_prior_generator_fits_any_image_side():
    from dpsynth.methods.psg.prior import PriorGenerator

    for shape in [(1, 8, 8), (1, 28, 28), (3, 32, 32), (1, 7, 9)]:
        net = PriorGenerator(shape, 10, latent_dim=10, width=4)
        out = net(torch.randn(5, 10), torch.arange(5))
        assert out.shape == (5, *shape)


def test_prior_warm_start_fits_the_jittered_means():
    from dpsynth.privacy.releases.central import CentralImages

    means = torch.linspace(-0.9, 0.9, 10)[:, None, None, None].expand(10, 1, 8, 8).clone()
    release = CentralImages(means=means, counts=torch.full((10,), 100.0))
    overrides = dict(prior="dcgan", prior_width=8, warm_start_share=0.3, warm_start_jitter=0.0)
    _, _, trainer = _trainer(1.0, **overrides, warm_start_steps=200)
    before = float((trainer.images - means[trainer.labels]).pow(2).mean())
    trainer.warm_start(release)
    after = float((trainer.images - means[trainer.labels]).pow(2).mean())
    assert after < 0.02 < before
    assert not trainer.syn_optimizer.state  # matching starts with a fresh Adam state
    _, _, unfitted = _trainer(1.0, **overrides, warm_start_steps=0)
    unfitted.warm_start(release)
    assert float((unfitted.images - means[unfitted.labels]).pow(2).mean()) == before


def test_prior_settings_are_validated():
    method = PSGMethod()
    with pytest.raises(UsageError, match="prior"):
        method.config("tiny", {"prior": "vae"}, _info())
    with pytest.raises(UsageError, match="lr_prior"):
        method.config("tiny", {"prior": "dcgan", "lr_prior": 0.0}, _info())
    with pytest.raises(UsageError, match="prior_width"):
        method.config("tiny", {"prior": "dcgan", "prior_width": 0}, _info())
