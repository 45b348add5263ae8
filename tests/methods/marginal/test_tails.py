"""The end bins' tails (`dpsynth.methods.marginal.tails`): a wide end bin less dense than its
neighbour is drawn from a density continuous with the neighbour's and falling outward, its
values stay in their bin, and the marginal generator draws them so."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.optimize import brentq

from dpsynth.data.discrete import Attribute, schema_domain
from dpsynth.data.schema_file import parse_schema
from dpsynth.methods.marginal.cliquetree import CliqueTree
from dpsynth.methods.marginal.domain import bin_values
from dpsynth.methods.marginal.generator import MarginalGenerator
from dpsynth.methods.marginal.tails import decay_rate, end_tails, tail_positions


@pytest.mark.parametrize("ratio", [1.001, 1.3, 2.0, 7.5, 44.0, 3e4])
def test_decay_rate_solves_its_equation(ratio: float) -> None:
    expected = brentq(lambda t: t / -math.expm1(-t) - ratio, 1e-9, 2 * ratio + 10)
    assert decay_rate(ratio) == pytest.approx(expected, rel=1e-8)
    assert decay_rate(1.0) == 0.0 and decay_rate(0.5) == 0.0


def _ages(edges: tuple[float, ...], magnitude: bool = True) -> Attribute:
    return Attribute(
        "age", "edges", len(edges) - 1, 0, edges[0], edges[-1], True, edges=edges,
        magnitude=magnitude,
    )  # fmt: skip


def _draw(attribute: Attribute, mass: np.ndarray, n: int = 200_000) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(0)
    codes = rng.choice(len(mass), size=n, p=mass / mass.sum())
    uniform = rng.random(n)
    tails = end_tails(attribute, mass)
    return codes, bin_values(codes, attribute, uniform), tails, uniform


def test_a_wide_last_bin_falls_away_from_its_neighbour() -> None:
    # ages 25-74 in 3-year bins of equal mass, the release's last bin stretched to 202
    inner = tuple(float(e) for e in range(26, 75, 3))
    edges = (21.0, *inner, 202.0)
    attribute = _ages(edges)
    mass = np.ones(len(edges) - 1)
    codes, uniform_values, tails, uniform = _draw(attribute, mass)
    # the first bin, 21-26, is 5/3 of its neighbour's width: a mild slope
    assert [t.code for t in tails] == [0, len(mass) - 1]
    assert tails[0].rate < 1.5 < 20 < tails[1].rate  # (the last in log years)
    tailed = bin_values(codes, attribute, tail_positions(codes, uniform, attribute, tails))
    last = codes == len(mass) - 1
    # every value stays in its bin, and the bins' shares are the model's
    assert (tailed[last] >= 74).all() and (tailed[last] <= 202).all()
    inside = (codes > 0) & ~last
    np.testing.assert_array_equal(tailed[inside], uniform_values[inside])
    first = codes == 0
    assert (tailed[first] >= 21).all() and (tailed[first] <= 25).all()
    # uniform: 95% of the last bin's values lie beyond 80; with the tail, a few percent
    assert np.mean(uniform_values[last] > 80) > 0.9
    assert np.mean(tailed[last] > 80) < 0.15
    # continuous at the shared edge: the age 74 holds about the share of each age of the
    # neighbour (71, 72, 73: a third of a bin's share each), a little less as the density falls
    assert np.mean(tailed[last] == 74) == pytest.approx(1 / 3, abs=0.08)


def test_no_tail_where_the_end_bins_are_as_dense_as_their_neighbours() -> None:
    edges = tuple(float(e) for e in range(0, 101, 10))
    attribute = _ages(edges)
    assert end_tails(attribute, np.ones(10)) == ()
    # a point mass at an end (zeros) has no tail, nor does an attribute without edges
    with_zero = _ages((0.0, 0.0, 10.0, 20.0, 500.0))
    tails = end_tails(with_zero, np.array([5.0, 1.0, 1.0, 1.0]))
    assert [t.code for t in tails] == [3]
    plain = Attribute("x", "bins", 8, 0, 0.0, 1.0)
    assert end_tails(plain, np.ones(8)) == ()


def test_an_end_bin_of_next_to_no_mass_has_no_tail_and_warns_nothing() -> None:
    """A denormal end-bin mass beside a full neighbour overflowed the density ratio, and a
    `sample` printed numpy's overflow warnings."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tails = end_tails(_ages((0.0, 1.0, 2.0, 3.0), False), np.array([1e-320, 5.0, 3.0]))
    assert [tail.code for tail in tails] == [2]  # the last bin's own tail only


