"""The privacy plan of a run and the target it was calibrated for.

A plan lists the mechanisms a run will apply (typed events, `events.py`), fixed before the
first read of private data. These types belong to the privacy layer, which depends on nothing
above it; backends build plans through `dpsynth.privacy.accounting` and the training loop
records them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from dpsynth.privacy.accounting.events import DpEvent, NonPrivate, events_from_json


@dataclass(frozen=True)
class PrivacyTarget:
    """What the user asked for: ε (math.inf for a non-private baseline) and δ."""

    epsilon: float
    delta: float

    @property
    def private(self) -> bool:
        """False for the `--epsilon inf` baseline."""
        return math.isfinite(self.epsilon)


@dataclass(frozen=True)
class PrivacyPlan:
    """The mechanisms a run will apply, fixed before the first read of private data.

    `events` are the mechanisms' typed events (dicts as the ledger stores them are read into
    them). `epsilon_bound` is the
    accountant's upper bound for this run alone; `total_epsilon_bound` composes it with the
    dataset's earlier spends. For a non-private plan the noise is 0, clipping is off and both
    bounds are inf.
    """

    private: bool
    target_epsilon: float
    delta: float
    noise_multiplier: float
    sampling_rate: float
    steps: int
    max_grad_norm: float
    expected_batch_size: float
    events: tuple[DpEvent, ...]
    epsilon_bound: float
    total_epsilon_bound: float
    accountant: str
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "events", events_from_json(self.events))

    @classmethod
    def non_private_loop(
        cls, delta: float, sampling_rate: float, steps: int, n: int
    ) -> PrivacyPlan:
        """The `--epsilon inf` baseline of a loop of `steps` Poisson(q) steps over N records:
        no clipping, no noise, ε = inf, one `NonPrivate` event."""
        return cls(
            private=False,
            target_epsilon=math.inf,
            delta=delta,
            noise_multiplier=0.0,
            sampling_rate=sampling_rate,
            steps=steps,
            max_grad_norm=math.inf,
            expected_batch_size=sampling_rate * n,
            events=(NonPrivate(annotations={"sampling_rate": sampling_rate, "steps": steps}),),
            epsilon_bound=math.inf,
            total_epsilon_bound=math.inf,
            accountant="none (not private)",
            notes=("NOT PRIVATE: trained without clipping or noise (--epsilon inf)",),
        )

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (inf written as the string "inf")."""
        out = asdict(self)
        out["events"] = [e.to_json() for e in self.events]
        out["notes"] = list(self.notes)
        for key in ("target_epsilon", "epsilon_bound", "total_epsilon_bound"):
            if not math.isfinite(out[key]):
                out[key] = "inf"
        return out

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> PrivacyPlan:
        """Inverse of `to_json`."""
        data = dict(obj)
        for key in ("target_epsilon", "epsilon_bound", "total_epsilon_bound"):
            data[key] = float(data[key])
        data["events"] = events_from_json(data["events"])
        data["notes"] = tuple(data.get("notes", ()))
        return cls(**data)
