"""PGE backend: SSM loss, per-record gradients, RR, residual module, trainer state, sampling."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.func import grad, vmap

from dpsynth.data.images import DataInfo
from dpsynth.methods.base import PrivacyTarget
from dpsynth.methods.pge.build import build_score_net, from_working, to_working
from dpsynth.methods.pge.method import PGEMethod
from dpsynth.methods.pge.nets import RandomConvEncoder, ScoreUNet
from dpsynth.methods.pge.ssm import (
    divergence_term,
    make_record_loss,
    randomized_response,
    rr_keep_probability,
)
from dpsynth.privacy.mechanisms.randomness import PrivateRandomness

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def fake_info(shape: tuple[int, int, int] = (1, 8, 8), n: int = 400, classes: int = 3) -> DataInfo:
    return DataInfo(
        spec="synthetic",
        kind="images",
        n=n,
        shape=shape,
        classes=tuple(str(i) for i in range(classes)),
        fingerprint="0" * 64,
        dataset_id="synthetic",
    )


def tiny_net(residual: int = 4) -> ScoreUNet:
    torch.manual_seed(0)
    net = ScoreUNet(1, 3, nf=8, ch_mult=(1, 2), num_res_blocks=1, residual_channels=residual)
    # Zero-initialised branches would make many gradients vanish; perturb every weight so
    # the checks below exercise all of them.
    with torch.no_grad():
        for p in net.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return net


def record_batch(b: int = 3, k: int = 2, seed: int = 0) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(b, 1, 8, 8, generator=gen) * 2 - 1
    y = torch.randint(0, 4, (b,), generator=gen)
    sigma = torch.rand(b, k, generator=gen) + 0.1
    noise = torch.randn(b, k, 1, 8, 8, generator=gen)
    v = torch.randn(b, k, 1, 8, 8, generator=gen)
    r = torch.randn(b, k, 1, 8, 8, generator=gen)
    z = torch.randn(b, k, 4, 4, 4, generator=gen)
    return x, y, sigma, noise, v, r, z


@pytest.mark.parametrize("variant", ["plain", "vr", "stein"])
def test_per_record_gradient_from_vmap_matches_a_loop(variant: str) -> None:
    net = tiny_net()
    loss = make_record_loss(net, variant, "jvp")
    params = {k: v.detach() for k, v in net.named_parameters()}
    buffers = dict(net.named_buffers())
    batch = record_batch()
    in_dims = (None, None, *([0] * len(batch)))
    batched = vmap(grad(loss), in_dims=in_dims)(params, buffers, *batch)
    for i in range(batch[0].shape[0]):
        single = grad(loss)(params, buffers, *(t[i] for t in batch))
        for name in params:
            assert torch.allclose(batched[name][i], single[name], atol=1e-5, rtol=1e-4), name
    # and the loop gradient is the ordinary autograd gradient of the record's loss
    net.zero_grad()
    loss(dict(net.named_parameters()), buffers, *(t[0] for t in batch)).backward()
    for name, p in net.named_parameters():
        assert torch.allclose(p.grad, batched[name][0], atol=1e-5, rtol=1e-4), name
    assert any(batched[name].abs().sum() > 0 for name in params)


def test_dpsgd_per_sample_grads_agree_with_our_loss() -> None:
    from dpsynth.privacy.mechanisms.dpsgd import per_sample_grads

    net = tiny_net()
    loss = make_record_loss(net, "plain", "jvp")
    batch = record_batch(b=3, seed=1)
    grads = per_sample_grads(net, loss, batch)
    params = {k: v.detach() for k, v in net.named_parameters()}
    single = grad(loss)(params, dict(net.named_buffers()), *(t[2] for t in batch))
    for name, g in single.items():
        assert torch.allclose(grads[name][2], g, atol=1e-5, rtol=1e-4)


def test_jvp_and_finite_difference_divergence_agree() -> None:
    net = tiny_net().double()
    gen = torch.Generator().manual_seed(2)
    x = torch.rand(4, 1, 8, 8, generator=gen, dtype=torch.float64) * 2 - 1
    r = torch.randn(4, 1, 8, 8, generator=gen, dtype=torch.float64)
    sigma = torch.full((4,), 0.5, dtype=torch.float64)
    y = torch.tensor([0, 1, 2, 3])
    z = torch.randn(4, 4, 4, 4, generator=gen, dtype=torch.float64)

    def f(inp: torch.Tensor) -> torch.Tensor:
        return net(inp, sigma, y, z)

    out_j, div_j = divergence_term(f, x, r, "jvp")
    out_f, div_f = divergence_term(f, x, r, "fd", h=1e-4)
    # double backward as a third, independent route: rᵀ ∇ₓ (rᵀ f(x))
    xg = x.clone().requires_grad_(True)
    (g,) = torch.autograd.grad((r * f(xg)).sum(), xg, create_graph=False)
    div_b = (r * g).flatten(1).sum(1)
    assert torch.allclose(out_j, out_f)
    assert torch.allclose(div_j, div_f, rtol=1e-3, atol=1e-6)
    assert torch.allclose(div_j, div_b, rtol=1e-6, atol=1e-9)
    assert div_j.abs().min() > 0


class LinearScore(nn.Module):
    """net(x, σ) = σ·(−A(x−μ)), i.e. the score model s(x) = −A(x − μ)."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.a = nn.Parameter(torch.eye(d))
        self.mu = nn.Parameter(torch.zeros(d))

    def forward(
        self, x: torch.Tensor, sigma: torch.Tensor, y: torch.Tensor, z: object
    ) -> torch.Tensor:
        flat = x.flatten(1) - self.mu
        return (sigma[:, None] * -(flat @ self.a.T)).reshape(x.shape)


