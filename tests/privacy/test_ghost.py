"""Ghost-norm / book-keeping clipping (`dpsynth.privacy.mechanisms.ghost`) against the vmap path.

The vmap path (per-record gradients, checked against a per-record loop and Opacus in
test_dpsgd.py) is the reference: the ghost path must give the same per-record norms and the
same clipped sum on every supported layer type, fall back where it cannot, and keep the
mechanism's noise and sensitivity.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from test_dpsgd import assert_grads_close, loop_grads, mnist_batch  # noqa: F401 (fixture)
from torch import Tensor, nn
from torch.func import functional_call

from bench.dpsgd_models import ScoreMLP, SmallCNN
from dpsynth.errors import UsageError
from dpsynth.privacy.mechanisms.dpsgd import PrivateGradient, add_noise
from dpsynth.privacy.mechanisms.ghost import ghost_clipped_sum, unsupported_reasons
from dpsynth.privacy.mechanisms.ghost_check import GhostFallbackWarning
from dpsynth.privacy.mechanisms.per_record import clipped_sum, per_sample_grads
from tests.noise_checks import assert_gaussian_noise

# --------------------------------------------------------------------------- models


class Seq(nn.Module):
    """Linear on a sequence [B, T, d] (3-d input), optionally after an Embedding."""

    def __init__(self, d: int, p: int, embed: nn.Embedding | None = None) -> None:
        super().__init__()
        self.embed = embed
        self.mid = nn.Linear(d, p)
        self.head = nn.Linear(p, 3)

    def forward(self, x: Tensor) -> Tensor:
        h = self.embed(x) if self.embed is not None else x
        return self.head(torch.tanh(self.mid(h)).mean(1))


class Convs(nn.Module):
    """Convolutions with stride, padding, dilation, groups, 'same', reflect, no bias."""

    def __init__(self, one_d: bool = False) -> None:
        super().__init__()
        conv = nn.Conv1d if one_d else nn.Conv2d
        self.c1 = conv(3, 8, 3, stride=2, padding=1)
        self.c2 = conv(8, 8, 3, padding=2, dilation=2, groups=4)
        self.c3 = conv(8, 6, 2, padding="same", bias=False)
        self.c4 = conv(6, 4, 3, padding=1, padding_mode="reflect", groups=2)
        self.out = nn.Linear(4 * (8 if one_d else 64), 5)

    def forward(self, x: Tensor) -> Tensor:
        h = torch.tanh(self.c1(x))
        h = torch.tanh(self.c2(h))
        h = torch.tanh(self.c4(self.c3(h)))
        return self.out(h.flatten(1))


class Norms(nn.Module):
    """GroupNorm, InstanceNorm (affine), LayerNorm over two dims, GroupNorm on [B, C]."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 6, 3, padding=1)
        self.group = nn.GroupNorm(3, 6)
        self.instance = nn.InstanceNorm2d(6, affine=True)
        self.layer = nn.LayerNorm([6, 5])
        self.flat_group = nn.GroupNorm(2, 4)
        self.head = nn.Linear(6 * 5, 4)

    def forward(self, x: Tensor) -> Tensor:
        h = torch.tanh(self.group(self.conv(x)))
        h = torch.tanh(self.instance(h)).mean(2)  # [B, 6, 5]
        h = torch.tanh(self.layer(h))
        return self.flat_group(self.head(h.flatten(1)))


def _images(shape: tuple[int, ...]) -> Callable[[torch.Generator, int], Tensor]:
    return lambda g, n: torch.randn(n, *shape, generator=g, dtype=torch.float64)


def _tokens(vocab: int, steps: int) -> Callable[[torch.Generator, int], Tensor]:
    def draw(g: torch.Generator, n: int) -> Tensor:
        x = torch.randint(0, vocab, (n, steps), generator=g)
        x[0, :2] = 0  # the padding index, repeated
        x[1, :] = 3  # one token repeated over the whole record
        return x

    return draw


CASES = {
    "linear-2d": (
        lambda: nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3)),
        _images((5,)),
    ),
    "linear-3d-gram": (lambda: Seq(16, 16), _images((3, 16))),  # T(p+d) < pd: Gram trick
    "linear-3d-dense": (lambda: Seq(3, 4), _images((9, 3))),  # T(p+d) ≥ pd: a_i^T g_i formed
    "conv2d": (lambda: Convs(), _images((3, 16, 16))),
    "conv1d": (lambda: Convs(one_d=True), _images((3, 16))),
    "norms": (lambda: Norms(), _images((2, 4, 5))),
    "embedding-gram": (lambda: Seq(6, 5, nn.Embedding(40, 6, padding_idx=0)), _tokens(40, 5)),
    "embedding-dense": (lambda: Seq(6, 5, nn.Embedding(7, 6, padding_idx=0)), _tokens(7, 6)),
    "small-cnn": (lambda: SmallCNN(channels=8), _images((1, 28, 28))),
}


