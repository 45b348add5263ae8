"""Typed mechanism events: plain frozen dataclasses, one class per mechanism (no mapping), read
from and written to the dicts the ledger has always stored (so old ledgers keep verifying), and
composed by the same accountant as before."""

from __future__ import annotations

import dataclasses
import json
import math
import pickle
from collections.abc import Mapping

import pytest

from dpsynth.errors import UsageError
from dpsynth.ledger import Ledger
from dpsynth.privacy.accounting.compose import compose_epsilon
from dpsynth.privacy.accounting.events import (
    DpEvent,
    Gaussian,
    NonPrivate,
    PoissonGaussian,
    PureDp,
    ThresholdDelta,
    event_from_json,
    events_to_json,
)
from dpsynth.privacy.accounting.plan import ClippedGaussianSum, PrivacyPlan
from dpsynth.privacy.mechanisms.marginal_measure import measurement_event
from dpsynth.privacy.mechanisms.selection import selection_event
from dpsynth.privacy.releases.central import CentralImagesPlan

# Events as ledgers written before the typed classes stored them, annotations included.
STORED = [
    {"type": "poisson_gaussian", "noise_multiplier": 1.1, "sampling_rate": 0.01, "steps": 500},
    {"type": "poisson_gaussian", "noise_multiplier": 2.0, "sampling_rate": 0.02, "steps": 40,
     "mechanism": "rdpgan", "max_grad_norm": 1.0, "schedule": "exp", "first_step": 0},
    {"type": "gaussian", "noise_multiplier": 8.0, "mechanism": "central images",
     "clip_norm": 1.0, "count_weight": 0.5},
    {"type": "gaussian", "noise_multiplier": 30.0, "count": 12},
    {"type": "pure_dp", "epsilon": 0.05, "count": 3, "mechanism": "exponential mechanism"},
    {"type": "threshold_delta", "delta": 1e-7},
]  # fmt: skip


@pytest.mark.parametrize("stored", STORED)
def test_stored_dicts_round_trip_exactly(stored: dict) -> None:
    event = event_from_json(stored)
    assert stored["type"] == type(event).KIND
    assert event.to_json() == stored
    assert json.dumps(event.to_json(), sort_keys=True) == json.dumps(stored, sort_keys=True)
    assert event == event_from_json(json.loads(json.dumps(stored)))  # equal by its fields
    assert pickle.loads(pickle.dumps(event)) == event
    assert pickle.loads(pickle.dumps(event)).to_json() == stored


def test_events_are_plain_dataclasses_not_mappings() -> None:
    event = Gaussian(2.0, 3, annotations={"mechanism": "m"})
    assert dataclasses.is_dataclass(event) and not isinstance(event, Mapping)
    assert DpEvent.__mro__ == (DpEvent, object)
    assert event != event.to_json()  # the dict is the ledger's form, not the event
    assert event == Gaussian(2.0, 3, annotations=(("mechanism", "m"),))
    assert event != Gaussian(2.0, 3) and hash(event) == hash(
        Gaussian(2.0, 3, annotations=event.annotations)
    )
    assert (event.kind, event.annotation("mechanism"), event.annotation("x", 7)) == (
        "gaussian",
        "m",
        7,
    )
    with pytest.raises(TypeError):
        dict(event)  # type: ignore[call-overload]
    with pytest.raises(TypeError):
        _ = event["noise_multiplier"]  # type: ignore[index]
    # typed events and stored dicts side by side, as the ledger's lines hold them
    assert events_to_json([event, {"type": "pure_dp", "epsilon": 0.1}]) == [
        {"type": "gaussian", "noise_multiplier": 2.0, "count": 3, "mechanism": "m"},
        {"type": "pure_dp", "epsilon": 0.1},
    ]


def test_events_are_frozen_and_typed() -> None:
    event = PoissonGaussian(1.0, 0.1, 10, annotations={"mechanism": "m"})
    with pytest.raises(dataclasses.FrozenInstanceError):
        event.steps = 11  # type: ignore[misc]
    with pytest.raises(TypeError):
        event["steps"] = 11  # type: ignore[index]
    assert event.annotation("mechanism") == "m" and event.noise_multiplier == 1.0
    # annotations describe an event and never change its ε
    described = event_from_json({**event.to_json(), "stage": "x"})
    assert described.annotation("stage") == "x"
    assert described.composition() == event.composition()


def test_composition_is_the_same_for_dicts_and_typed_events() -> None:
    typed = [event_from_json(e) for e in STORED]
    assert all(isinstance(e, DpEvent) for e in typed)
    from_dicts = compose_epsilon(STORED, 1e-5)
    from_typed = compose_epsilon(typed, 1e-5)
    assert from_dicts == from_typed
    assert 0 < from_typed.epsilon < math.inf


def test_each_kind_composes_as_its_mechanism() -> None:
    # q = 1 Poisson steps are plain Gaussian mechanisms; count None means once.
    assert PoissonGaussian(2.0, 1.0, 3).composition() == (("gaussian", 2.0, 1.0), 3)
    assert Gaussian(2.0).composition() == (("gaussian", 2.0, 1.0), 1)
    assert PureDp(0.5, 4).composition() == (("pure_dp", 0.5, 1.0), 4)
    assert ThresholdDelta(1e-6).composition() is None
    assert PoissonGaussian(1.0, 0.1, 0).composition() is None
    assert not NonPrivate().private and not PureDp(math.inf).private
    assert not Gaussian(0.0).private and Gaussian(0.0, 0).private
    assert compose_epsilon([NonPrivate(), Gaussian(5.0)], 1e-5).epsilon == math.inf
    # δ of a thresholding step is taken off the δ the rest is composed at
    alone = compose_epsilon([Gaussian(5.0)], 1e-5 - 1e-6).epsilon
    assert compose_epsilon([Gaussian(5.0), ThresholdDelta(1e-6)], 1e-5).epsilon == alone