def test_ssm_recovers_the_precision_of_a_gaussian() -> None:
    gen = torch.Generator().manual_seed(3)
    cov = torch.tensor([[1.0, 0.6], [0.6, 0.5]])
    mean = torch.tensor([0.3, -0.2])
    n = 2000
    x = (torch.randn(n, 2, generator=gen) @ torch.linalg.cholesky(cov).T + mean).reshape(n, 1, 1, 2)
    sigma = torch.full((n, 1), 1e-3)  # negligible perturbation: target is the data score
    noise = torch.zeros(n, 1, 1, 1, 2)
    v = torch.randn(n, 1, 1, 1, 2, generator=gen)
    model = LinearScore(2)
    loss = make_record_loss(model, "plain", "jvp")
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    batched = vmap(loss, in_dims=(None, None, 0, 0, 0, 0, 0, 0, 0))
    y, z = torch.zeros(n, dtype=torch.int64), torch.zeros(n, 1, 1)
    for _ in range(200):
        opt.zero_grad()
        params = dict(model.named_parameters())
        (batched(params, {}, x, y, sigma, noise, v, v, z).mean() / 1e-6).backward()
        opt.step()
    precision = torch.linalg.inv(cov)
    sym = 0.5 * (model.a + model.a.T).detach()
    assert torch.allclose(sym, precision, atol=0.35 * precision.abs().max())
    assert torch.allclose(model.mu.detach(), mean, atol=0.1)


def test_rr_keep_rate_and_isotropy() -> None:
    gen = torch.Generator().manual_seed(4)
    eps, k, b, trials = 1.0, 10, 64, 200
    v = torch.randn(b * trials, 1, 6, generator=gen).reshape(trials, b, 1, 6)
    kept_total, second_moment = 0, torch.zeros(6, 6)
    for t in range(trials):
        r, kept = randomized_response(v[t], k, eps, gen)
        kept_total += int(kept.sum())
        assert torch.equal(r[kept], v[t][kept])
        second_moment += (r[:, 0].T @ r[:, 0]) / b
    p = rr_keep_probability(eps, k)
    assert p == pytest.approx(math.exp(eps) / (math.exp(eps) + k - 1))
    count = b * trials
    assert abs(kept_total / count - p) < 4 * math.sqrt(p * (1 - p) / count)
    assert torch.allclose(second_moment / trials, torch.eye(6), atol=0.08)


def test_rr_swaps_only_to_cosine_nearest_neighbours() -> None:
    gen = torch.Generator().manual_seed(5)
    v = torch.randn(12, 1, 5, generator=gen)
    r, kept = randomized_response(v, 3, -20.0, gen)  # ε ≪ 0: always swap
    assert not kept.any()
    unit = v[:, 0] / v[:, 0].norm(dim=1, keepdim=True)
    cos = unit @ unit.T
    cos.fill_diagonal_(-2)
    top2 = cos.topk(2, dim=1).indices
    for i in range(12):
        source = [j for j in range(12) if torch.equal(v[j, 0], r[i, 0])]
        assert source and source[0] in top2[i].tolist()


