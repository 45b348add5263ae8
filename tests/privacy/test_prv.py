"""The float64 PRV accountant against the prv-accountant package and dp-accounting's PLD."""

from __future__ import annotations

import itertools
import math
import warnings

import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.privacy_accountant import NeighboringRelation
from prv_accountant import PRVAccountant
from prv_accountant.domain import Domain
from prv_accountant.other_accountants import RDP
from scipy import integrate
from scipy.fft import irfft, rfft

from dpsynth.privacy.accounting import compose as accounting
from dpsynth.privacy.accounting import prv, prv_mesh, rdp
from dpsynth.privacy.accounting.calibration import calibrate_noise
from dpsynth.privacy.accounting.compose import compose_epsilon, poisson_gaussian_event
from dpsynth.privacy.accounting.events import events_to_json

CASES = [
    # (groups of (kind, σ, q), counts, δ)
    ([("poisson_gaussian", 0.9, 0.004)], [1000], 1e-5),
    ([("poisson_gaussian", 2.0, 0.01)], [3000], 1e-6),
    ([("poisson_gaussian", 0.7, 0.05)], [200], 1e-5),
    ([("gaussian", 5.0, 1.0)], [3], 1e-5),
    ([("gaussian", 5.0, 1.0), ("poisson_gaussian", 1.0, 0.01), ("poisson_gaussian", 2.0, 0.02)],
     [3, 600, 300], 1e-6),
]  # fmt: skip


def _settings(keys, counts, delta):
    """The mesh settings `accounting` uses: ε error, δ error and the safe domain half-width."""
    rdp = accounting._rdp_epsilon(keys, counts, delta)
    eps_error = max(1e-3, 0.005 * min(rdp, 50.0))
    delta_error = delta / 1000.0
    length = max(prv_mesh.safe_domain_length(keys, counts, delta_error), eps_error) + 3.0
    return eps_error, delta_error, length


def _package(keys, counts, delta, eps_error, delta_error, length):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        accountant = PRVAccountant(
            prvs=[accounting._prv(k) for k in keys],
            max_self_compositions=list(counts),
            eps_error=eps_error,
            delta_error=delta_error,
            eps_max=length,
        )
        return accountant.compute_epsilon(delta=delta, num_self_compositions=list(counts))


def _events(keys, counts):
    events = []
    for (kind, sigma, q), count in zip(keys, counts, strict=True):
        if kind == "gaussian":
            events.append({"type": "gaussian", "noise_multiplier": sigma, "count": count})
        else:
            events.append(poisson_gaussian_event(sigma, q, count))
    return events


def pessimistic_pld_epsilon(events, delta, interval=1e-4):
    """dp-accounting's PLD ε: its pessimistic discretisation, itself an upper bound."""
    accountant = pld_privacy_accountant.PLDAccountant(
        neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE,
        value_discretization_interval=interval,
    )
    for event in events_to_json(events):
        gaussian = dp_event.GaussianDpEvent(event["noise_multiplier"])
        if event["type"] == "poisson_gaussian":
            accountant.compose(
                dp_event.PoissonSampledDpEvent(event["sampling_rate"], gaussian), event["steps"]
            )
        else:
            accountant.compose(gaussian, event["count"])
    return accountant.get_epsilon(delta)


@pytest.mark.parametrize(("keys", "counts", "delta"), CASES)
def test_float64_port_matches_the_long_double_package(keys, counts, delta):
    settings = _settings(keys, counts, delta)
    _, ref_estimate, ref_upper = _package(keys, counts, delta, *settings)
    estimate, upper = prv.prv_epsilon(keys, counts, delta, *settings)
    # The same algorithm: the estimates agree up to rounding and the quadrature of the mean
    # (ours is the tighter quadrature), and so do the upper bounds (ours also charges float64
    # rounding to δ).
    assert estimate == pytest.approx(ref_estimate, rel=1e-5)
    assert upper == pytest.approx(ref_upper, rel=1e-5)
    assert estimate < upper