def test_bad_stored_events_are_refused() -> None:
    with pytest.raises(UsageError, match="unknown mechanism event type"):
        event_from_json({"type": "laplace", "scale": 1.0})
    with pytest.raises(UsageError, match="lacks a parameter"):
        event_from_json({"type": "gaussian", "count": 2})
    with pytest.raises(UsageError, match="threshold_delta"):
        ThresholdDelta(1.5)


def test_mechanisms_build_typed_events() -> None:
    assert isinstance(selection_event(0.1, 2), PureDp)
    assert isinstance(measurement_event(3.0, 5, round=1), Gaussian)
    plan = CentralImagesPlan(noise_multiplier=4.0, clip_norm=1.0, count_weight=0.5)
    assert isinstance(plan.event(), Gaussian)
    assert CentralImagesPlan.from_event(plan.event()) == plan


def test_plans_hold_typed_events_and_round_trip_through_json() -> None:
    plan = PrivacyPlan(
        private=True, target_epsilon=1.0, delta=1e-5, sampling_rate=0.01, steps=500,
        expected_batch_size=10.0, events=tuple(STORED), epsilon_bound=0.9,
        total_epsilon_bound=0.9, accountant="a", gaussian_sum=ClippedGaussianSum(1.1, 1.0),
    )  # fmt: skip
    assert all(isinstance(e, DpEvent) for e in plan.events)
    text = json.dumps(plan.to_json())  # JSON-ready: plain dicts
    back = PrivacyPlan.from_json(json.loads(text))
    assert [e.to_json() for e in back.events] == STORED
    assert back == plan
    assert (back.noise_multiplier, back.max_grad_norm) == (1.1, 1.0)


def test_a_marginal_plan_has_no_gaussian_sum_and_says_so() -> None:
    """mst and aim plans carry their noise in their events only: asking them for a DP-SGD σ
    is an error, not a made-up number, and the JSON round trip keeps it absent."""
    plan = PrivacyPlan(
        private=True, target_epsilon=1.0, delta=1e-5, sampling_rate=1.0, steps=3,
        expected_batch_size=800.0, events=(selection_event(0.1, 2),), epsilon_bound=0.9,
        total_epsilon_bound=0.9, accountant="a", gaussian_sum=None,
    )  # fmt: skip
    with pytest.raises(AttributeError, match="no clipped Gaussian sum"):
        _ = plan.noise_multiplier
    with pytest.raises(AttributeError, match="no clipped Gaussian sum"):
        _ = plan.max_grad_norm
    back = PrivacyPlan.from_json(json.loads(json.dumps(plan.to_json())))
    assert back.gaussian_sum is None and back == plan


def test_a_plan_written_before_the_split_still_reads() -> None:
    """Runs trained by 0.2 keep their plan flat (σ and C beside T and q) in config.json."""
    flat = {
        "private": False, "target_epsilon": "inf", "delta": 1e-5, "noise_multiplier": 0.0,
        "sampling_rate": 0.05, "steps": 4, "max_grad_norm": float("inf"),
        "expected_batch_size": 71.85, "events": [{"type": "non_private"}],
        "epsilon_bound": "inf", "total_epsilon_bound": "inf", "accountant": "none",
        "notes": ["NOT PRIVATE"],
    }  # fmt: skip
    plan = PrivacyPlan.from_json(json.loads(json.dumps(flat)))
    assert plan.gaussian_sum == ClippedGaussianSum(0.0, math.inf)
    assert (plan.steps, plan.sampling_rate, plan.notes) == (4, 0.05, ("NOT PRIVATE",))
    assert plan.to_json()["gaussian_sum"] == {"noise_multiplier": 0.0, "max_grad_norm": "inf"}


def test_a_ledger_line_is_the_same_text_from_dicts_and_typed_events(tmp_path) -> None:
    """What a ledger stores does not depend on whether the writer passed the old dicts or
    typed events, so ledgers written before the change verify and compose the same."""
    lines = []
    for name, events in (("dicts", STORED), ("typed", [event_from_json(e) for e in STORED])):
        book = Ledger(tmp_path / f"{name}.jsonl")
        spend = book.reserve(
            dataset_id="d", fingerprint="f", command="c", method="m", run_id="r",
            events=events, delta=1e-5,
        )  # fmt: skip
        book.complete(spend["seq"], events, run_id="r", fingerprint="f")
        assert book.verify() is not None
        lines.append([json.loads(line)["events"] for line in book.path.read_text().splitlines()])
        assert book.total_epsilon("d", 1e-5) == compose_epsilon(STORED, 1e-5).epsilon
    assert lines[0] == lines[1]


def test_each_event_describes_what_ran_with_its_noise() -> None:
    steps = PoissonGaussian(3.5551, 0.128, 2000)
    assert steps.describe() == "2,000 Poisson-subsampled Gaussian steps (σ 3.56, q 0.128)"
    marginals = Gaussian(24.8, 40, annotations={"mechanism": "Gaussian marginal counts (L2 1)"})
    assert marginals.describe() == "Gaussian marginal counts: 40 Gaussian releases (σ 24.8)"
    selections = PureDp(0.0414, 19, annotations={"mechanism": "exponential mechanism (ε-DP)"})
    assert selections.describe() == "exponential mechanism: 19 pure ε-DP releases (ε 0.0414 each)"
    assert Gaussian(0.9, annotations={"mechanism": "frequency_model"}).describe() == (
        "frequency_model: 1 Gaussian release (σ 0.9)"
    )
    assert "not private" in NonPrivate().describe()
    assert "1e-07" in ThresholdDelta(1e-7).describe()