def test_rr_small_batches() -> None:
    gen = torch.Generator().manual_seed(6)
    one = torch.randn(1, 2, 4, generator=gen)
    r, kept = randomized_response(one, 10, 0.0, gen)
    assert torch.equal(r, one) and kept.all()
    empty = torch.randn(0, 2, 4)
    r, _ = randomized_response(empty, 10, 0.0, gen)
    assert r.shape == empty.shape
    three = torch.randn(3, 1, 4, generator=gen)
    r, _ = randomized_response(three, 10, -20.0, gen)  # k' = 3 < k: still swaps within batch
    assert all(any(torch.equal(r[i], three[j]) for j in range(3) if j != i) for i in range(3))


def test_rr_changes_no_privacy_plan() -> None:
    pytest.importorskip("dpsynth.privacy.accounting.compose")
    method, info = PGEMethod(), fake_info()
    target = PrivacyTarget(5.0, 1e-5)
    off = method.plan(info, target, method.config("tiny", {"rr": False}, info))
    on = method.plan(info, target, method.config("tiny", {"rr": True, "rr_epsilon": 0.1}, info))
    assert off.events == on.events
    assert off.noise_multiplier == on.noise_multiplier


def test_residual_module_is_a_no_op_at_init_and_its_encoder_is_fixed() -> None:
    torch.manual_seed(7)
    net = ScoreUNet(1, 3, nf=8, ch_mult=(1, 2), num_res_blocks=1, residual_channels=4)
    with torch.no_grad():  # break zero-init everywhere except the residual projection
        for name, p in net.named_parameters():
            if not name.startswith("residual_proj"):
                p.add_(0.05 * torch.randn_like(p))
    enc = RandomConvEncoder(1, 4, downsamplings=1)
    x = torch.rand(3, 1, 8, 8) * 2 - 1
    z = enc(x)
    assert z.shape == (3, 4, 4, 4)  # the bottleneck of an 8x8 input with ch_mult (1, 2)
    sigma, y = torch.full((3,), 0.3), torch.tensor([0, 1, 2])
    assert torch.equal(net(x, sigma, y, z), net(x, sigma, y, None))
    assert list(enc.parameters()) == []
    again = RandomConvEncoder(1, 4, downsamplings=1)  # built from a constant seed, no data
    assert all(torch.equal(a, b) for a, b in zip(enc.buffers(), again.buffers(), strict=True))
    assert 0.3 < float(z.std()) < 3.0
    # after a gradient step the projection learns: the module is then no longer a no-op
    net.residual_proj.weight.data.add_(0.1)
    assert not torch.equal(net(x, sigma, y, z), net(x, sigma, y, None))


def test_no_batchnorm_anywhere() -> None:
    info = fake_info((1, 28, 28), classes=10)
    method = PGEMethod()
    for preset in ("tiny", "small", "paper"):
        net = build_score_net(method.config(preset, {}, info), info)
        assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in net.modules())


def test_working_resolution_pads_and_crops_back() -> None:
    method = PGEMethod()
    info = fake_info((1, 28, 28), classes=10)
    paper = method.config("paper", {}, info)
    assert paper["working_size"] == [28, 28]  # (1, 2, 2) works at 28 as DPDM does
    padded = method.config("paper", {"image_size": 32}, info)
    assert padded["working_size"] == [32, 32] and "pad 28x28 -> 32x32" in padded["input_transform"]
    x = torch.rand(2, 1, 28, 28) * 2 - 1
    w = to_working(x, padded, info.shape)
    assert w.shape == (2, 1, 32, 32) and (w[..., 28:, :] == -1).all()
    assert torch.equal(from_working(w, padded, info.shape), x)
    odd = fake_info((1, 7, 7))
    cfg = method.config("tiny", {}, odd)
    assert cfg["working_size"] == [8, 8]
    resized = method.config("tiny", {"resize": "resize", "image_size": 16}, odd)
    assert from_working(to_working(x[..., :7, :7], resized, odd.shape), resized, odd.shape).shape[
        -2:
    ] == (7, 7)