def build(case: str, records: int = 7, seed: int = 0) -> tuple[nn.Module, Tensor, Tensor]:
    make, draw = CASES[case]
    torch.manual_seed(seed)
    model = make().double()
    g = torch.Generator().manual_seed(seed + 1)
    x = draw(g, records)
    with torch.no_grad():
        classes = model(x[:1]).shape[1]
    return model, x, torch.randint(0, classes, (records,), generator=g)


def record_loss(model: nn.Module):
    def loss(params: dict, buffers: dict, x: Tensor, y: Tensor) -> Tensor:
        return F.cross_entropy(functional_call(model, (params, buffers), (x[None],)), y[None])

    return loss


def batch_loss(model: nn.Module):
    return lambda x, y: F.cross_entropy(model(x), y, reduction="none")


# --------------------------------------------------------------------------- norms and sums


@pytest.mark.parametrize("case", sorted(CASES))
def test_norms_and_clipped_sum_equal_vmap(case: str):
    model, x, y = build(case)
    assert unsupported_reasons(model) == []
    grads = per_sample_grads(model, record_loss(model), (x, y))
    flat = torch.cat([g.flatten(1) for g in grads.values()], dim=1)
    max_norm = float(flat.norm(dim=1).median())  # some records clipped, some not
    want_sum, want_norms = clipped_sum(grads, max_norm)
    summed, norms, losses = ghost_clipped_sum(model, batch_loss(model), (x, y), max_norm)
    torch.testing.assert_close(norms, want_norms, rtol=1e-10, atol=1e-12)
    assert list(summed) == list(want_sum)  # all trainable parameters, in the model's order
    assert_grads_close(summed, want_sum, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(losses, batch_loss(model)(x, y).detach())
    assert all(p.grad is None for p in model.parameters())  # nothing written behind our back


@pytest.mark.parametrize("case", ["conv1d", "conv2d", "small-cnn"])
def test_unfold_per_record_conv_gradients_equal_vmap(case: str, monkeypatch):
    from dpsynth.privacy.mechanisms import ghost_layers

    monkeypatch.setattr(ghost_layers, "CONV_PER_RECORD", "unfold")
    test_norms_and_clipped_sum_equal_vmap(case)


def test_frozen_parameters_and_unused_layers():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 2)).double()
    model[0].bias.requires_grad_(False)
    spare = nn.Linear(3, 3).double()
    model.add_module("unused", spare)
    x, y = torch.randn(5, 4, dtype=torch.float64), torch.randint(0, 2, (5,))

    def loss(x: Tensor, y: Tensor) -> Tensor:
        return F.cross_entropy(model[2](model[1](model[0](x))), y, reduction="none")

    def rec(params: dict, buffers: dict, xi: Tensor, yi: Tensor) -> Tensor:
        h = functional_call(model[0], {"weight": params["0.weight"], "bias": buffers["0.bias"]}, xi)
        w, b = params["2.weight"], params["2.bias"]
        return (
            F.cross_entropy((torch.tanh(h) @ w.T + b)[None], yi[None])
            + 0 * params["unused.weight"].sum()
            + 0 * params["unused.bias"].sum()
        )

    want, want_norms = clipped_sum(per_sample_grads(model, rec, (x, y)), 0.3)
    summed, norms, _ = ghost_clipped_sum(model, loss, (x, y), 0.3)
    assert "0.bias" not in summed
    assert_grads_close(summed, want, rtol=1e-9, atol=1e-12)
    assert torch.equal(summed["unused.weight"], torch.zeros(3, 3, dtype=torch.float64))
    torch.testing.assert_close(norms, want_norms)


# --------------------------------------------------------------------------- the mechanism


def gradient(model: nn.Module, mode: str, seed: int = 5, **kw) -> PrivateGradient:
    settings = {"noise_multiplier": 1.3, "max_grad_norm": 0.5, "expected_batch_size": 10.0}
    settings.update(kw)
    return PrivateGradient(
        model,
        record_loss(model),
        batch_loss_fn=batch_loss(model),
        grad_mode=mode,
        generator=torch.Generator().manual_seed(seed),
        **settings,
    )


