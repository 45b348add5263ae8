"""The privacy plan of a run and the target it was calibrated for.

A plan lists the mechanisms a run will apply (typed events, `events.py`), fixed before the
first read of private data. These types belong to the privacy layer, which depends on nothing
above it; backends build plans through `dpsynth.privacy.accounting` and the training loop
records them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
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
class ClippedGaussianSum:
    """The per-step mechanism of a DP-SGD-shaped loop: each step sums the records'
    contributions, each clipped to L2 norm `max_grad_norm` (C), and adds N(0, (σC)²) to every
    coordinate. DP-SGD, the functional mechanism's kernel sums, DPAF's windows, the frequency
    model and the DP classifier all have it; a non-private baseline has σ = 0 and C = inf."""

    noise_multiplier: float
    max_grad_norm: float

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (C = inf written as the string "inf")."""
        clip = self.max_grad_norm
        return {
            "noise_multiplier": self.noise_multiplier,
            "max_grad_norm": clip if math.isfinite(clip) else "inf",
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> ClippedGaussianSum:
        """Inverse of `to_json`."""
        return cls(float(obj["noise_multiplier"]), float(obj["max_grad_norm"]))


@dataclass(frozen=True)
class PrivacyPlan:
    """The mechanisms a run will apply, fixed before the first read of private data.

    `events` are the mechanisms' typed events (dicts as the ledger stores them are read into
    them); the accountant composes these and nothing else. `steps`, `sampling_rate` and
    `expected_batch_size` are the training loop's shape: T steps, each reading a Poisson(q)
    batch of q·N records expected (a marginal method's rounds read the whole table, q = 1).
    `gaussian_sum` is the loop's clipped Gaussian sum (σ and C) for a DP-SGD-shaped plan, and
    None for a plan whose noise lives only in its events (mst and aim: marginal measurements
    and selections). `epsilon_bound` is the accountant's upper bound for this run alone;
    `total_epsilon_bound` composes it with the dataset's earlier spends. For a non-private plan
    the noise is 0, clipping is off and both bounds are inf.
    """

    private: bool
    target_epsilon: float
    delta: float
    steps: int
    sampling_rate: float
    expected_batch_size: float
    events: tuple[DpEvent, ...]
    epsilon_bound: float
    total_epsilon_bound: float
    accountant: str
    gaussian_sum: ClippedGaussianSum | None
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "events", events_from_json(self.events))

    @property
    def noise_multiplier(self) -> float:
        """σ of the loop's clipped Gaussian sum (AttributeError for a plan without one)."""
        return self._gaussian_sum().noise_multiplier

    @property
    def max_grad_norm(self) -> float:
        """C of the loop's clipped Gaussian sum (AttributeError for a plan without one)."""
        return self._gaussian_sum().max_grad_norm

    def _gaussian_sum(self) -> ClippedGaussianSum:
        if self.gaussian_sum is None:
            raise AttributeError(
                "this plan has no clipped Gaussian sum: its noise is in its events "
                f"({', '.join(sorted({e.kind for e in self.events}))})"
            )
        return self.gaussian_sum

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
            steps=steps,
            sampling_rate=sampling_rate,
            expected_batch_size=sampling_rate * n,
            events=(NonPrivate(annotations={"sampling_rate": sampling_rate, "steps": steps}),),
            epsilon_bound=math.inf,
            total_epsilon_bound=math.inf,
            accountant="none (not private)",
            gaussian_sum=ClippedGaussianSum(0.0, math.inf),
            notes=("NOT PRIVATE: trained without clipping or noise (--epsilon inf)",),
        )

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (inf written as the string "inf")."""
        out: dict[str, Any] = {
            "private": self.private,
            "target_epsilon": self.target_epsilon,
            "delta": self.delta,
            "steps": self.steps,
            "sampling_rate": self.sampling_rate,
            "expected_batch_size": self.expected_batch_size,
            "gaussian_sum": None if self.gaussian_sum is None else self.gaussian_sum.to_json(),
            "events": [e.to_json() for e in self.events],
            "epsilon_bound": self.epsilon_bound,
            "total_epsilon_bound": self.total_epsilon_bound,
            "accountant": self.accountant,
            "notes": list(self.notes),
        }
        for key in ("target_epsilon", "epsilon_bound", "total_epsilon_bound"):
            if not math.isfinite(out[key]):
                out[key] = "inf"
        return out

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> PrivacyPlan:
        """Inverse of `to_json`. Also reads the flat form of plans written before 0.3 (σ and C
        beside T and q), whose every plan had a Gaussian sum."""
        data = dict(obj)
        for key in ("target_epsilon", "epsilon_bound", "total_epsilon_bound"):
            data[key] = float(data[key])
        if "gaussian_sum" in data:
            loop = data["gaussian_sum"]
            data["gaussian_sum"] = None if loop is None else ClippedGaussianSum.from_json(loop)
        else:
            data["gaussian_sum"] = ClippedGaussianSum(
                float(data.pop("noise_multiplier")), float(data.pop("max_grad_norm"))
            )
        data["events"] = events_from_json(data["events"])
        data["notes"] = tuple(data.get("notes", ()))
        return cls(**data)