def test_paper_preset_constructs_and_runs_a_forward_pass() -> None:
    info = fake_info((1, 28, 28), classes=10)
    cfg = PGEMethod().config("paper", {}, info)
    net = build_score_net(cfg, info)
    n_params = sum(p.numel() for p in net.parameters())
    assert 1_000_000 < n_params < 4_000_000  # DPDM's MNIST network is about 1.75M
    with torch.no_grad():
        out = net(torch.zeros(2, 1, 28, 28), torch.full((2,), 0.5), torch.tensor([0, 10]), None)
    assert out.shape == (2, 1, 28, 28)
    for key in ("batch_size", "steps", "max_grad_norm", "micro_batch_size", "lr", "ema"):
        assert key in cfg


def test_bad_settings_are_usage_errors() -> None:
    from dpsynth.errors import UsageError

    method, info = PGEMethod(), fake_info()
    with pytest.raises(UsageError):
        method.config("tiny", {"mh": "bogus"}, info)
    with pytest.raises(UsageError):
        method.config("tiny", {"sigma_min": "3.0"}, info)
    with pytest.raises(UsageError):
        method.config("huge", {}, info)


# ---- trainer and generator (need the DP-SGD layer) ------------------------------------------


def _trainer(
    info: DataInfo,
    epsilon: float = 10.0,
    seed: int = 0,
    randomness: PrivateRandomness | None = None,
    **overrides,
):
    method = PGEMethod()
    cfg = method.config("tiny", {"micro_batch_size": 16, **overrides}, info)
    plan = method.plan(info, PrivacyTarget(epsilon, 1e-5), cfg)
    return method, cfg, method.trainer(info, cfg, plan, torch.device("cpu"), seed, randomness)


