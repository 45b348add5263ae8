"""The Hamiltonian sampler on targets whose score is known exactly."""

from __future__ import annotations

import math

import pytest
import torch

from dpsynth.methods.pge.hmc import annealed_hmc, hmc_round, leapfrog, reflect, step_schedule

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def standard_normal_score(x: torch.Tensor) -> torch.Tensor:
    """∇ log N(0, I) = −x."""
    return -x


def test_exact_score_small_steps_accept_almost_everything() -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(512, 16, generator=gen)
    _, rate = hmc_round(standard_normal_score, x, 0.05, 10, "path", gen, box=None)
    assert rate > 0.98


def test_path_energy_equals_true_energy_for_a_gradient_field() -> None:
    # For s = −∇U the trapezoid work along leapfrog is exact up to O(λ²): compare with U.
    gen = torch.Generator().manual_seed(1)
    x0 = torch.randn(64, 8, generator=gen)
    c0 = torch.randn(64, 8, generator=gen)
    x1, _, _, work = leapfrog(standard_normal_score, x0, c0, -x0, 0.01, 20, None)
    true = -0.5 * x1.pow(2).sum(1) + 0.5 * x0.pow(2).sum(1)
    assert torch.allclose(work, true, atol=1e-3)


def test_exact_score_gives_standard_normal_moments() -> None:
    gen = torch.Generator().manual_seed(2)
    x = torch.rand(4000, 4, generator=gen) * 6 - 3  # far from the target to start
    x, stats = annealed_hmc(lambda m: standard_normal_score, x, [0.3] * 30, 5, "path", gen, None)
    assert abs(float(x.mean())) < 0.05
    assert abs(float(x.var()) - 1.0) < 0.05
    assert min(stats.acceptance) > 0.9


def test_large_steps_are_rejected_and_rejected_chains_stay_put() -> None:
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(256, 64, generator=gen)
    new, rate = hmc_round(standard_normal_score, x, 1.9, 10, "path", gen, box=None)
    assert rate < 0.7
    unchanged = (new == x).all(dim=1)
    assert 0 < int(unchanged.sum()) < 256


def test_mh_none_accepts_everything() -> None:
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(64, 8, generator=gen)
    _, rate = hmc_round(standard_normal_score, x, 1.9, 5, "none", gen, box=None)
    assert rate == 1.0


@pytest.mark.parametrize("box", [None, 1.0])
def test_leapfrog_is_reversible(box: float | None) -> None:
    gen = torch.Generator().manual_seed(5)
    score = lambda x: -x - 0.3 * x.pow(3)  # noqa: E731  a non-Gaussian gradient field
    x0 = torch.rand(32, 6, generator=gen, dtype=torch.float64) * 1.8 - 0.9
    c0 = torch.randn(32, 6, generator=gen, dtype=torch.float64) * 2
    x1, c1, _, _ = leapfrog(score, x0, c0, score(x0), 0.1, 25, box)
    x2, c2, _, _ = leapfrog(score, x1, -c1, score(x1), 0.1, 25, box)
    assert torch.allclose(x2, x0, atol=1e-5)
    assert torch.allclose(-c2, c0, atol=1e-5)
    if box is not None:  # reflection actually happened in this set-up
        assert (c1.sign() != c0.sign()).any()


def test_reflection_keeps_samples_in_the_box() -> None:
    gen = torch.Generator().manual_seed(6)
    x = torch.rand(128, 10, generator=gen) * 2 - 1
    pushing_out = lambda x: 50.0 * x.sign()  # noqa: E731  a force towards the walls
    out, _ = annealed_hmc(lambda m: pushing_out, x, [0.2, 0.1], 20, "none", gen, box=1.0)
    assert out.abs().max() <= 1.0
    xr, cr = reflect(torch.tensor([1.25, -1.5, 0.5]), torch.tensor([1.0, -2.0, 3.0]), 1.0)
    assert torch.allclose(xr, torch.tensor([0.75, -0.5, 0.5]))
    assert torch.allclose(cr, torch.tensor([-1.0, 2.0, 3.0]))


def test_step_schedules() -> None:
    sig = [2.0, 0.2, 0.02]
    assert step_schedule("sigma", 0.01, sig) == pytest.approx([1.0, 0.1, 0.01])
    paper = step_schedule("paper", 1e-5, sig)
    assert paper[0] == pytest.approx(9e-5) and paper[-1] == pytest.approx(1e-5)
    assert all(math.isfinite(s) for s in paper)
