"""The "stein" estimator of the noise-conditional SSM objective: the same expected loss (up to
a constant), the same expected gradient and the same minimiser as the variance-reduced SSM."""

from __future__ import annotations

import pytest
import torch
from torch.func import vmap

from dpsynth.methods.pge.ssm import make_record_loss
from tests.methods.pge.test_pge import LinearScore

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def gaussian_records(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    cov = torch.tensor([[1.0, 0.6], [0.6, 0.5]])
    mean = torch.tensor([0.3, -0.2])
    x = torch.randn(n, 2, generator=gen) @ torch.linalg.cholesky(cov).T + mean
    return x.reshape(n, 1, 1, 2), cov, mean


def losses(model: LinearScore, variant: str, x: torch.Tensor, sigma: float, seed: int):
    n = x.shape[0]
    gen = torch.Generator().manual_seed(seed)
    noise = torch.randn(n, 1, 1, 1, 2, generator=gen)
    v = torch.randn(n, 1, 1, 1, 2, generator=gen)
    y, z = torch.zeros(n, dtype=torch.int64), torch.zeros(n, 1, 1)
    loss = make_record_loss(model, variant, "jvp")
    batched = vmap(loss, in_dims=(None, None, 0, 0, 0, 0, 0, 0, 0))
    sigmas = torch.full((n, 1), sigma)
    return batched(dict(model.named_parameters()), {}, x, y, sigmas, noise, v, v, z)


def test_stein_and_vr_have_the_same_expected_loss_and_gradient() -> None:
    x, _, _ = gaussian_records(200_000, seed=0)
    model = LinearScore(2)
    with torch.no_grad():  # a model away from the optimum, so the gradients are not zero
        model.a.copy_(torch.tensor([[0.5, 0.2], [-0.1, 1.5]]))
        model.mu.copy_(torch.tensor([0.5, 0.1]))
    means, grads = {}, {}
    for variant in ("vr", "stein"):
        model.zero_grad()
        per_record = losses(model, variant, x, sigma=0.7, seed=1)
        means[variant] = float(per_record.detach().mean())
        per_record.mean().backward()
        grads[variant] = torch.cat([model.a.grad.flatten(), model.mu.grad.flatten()])
    # stein = vr + ½‖ε‖², whose mean is ½·d = 1 here (d = 2)
    assert means["stein"] - means["vr"] == pytest.approx(1.0, abs=0.03)
    assert torch.allclose(grads["stein"], grads["vr"], atol=0.03, rtol=0.05)


def test_stein_recovers_the_perturbed_precision() -> None:
    x, cov, mean = gaussian_records(2_000, seed=3)
    sigma = 0.5
    model = LinearScore(2)
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    for step in range(300):
        opt.zero_grad()
        losses(model, "stein", x, sigma, seed=10 + step).mean().backward()
        opt.step()
    # the score of N(μ, Σ + σ²I): s(x) = −(Σ + σ²I)⁻¹(x − μ)
    precision = torch.linalg.inv(cov + sigma**2 * torch.eye(2))
    sym = 0.5 * (model.a + model.a.T).detach()
    assert torch.allclose(sym, precision, atol=0.15 * precision.abs().max())
    assert torch.allclose(model.mu.detach(), mean, atol=0.1)


def test_chains_without_their_start_release_anneal_from_the_widest_level() -> None:
    from dpsynth.methods.pge.generator import PGEGenerator
    from dpsynth.methods.pge.presets import PRESETS
    from tests.methods.pge.test_pge import fake_info, tiny_net

    info = fake_info()
    config = {**PRESETS["small"], "sampler_init": "central", "sampler_first_level": 2}
    device = torch.device("cpu")
    started = PGEGenerator(info, config, tiny_net(), None, device, torch.zeros(3, 1, 8, 8))
    alone = PGEGenerator(info, config, tiny_net(), None, device, None)
    assert started._round_levels()[0] == 2
    # the method alone (no central images released): every level, from the widest
    assert alone._round_levels() == list(range(config["n_levels"]))