def test_rounding_allowance_covers_the_observed_float64_error():
    # One long run composed in float64 and in long double (the package's number format): the
    # tail sums differ by far less than the allowance charged to δ.
    key, count = ("poisson_gaussian", 2.0, 0.01), 3000
    eps_error, delta_error, length = _settings([key], [count], 1e-6)
    mesh = eps_error / math.sqrt(count / 2.0 * math.log(12.0 / delta_error))
    pmf, _ = prv._discretise(key, prv.aligned_mesh(-length, length, mesh))
    ours = prv._self_compose(pmf, count)
    long = irfft(rfft(pmf.astype(np.longdouble)) ** count, n=len(pmf))
    long = np.roll(long, count - 1 + (len(long) // 2 if count % 2 == 0 else 0))
    gap = np.max(np.abs(np.cumsum(ours[::-1]) - np.cumsum(long[::-1])))
    allowance = prv.rounding_allowance(len(pmf), count, float(np.max(np.abs(ours))))
    assert 0 < gap < allowance / 10


@pytest.mark.parametrize(("keys", "counts", "delta"), CASES)
def test_reported_bound_is_above_pessimistic_pld_and_within_two_percent(keys, counts, delta):
    events = _events(keys, counts)
    ours = compose_epsilon(events, delta)
    assert ours.accountant == accounting.ACCOUNTANT_PRV
    reference = pessimistic_pld_epsilon(events, delta)
    # Both are upper bounds of the same ε; ours includes its ε error (0.5%·ε), PLD its own
    # pessimistic rounding (1e-4 per step at most), so ours is not below PLD's by more than
    # the latter's slack, and not looser than 2%.
    assert ours.epsilon >= reference * (1.0 - 1e-3)
    assert ours.epsilon <= reference * 1.02


def test_tiny_delta_falls_back_to_the_long_double_package():
    # At δ = 1e-11 the δ error (1e-14) is below float64 rounding over the mesh.
    keys, counts = [("poisson_gaussian", 1.5, 0.01)], [500]
    eps_error, delta_error, length = _settings(keys, counts, 1e-11)
    with pytest.raises(prv.NeedsLongDouble):
        prv.prv_epsilon(keys, counts, 1e-11, eps_error, delta_error, length)
    ours = compose_epsilon(_events(keys, counts), 1e-11)
    assert ours.accountant == accounting.ACCOUNTANT_PRV_LONG_DOUBLE
    assert math.isfinite(ours.epsilon)
    assert ours.epsilon >= pessimistic_pld_epsilon(_events(keys, counts), 1e-11) * (1.0 - 1e-3)


def test_calibrated_sigma_at_a_long_run_is_valid_and_tight_under_pld():
    epsilon, delta, q, steps = 1.0, 1e-5, 0.004, 5000
    result = calibrate_noise(epsilon, delta, q, steps)
    assert result.accountant == accounting.ACCOUNTANT_PRV
    assert result.epsilon <= epsilon
    sigma = result.noise_multiplier
    event = poisson_gaussian_event(sigma, q, steps)
    assert pessimistic_pld_epsilon([event], delta) <= epsilon
    # Within 2% of the smallest σ PLD accepts: 2% less noise fails under PLD.
    assert pessimistic_pld_epsilon([poisson_gaussian_event(sigma / 1.02, q, steps)], delta) > (
        epsilon
    )


MESHES = [(-4.2, 4.2, 1e-3), (-7.31, 7.31, 3.7e-5), (-3, 3, 0.7)]


@pytest.mark.parametrize(("low", "high", "dt"), MESHES)
def test_aligned_mesh_is_the_packages_domain(low, high, dt):
    ours = prv.aligned_mesh(low, high, dt)
    theirs = Domain.create_aligned(low, high, dt)
    assert ours.size == len(theirs)
    assert ours.t_min == pytest.approx(theirs.t_min(), abs=1e-15)
    assert ours.dt == pytest.approx(theirs.dt(), rel=1e-15)
    assert ours.t_max == pytest.approx(theirs.t_max(), abs=1e-12)


@pytest.mark.parametrize(("keys", "counts", "delta"), CASES)
def test_rdp_matches_the_packages_rdp(keys, counts, delta):
    orders = rdp.INTEGER_ORDERS
    theirs = RDP(prvs=[accounting._prv(k) for k in keys], orders=list(orders))
    _, _, expected = theirs.compute_epsilon(delta=delta, num_self_compositions=list(counts))
    assert rdp.rdp_epsilon(keys, counts, delta, orders) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(
    "key",
    [("poisson_gaussian", 2.0, 0.004), ("poisson_gaussian", 0.3, 0.004),
     ("poisson_gaussian", 0.5, 0.5), ("gaussian", 5.0, 1.0), ("gaussian", 0.3, 1.0)],
)  # fmt: skip
def test_truncated_mean_matches_quadrature_of_the_cdf(key):
    # The package's formula E[Y] = b F(b) − a F(a) − ∫ F, integrated tightly by scipy.
    t_min, t_max = -3.5, 3.5
    lower = float(prv._cdf(key, np.array([t_min]))[0])
    mass = float(prv._cdf(key, np.array([t_max]))[0]) - lower

    def cdf(t: float) -> float:
        return min(1.0, float(prv._cdf(key, np.array([t]))[0] - lower) / mass)

    points = [t_min, -1e-1, -1e-2, -1e-3, -1e-4, -1e-5, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, t_max]
    expected = 0.0
    for left, right in itertools.pairwise(points):
        area, _ = integrate.quad(cdf, left, right, limit=500, epsabs=1e-15, epsrel=1e-13)
        expected += right * cdf(right) - left * cdf(left) - area
    assert prv._truncated_mean(key, t_min, t_max, mass) == pytest.approx(expected, abs=1e-14)