def test_an_amount_tail_falls_in_its_logarithm_and_a_time_in_its_value() -> None:
    edges = (100.0, 200.0, 300.0, 1e6)  # incomes: the last bin spans four magnitudes
    amounts = _ages(edges)
    (tail,) = end_tails(amounts, np.array([1.0, 1.0, 1.0]))
    assert tail.log and tail.outer_is_high
    times = _ages(edges, magnitude=False)
    (time_tail,) = end_tails(times, np.array([1.0, 1.0, 1.0]))
    assert not time_tail.log
    codes = np.full(100_000, 2)
    uniform = np.random.default_rng(1).random(100_000)
    log_values = bin_values(codes, amounts, tail_positions(codes, uniform, amounts, (tail,)))
    linear = bin_values(codes, times, tail_positions(codes, uniform, times, (time_tail,)))
    # a Pareto tail reaches far (a tenth of the values beyond 700) where the exponential one
    # stays within about its neighbour's width
    assert np.mean(log_values > 700) > 0.1
    assert np.mean(linear > 700) < 0.02
    assert (log_values >= 300).all() and (log_values <= 1e6).all()


def test_a_first_bin_falls_towards_its_low_edge() -> None:
    edges = (-500.0, 40.0, 50.0, 60.0)
    attribute = _ages(edges)
    (tail,) = end_tails(attribute, np.ones(3))
    assert tail.code == 0 and not tail.outer_is_high and not tail.log
    codes = np.zeros(50_000, dtype=np.intp)
    uniform = np.random.default_rng(2).random(50_000)
    values = bin_values(codes, attribute, tail_positions(codes, uniform, attribute, (tail,)))
    assert np.median(values) > 30 and (values >= -500).all() and (values < 40).all()


SCHEMA = parse_schema({
    "target": "y",
    "columns": [
        {"name": "age", "type": "integer", "min": 21, "max": 202,
         "edges": [21, 30, 40, 50, 60, 70, 202]},
        {"name": "y", "type": "categorical", "categories": ["a", "b"]},
    ],
})  # fmt: skip


def test_the_marginal_generator_draws_the_model_s_end_bins_by_their_tails() -> None:
    domain = schema_domain(SCHEMA, 16, True)
    table = np.ones((6, 2))  # ages in 10-year bins of equal mass, the last to 202
    generator = MarginalGenerator(
        SCHEMA.classes, domain, CliqueTree(domain.sizes, [(0, 1)], [table])
    )
    labels = np.arange(30_000) % 2
    coded = generator.sample_coded(labels, np.random.default_rng(3), 0)
    ages = 21 + (coded.scaled["age"].astype(np.float64) + 1) / 2 * (202 - 21)
    last = ages >= 70
    assert last.mean() == pytest.approx(1 / 6, abs=0.02)
    # uniform over 70-202, 60% of them would lie beyond 150; the tail keeps them near 70
    assert np.mean(ages[last] > 150) < 0.02
    assert np.median(ages[last]) < 80


def test_a_neighbour_reaching_zero_leaves_a_log_tail_undrawn() -> None:
    # amounts: [0, 50) beside the last bin [50, 1e5): no common log coordinate, no tail
    attribute = _ages((0.0, 50.0, 1e5))
    assert end_tails(attribute, np.array([1.0, 1.0])) == ()
    negative = _ages((-1e5, -50.0, 0.0, 10.0))
    # the first bin's neighbour reaches 0: no tail; the last one's, [0, 10], falls in value
    (tail,) = end_tails(negative, np.array([1.0, 50.0, 1.0]))
    assert tail.code == 2 and not tail.log