def _batches(
    info: DataInfo, steps: int, q: float = 0.03
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    from dpsynth.privacy.mechanisms.poisson import PoissonSampler

    gen = torch.Generator().manual_seed(9)
    data_x = torch.rand(info.n, *info.shape, generator=gen) * 2 - 1
    data_y = torch.randint(0, len(info.classes), (info.n,), generator=gen)
    sampler = PoissonSampler(info.n, q, torch.Generator().manual_seed(10))
    out = []
    for _ in range(steps):
        idx = sampler.next()
        out.append((data_x[idx], data_y[idx]))
    return out


def test_resume_continues_exactly() -> None:
    info = fake_info()
    batches = _batches(info, 4)
    _, _, straight = _trainer(info, randomness=PrivateRandomness(77))
    for x, y in batches:
        straight.step(x, y)
    first_randomness = PrivateRandomness(77)
    _, _, first = _trainer(info, randomness=first_randomness)
    for x, y in batches[:2]:
        first.step(x, y)
    saved = first.state_tensors()
    saved_streams = first_randomness.state()  # the secret streams, saved privately by the loop
    assert all(t.is_contiguous() for t in saved.values())
    # A different seed and secret: everything must come from what was saved.
    resumed_randomness = PrivateRandomness(78)
    _, _, resumed = _trainer(info, seed=123, randomness=resumed_randomness)
    resumed.load_state_tensors(saved)
    resumed_randomness.load_state(saved_streams)
    for x, y in batches[2:]:
        resumed.step(x, y)
    end, ref = resumed.state_tensors(), straight.state_tensors()
    assert int(end["trainer.steps"]) == int(ref["trainer.steps"]) == 4
    assert end.keys() == ref.keys()
    for key in ref:
        assert torch.equal(end[key], ref[key]), key


def test_step_handles_empty_and_non_private_batches() -> None:
    info = fake_info()
    _, _, trainer = _trainer(info)
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    stats = trainer.step(torch.zeros(0, 1, 8, 8), torch.zeros(0, dtype=torch.int64))
    assert "loss" in stats
    moved = any(not torch.equal(before[k], v) for k, v in trainer.model.state_dict().items())
    assert moved  # noise alone still moves the weights
    _, _, public = _trainer(info, epsilon=math.inf)
    assert not public.plan.private
    x, y = _batches(info, 1, q=0.05)[0]
    assert math.isfinite(public.step(x, y)["loss"])


def test_sampler_writes_data_shaped_uint8_in_label_order() -> None:
    info = fake_info((1, 7, 7))
    method, cfg, trainer = _trainer(info)
    for x, y in _batches(info, 2):
        trainer.step(x, y)
    gen = method.generator_from_state(info, cfg, trainer.state_tensors(), torch.device("cpu"))
    labels = torch.tensor([0, 1, 2, 0, 1, 2, 0])
    chunks = list(gen.sample(labels, 3, torch.Generator().manual_seed(0)))
    assert [c.shape[0] for c in chunks] == [3, 3, 1]
    images = torch.cat(chunks)
    assert images.dtype == torch.uint8 and images.shape == (7, 1, 7, 7)
    assert len(gen.last_acceptance) == cfg["sampler_rounds"]
    again = torch.cat(list(gen.sample(labels, 3, torch.Generator().manual_seed(0))))
    assert torch.equal(images, again)  # the sampler's randomness is all in its generator
    live = torch.cat(list(trainer.generator().sample(labels, 7, torch.Generator().manual_seed(0))))
    assert live.shape == images.shape


# ---- end to end through the training loop and the sampler ------------------------------------


def _pld_epsilon(events: tuple[dict, ...], delta: float) -> float:
    """ε of the recorded mechanism events under dp-accounting's PLD accountant (add/remove)."""
    import dp_accounting
    from dp_accounting.pld import pld_privacy_accountant

    accountant = pld_privacy_accountant.PLDAccountant(
        dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
    )
    for event in events:
        assert event["type"] == "poisson_gaussian", event
        step = dp_accounting.PoissonSampledDpEvent(
            event["sampling_rate"], dp_accounting.GaussianDpEvent(event["noise_multiplier"])
        )
        accountant.compose(dp_accounting.SelfComposedDpEvent(step, int(event["steps"])))
    return accountant.get_epsilon(delta)


E2E_STEPS = {"steps": 6}


def test_end_to_end_train_resume_sample(tmp_path) -> None:
    from safetensors.torch import load_file

    training = pytest.importorskip("dpsynth.training")
    sampling = pytest.importorskip("dpsynth.sampling")
    from dpsynth.ledger import Ledger

    # Separate ledgers: on a shared one the second run's ε budget would be what is left after
    # the first, so it would get a different noise multiplier.
    common = dict(
        method="pge",
        data="digits",
        epsilon=5.0,
        delta=1e-5,
        preset="tiny",
        device="cpu",
        seed=3,
        overrides=E2E_STEPS,
        privacy_seed=2**127 + 5,  # the same secret for both runs (injectable in tests only)
    )
    straight = training.train_run(
        out=tmp_path / "straight", ledger_path=tmp_path / "a.jsonl", **common
    )
    ledger = tmp_path / "b.jsonl"
    cut = training.train_run(out=tmp_path / "cut", ledger_path=ledger, stop_after_steps=2, **common)
    assert cut.get("interrupted")
    resumed = training.train_run(out=tmp_path / "cut", ledger_path=ledger, resume=True, **common)

    for path in (tmp_path / "a.jsonl", ledger):
        events = Ledger(path).events_for("digits")
        assert len(events) == 1  # one spend per run; the resume added none
        assert events[0]["steps"] == E2E_STEPS["steps"]
        assert _pld_epsilon(events, 1e-5) <= 5.0 * 1.001

    def weights(run: str) -> dict[str, torch.Tensor]:
        files = sorted((tmp_path / run).rglob("*.safetensors"))
        assert files
        return load_file(str(files[-1]))

    a, b = weights("straight"), weights("cut")
    assert a.keys() == b.keys()
    for key in a:
        if "trainer/" in key or key.startswith(("model.", "ema.")):
            assert torch.equal(a[key], b[key]), key
    steps_key = next(k for k in a if k.endswith("trainer.steps"))
    assert int(a[steps_key]) == int(b[steps_key]) == E2E_STEPS["steps"]
    assert straight.get("steps", E2E_STEPS["steps"]) == resumed.get("steps", E2E_STEPS["steps"])

    out = tmp_path / "synth"
    sampling.sample_run(
        tmp_path / "cut", 23, out, batch_size=10, seed=0, device="cpu", ledger_path=ledger
    )
    pngs = sorted(out.rglob("*.png"))
    assert len(pngs) == 23
    assert {p.parent.name for p in pngs} <= {str(c) for c in range(10)}
    assert len({p.parent.name for p in pngs}) == 10  # balanced labels reach every class