def written(model: nn.Module) -> dict[str, Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("micro", [None, 3])
def test_private_gradient_ghost_equals_vmap_with_the_same_noise(micro: int | None):
    model, x, y = build("conv2d", records=8)
    ghost = gradient(model, "ghost", micro_batch_size=micro)
    assert ghost.active_mode == "ghost"
    stats = ghost.compute(x, y)
    got = written(model)
    ref = gradient(model, "vmap")
    assert ref.active_mode == "vmap"
    want_stats = ref.compute(x, y)
    assert_grads_close(got, written(model), rtol=1e-9, atol=1e-12)
    for key, value in want_stats.items():
        assert stats[key] == pytest.approx(value, rel=1e-9)
    assert 0 < stats["clip_fraction"] < 1 or stats["clip_fraction"] == 1.0


def test_noiseless_ghost_gradient_is_loop_clipped_sum_over_expected_size(mnist_batch):  # noqa: F811
    """σ = 0 on real MNIST: Σ clip(g_i) / qN with the clip done on per-record loop gradients."""
    x, y = mnist_batch
    torch.manual_seed(0)
    model = SmallCNN(channels=8)
    ref = loop_grads(model, lambda i: F.cross_entropy(model(x[i : i + 1]), y[i : i + 1]), len(x))
    flat = torch.cat([g.flatten(1) for g in ref.values()], dim=1)
    max_norm = float(flat.norm(dim=1).median())
    factors = (max_norm / (flat.norm(dim=1) + 1e-6)).clamp(max=1.0)
    dp = gradient(model, "ghost", noise_multiplier=0.0, max_grad_norm=max_norm)
    stats = dp.compute(x, y)
    for name, p in model.named_parameters():
        want = (factors.view(-1, *[1] * (ref[name].dim() - 1)) * ref[name]).sum(0) / 10.0
        torch.testing.assert_close(p.grad, want, rtol=1e-4, atol=1e-7)
    assert stats["mean_grad_norm"] == pytest.approx(float(flat.norm(dim=1).mean()), rel=1e-4)


@pytest.mark.parametrize("records", [0, 9])
def test_ghost_noise_has_std_sigma_c_per_coordinate(records: int):
    """Zero gradients (or an empty batch): .grad · qN is the noise alone, N(0, (σC)²)."""
    model = SmallCNN(channels=16)
    sigma, clip, expected_size = 1.7, 0.8, 32.0
    dp = PrivateGradient(
        model,
        lambda params, buffers, x: 0.0 * x.sum(),
        batch_loss_fn=lambda x: (model(x) * 0.0).sum(1),
        grad_mode="ghost",
        noise_multiplier=sigma,
        max_grad_norm=clip,
        expected_batch_size=expected_size,
        generator=torch.Generator().manual_seed(records),
    )
    stats = dp.compute(torch.randn(records, 1, 28, 28))
    assert stats["batch_size"] == records
    noise = torch.cat([p.grad.flatten() for p in model.parameters()]) * expected_size
    assert_gaussian_noise(noise, sigma * clip)


def test_ghost_empty_batch_is_noise_over_expected_size():
    model, x, y = build("small-cnn")
    gradient(model, "ghost", seed=3).compute(x[:0], y[:0])
    expected = add_noise(
        {n: torch.zeros_like(p) for n, p in model.named_parameters()},
        std=1.3 * 0.5,
        generator=torch.Generator().manual_seed(3),
    )
    assert_grads_close(written(model), {n: g / 10.0 for n, g in expected.items()})


def test_ghost_adding_one_record_moves_noiseless_sum_by_at_most_c(mnist_batch):  # noqa: F811
    """The sensitivity the accountant assumes, through the ghost path."""
    x, y = mnist_batch
    torch.manual_seed(0)
    model = SmallCNN(channels=8)
    sums = []
    for n in (len(x) - 1, len(x)):
        dp = gradient(
            model, "ghost", noise_multiplier=0.0, max_grad_norm=0.05, expected_batch_size=1.0
        )
        dp.compute(x[:n], y[:n])
        sums.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    gap = float((sums[1] - sums[0]).norm())
    assert 0.0 < gap <= 0.05 + 1e-6


# --------------------------------------------------------------------------- fallbacks


class Twice(nn.Module):
    """Calls the same Linear twice: a record's gradient is not a_i^T g_i of one call."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.head = nn.Linear(4, 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(torch.tanh(self.lin(torch.tanh(self.lin(x)))))


class InPlace(nn.Module):
    """Modifies a Linear's output in place (an in-place ReLU)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.head = nn.Linear(4, 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(F.relu(self.lin(x), inplace=True))


class WithBilinear(nn.Module):
    """A Bilinear layer: trainable, but no ghost-norm rule."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.pair = nn.Bilinear(4, 4, 2)

    def forward(self, x: Tensor) -> Tensor:
        h = torch.tanh(self.lin(x))
        return self.pair(h, h)


def _shared() -> nn.Module:
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 2))
    model[2].weight = model[0].weight
    return model


UNSUPPORTED = {
    # refused even in eval mode (where its running statistics would keep records apart)
    "batchnorm-without-parameters": lambda: nn.Sequential(
        nn.Linear(4, 4), nn.BatchNorm1d(4, affine=False), nn.Linear(4, 2)
    ).eval(),
    "prelu": lambda: nn.Sequential(nn.Linear(4, 4), nn.PReLU(), nn.Linear(4, 2)),
    "layer-without-rule": WithBilinear,
    "shared-parameter": _shared,
}


@pytest.mark.parametrize("case", sorted(UNSUPPORTED))
def test_unsupported_layers_fall_back_to_vmap_in_auto_and_are_refused_in_ghost(case: str):
    torch.manual_seed(0)
    model = UNSUPPORTED[case]().double()
    assert unsupported_reasons(model)
    x, y = torch.randn(6, 4, dtype=torch.float64), torch.randint(0, 2, (6,))
    rec, bl = record_loss(model), batch_loss(model)
    kw = {"noise_multiplier": 0.0, "max_grad_norm": 0.1, "expected_batch_size": 6.0}
    auto = PrivateGradient(
        model, rec, batch_loss_fn=bl, generator=torch.Generator().manual_seed(0), **kw
    )
    assert auto.active_mode == "vmap"
    auto.compute(x, y)
    got = written(model)
    PrivateGradient(model, rec, grad_mode="vmap", generator=torch.Generator(), **kw).compute(x, y)
    assert_grads_close(got, written(model))
    with pytest.raises(UsageError, match="ghost"):
        PrivateGradient(
            model, rec, batch_loss_fn=bl, grad_mode="ghost", generator=torch.Generator(), **kw
        )


class Tied(nn.Module):
    """Uses a Linear's weight again outside its call (weight tying): escapes the hooks."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.head = nn.Linear(4, 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(torch.tanh(F.linear(torch.tanh(self.lin(x)), self.lin.weight)))


@pytest.mark.parametrize("module", [Twice, InPlace, Tied])
def test_run_time_problems_switch_auto_to_vmap_and_fail_ghost(module: type[nn.Module]):
    torch.manual_seed(0)
    model = module().double()
    assert unsupported_reasons(model) == []  # only a forward pass reveals these
    x, y = torch.randn(6, 4, dtype=torch.float64), torch.randint(0, 2, (6,))
    auto = gradient(model, "auto", noise_multiplier=0.0, max_grad_norm=0.1)
    assert auto.active_mode == "ghost"
    auto.compute(x, y)
    assert auto.active_mode == "vmap"
    got = written(model)
    gradient(model, "vmap", noise_multiplier=0.0, max_grad_norm=0.1).compute(x, y)
    assert_grads_close(got, written(model), rtol=1e-9, atol=1e-12)
    with pytest.raises(UsageError, match=r"called 2 times|in place|outside its layer"):
        gradient(model, "ghost").compute(x, y)


def test_auto_without_batch_loss_is_vmap_and_bad_settings_are_refused():
    model = ScoreMLP()
    kw = {"noise_multiplier": 1.0, "max_grad_norm": 1.0, "expected_batch_size": 4.0}
    loss = record_loss(model)
    assert PrivateGradient(model, loss, generator=torch.Generator(), **kw).active_mode == "vmap"
    with pytest.raises(UsageError, match="batch_loss_fn"):
        PrivateGradient(model, loss, grad_mode="ghost", generator=torch.Generator(), **kw)
    with pytest.raises(UsageError, match="grad mode"):
        PrivateGradient(model, loss, grad_mode="fast", generator=torch.Generator(), **kw)
    # a batch loss that does not return one loss per record
    ghost = PrivateGradient(
        model,
        loss,
        batch_loss_fn=lambda x: model(x).pow(2).sum(),
        grad_mode="ghost",
        generator=torch.Generator(),
        **kw,
    )
    with pytest.raises(UsageError, match="one loss per record"):
        ghost.compute(torch.randn(4, 3))


# --------------------------------------------------------------------------- backends

BACKEND_GRADIENTS = {  # backend, tiny-preset overrides, the trainer's PrivateGradient attribute
    "psg": ("psg", {}, "private_gradient"),
    "rdpgan-mlp": ("rdpgan", {}, "private_d"),
    "rdpgan-conv": ("rdpgan", {"arch": "conv"}, "private_d"),
    "dpaf-phase1": ("dpaf", {"c_steps": 3}, "private_c"),
}


def _backend_steps(case: str, force_vmap: bool) -> tuple[str, dict[str, Tensor]]:
    from dpsynth.data.sources import load_data
    from dpsynth.methods.registry import get_method
    from dpsynth.privacy.accounting.plan import ClippedGaussianSum, PrivacyPlan
    from dpsynth.privacy.mechanisms.poisson import PoissonSampler
    from dpsynth.privacy.mechanisms.randomness import PrivateRandomness

    method, overrides, attribute = BACKEND_GRADIENTS[case]
    backend = get_method(method)
    records = load_data("digits")
    info = records.info()
    config = backend.config("tiny", overrides, info)
    batch = float(config["batch_size"])
    plan = PrivacyPlan(
        private=True,
        target_epsilon=10.0,
        delta=1e-5,
        sampling_rate=batch / info.n,
        steps=2,
        expected_batch_size=batch,
        gaussian_sum=ClippedGaussianSum(1.0, float(config.get("max_grad_norm", 1.0))),
        events=(
            {
                "type": "poisson_gaussian",
                "noise_multiplier": 1.0,
                "sampling_rate": batch / info.n,
                "steps": 2,
            },
        ),
        epsilon_bound=10.0,
        total_epsilon_bound=10.0,
        accountant="fixed for the test",
    )
    randomness = PrivateRandomness(0x0123456789ABCDEF0123456789ABCDEF)
    trainer = backend.trainer(info, config, plan, torch.device("cpu"), 3, randomness)
    gradient = getattr(trainer, attribute)
    mode = gradient.active_mode
    if force_vmap:
        gradient.active_mode = "vmap"
    pixels = records.as_float()
    # One noiseless release on 16 records, read straight from the parameters' .grad.
    x, y = pixels[:16], records.y[:16]
    onehot = F.one_hot(y, len(info.classes)).float()
    args = {"psg": (x, y), "rdpgan": (x, onehot), "dpaf": (x, torch.zeros_like(onehot), y)}
    sigma = gradient.noise_multiplier
    gradient.noise_multiplier = 0.0
    gradient.compute(*args[method])
    released = {f"grad.{n}": p.grad.clone() for n, p in gradient.model.named_parameters()}
    gradient.noise_multiplier = sigma
    for p in gradient.model.parameters():
        p.grad = None
    sampler = PoissonSampler(info.n, plan.sampling_rate, randomness.generator("loop/batches"))
    for _ in range(2):
        index = sampler.next()
        trainer.step(pixels[index], records.y[index])
    return mode, {**released, **trainer.state_tensors()}


@pytest.mark.parametrize("case", sorted(BACKEND_GRADIENTS))
def test_backends_use_ghost_and_train_as_with_vmap(case: str, one_torch_thread: None):
    # One thread: with two, the reductions' order varies between runs, and Adam turns a ~0
    # gradient's rounding difference into a step of ±lr (seen on rdpgan-conv).
    mode, ghost = _backend_steps(case, force_vmap=False)
    assert mode == "ghost"
    _, vmap = _backend_steps(case, force_vmap=True)
    assert ghost.keys() == vmap.keys()
    for name, value in vmap.items():
        if name.startswith("grad."):  # the clipped sum itself: float rounding only
            torch.testing.assert_close(ghost[name], value, rtol=1e-5, atol=1e-7, msg=name)
        elif value.is_floating_point():  # Adam's first steps: a ~0 gradient can become ±lr
            torch.testing.assert_close(ghost[name], value, rtol=1e-4, atol=2e-4, msg=name)
        else:
            assert torch.equal(ghost[name], value), name


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("conv", ["grouped", "unfold"])
def test_ghost_equals_vmap_on_cuda(conv: str, monkeypatch):
    from dpsynth.privacy.mechanisms import ghost_layers

    monkeypatch.setattr(ghost_layers, "CONV_PER_RECORD", conv)
    model, x, y = build("small-cnn", records=16)
    model, x, y = model.cuda(), x.cuda(), y.cuda()
    grads = per_sample_grads(model, record_loss(model), (x, y))
    want, want_norms = clipped_sum(grads, 0.5)
    summed, norms, _ = ghost_clipped_sum(model, batch_loss(model), (x, y), 0.5)
    torch.testing.assert_close(norms, want_norms, rtol=1e-9, atol=1e-12)
    assert_grads_close(summed, want, rtol=1e-9, atol=1e-12)


# --------------------------------------------------------------------------- record mixing


class CentredHead(nn.Module):
    """A container whose own forward subtracts the batch mean: parameter-free mixing of the
    records that no layer rule sees (issue 26, risk 3)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(4, 6)
        self.head = nn.Linear(6, 2)

    def forward(self, x: Tensor) -> Tensor:
        h = torch.tanh(self.body(x))
        return self.head(h - h.mean(0, keepdim=True))


class BatchCentre(nn.Module):
    """The same mixing as a parameter-free leaf module."""

    def forward(self, x: Tensor) -> Tensor:
        return x - x.mean(0, keepdim=True)


def test_a_container_that_mixes_records_is_caught_on_the_first_batch():
    torch.manual_seed(0)
    model = CentredHead().double()
    x, y = torch.randn(6, 4, dtype=torch.float64), torch.randint(0, 2, (6,))
    assert unsupported_reasons(model) == []  # nothing structural gives it away
    auto = gradient(model, "auto", noise_multiplier=0.0, max_grad_norm=0.1)
    assert auto.active_mode == "ghost"
    with pytest.warns(GhostFallbackWarning, match=r"layer body \(Linear\).*CentredHead"):
        auto.compute(x, y)
    assert auto.active_mode == "vmap"
    got = written(model)
    gradient(model, "vmap", noise_multiplier=0.0, max_grad_norm=0.1).compute(x, y)
    assert_grads_close(got, written(model), rtol=1e-9, atol=1e-12)
    with pytest.raises(UsageError, match="mixes the records"):
        gradient(model, "ghost").compute(x, y)


def test_without_the_check_ghost_norms_of_a_mixing_model_are_wrong():
    # what the check guards against: the batched pass's norms are not the records' own
    torch.manual_seed(0)
    model = CentredHead().double()
    x, y = torch.randn(6, 4, dtype=torch.float64), torch.randint(0, 2, (6,))
    _, ghost_norms, _ = ghost_clipped_sum(model, batch_loss(model), (x, y), 1.0)
    grads = per_sample_grads(model, record_loss(model), (x, y))
    own = torch.cat([g.flatten(1) for g in grads.values()], dim=1).norm(dim=1)
    assert not torch.allclose(ghost_norms, own, rtol=1e-3)


def test_a_leaf_module_not_known_to_act_per_record_keeps_auto_on_vmap():
    model = nn.Sequential(nn.Linear(4, 6), BatchCentre(), nn.Linear(6, 2)).double()
    assert any("BatchCentre" in r for r in unsupported_reasons(model))
    assert gradient(model, "auto").active_mode == "vmap"
    softmax_over_batch = nn.Sequential(nn.Linear(4, 2), nn.Softmax(dim=0))
    assert any("Softmax" in r for r in unsupported_reasons(softmax_over_batch))
    assert unsupported_reasons(nn.Sequential(nn.Linear(4, 2), nn.Softmax(dim=1))) == []


def test_a_model_that_keeps_records_apart_stays_on_ghost_after_the_check():
    model, x, y = build("conv2d", records=8)
    auto = gradient(model, "auto")
    with warnings.catch_warnings():
        warnings.simplefilter("error", GhostFallbackWarning)
        auto.compute(x, y)
    assert auto.active_mode == "ghost"


def test_the_loop_turns_fallback_warnings_into_run_warnings_and_passes_others_on():
    from dpsynth.training.loop import collected_warnings

    into: list[str] = []
    with pytest.warns(FutureWarning, match="other"), collected_warnings(GhostFallbackWarning, into):
        warnings.warn("fell back", GhostFallbackWarning, stacklevel=1)
        warnings.warn("other", FutureWarning, stacklevel=1)
    assert into == ["fell back"]
