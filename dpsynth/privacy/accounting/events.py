"""Mechanism events: frozen, typed records of what a run applies, one class per mechanism.

An event says which mechanism ran and with what parameters, never what it released; the
accountants (`compose.py`) turn a sequence of events into an ε bound, and the ledger stores
each event as its `to_json()` dict. `event_from_json` reads those dicts back, so every ledger
ever written keeps verifying: the JSON form is the one the project has always stored
(`{"type": "poisson_gaussian", "noise_multiplier": σ, ...}`), including keys a writer added
to describe the event (`mechanism`, `label`, `stage`, …), which are kept as `annotations` and
have no effect on ε.

An event is a plain frozen dataclass: its parameters are fields (`event.noise_multiplier`),
its kind is `event.kind`, a writer's description is `event.annotation("mechanism")`, and
equality is that of the fields. It is not a mapping: the ledger's dict is `to_json()`, and
`event_from_json` reads one back. Code that takes either a typed event or a stored dict (the
accountant, whose prior events come from the ledger) says `AnyEvent`.

Adjacency is add/remove-one-record throughout (the Opacus and prv-accountant convention). The
kinds:

- `PoissonGaussian`: `steps` Poisson-subsampled Gaussian steps (rate q, noise multiplier σ,
  sensitivity 1 after clipping): DP-SGD and its relatives;
- `Gaussian`: `count` Gaussian mechanisms of sensitivity 1 on the whole data (q = 1);
- `PureDp`: `count` pure ε-DP mechanisms, e.g. the exponential mechanism's selections;
- `NonPrivate`: a step without noise (the `--epsilon inf` baseline): ε = inf;
- `ThresholdDelta`: the failure probability δ_t of a thresholding step (a sparse histogram
  releasing a category list), added to the δ of everything it is composed with.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from dpsynth.errors import UsageError

# The composition key of a mechanism: ("gaussian" | "poisson_gaussian" | "pure_dp", the noise
# multiplier σ or, for pure DP, ε, the sampling rate q).
CompositionKey = tuple[str, float, float]


@dataclass(frozen=True)
class DpEvent:
    """One mechanism event; subclasses name their kind in `KIND` and their parameters as
    fields."""

    KIND: ClassVar[str] = ""
    # (key, value) pairs, in order; a mapping given here is stored so (picklable, immutable).
    annotations: tuple[tuple[str, Any], ...] = field(default=(), kw_only=True)

    def __post_init__(self) -> None:
        pairs = self.annotations
        items = pairs.items() if isinstance(pairs, Mapping) else pairs
        object.__setattr__(self, "annotations", tuple((str(k), v) for k, v in items))

    @property
    def kind(self) -> str:
        """The ledger's `type` of this event (`KIND`)."""
        return self.KIND

    def annotation(self, key: str, default: Any = None) -> Any:
        """The value a writer annotated the event with under `key` (`mechanism`, `label`,
        `stage`, …), or `default`; annotations have no effect on ε."""
        for name, value in self.annotations:
            if name == key:
                return value
        return default

    def to_json(self) -> dict[str, Any]:
        """The dict the ledger stores: `type`, the parameters that are set, the annotations."""
        out: dict[str, Any] = {"type": self.KIND}
        for spec in fields(self):
            value = getattr(self, spec.name)
            if spec.name != "annotations" and value is not None:
                out[spec.name] = value
        out.update(dict(self.annotations))
        return out

    def composition(self) -> tuple[CompositionKey, int] | None:
        """The mechanism's composition key and how many times it runs; None when it adds no ε
        of its own (nothing ran, or a thresholding step's δ)."""
        return None

    def describe(self) -> str:
        """One line for a person: what ran, how often and with what noise, after the name its
        `mechanism` annotation gives (up to its first colon or parenthesis)."""
        what = self._what()
        name = str(self.annotation("mechanism", "")).split(" (")[0].split(":")[0]
        return f"{name.strip()}: {what}" if name.strip() else what

    def _what(self) -> str:
        return self.KIND

    @property
    def private(self) -> bool:
        """False when this event alone makes the composition ε = inf."""
        return True


@dataclass(frozen=True)
class PoissonGaussian(DpEvent):
    """`steps` Poisson-subsampled Gaussian steps (rate `sampling_rate`, `noise_multiplier` σ)."""

    KIND: ClassVar[str] = "poisson_gaussian"
    noise_multiplier: float
    sampling_rate: float
    steps: int

    def composition(self) -> tuple[CompositionKey, int] | None:
        if int(self.steps) <= 0:
            return None
        sigma, q = float(self.noise_multiplier), float(self.sampling_rate)
        kind = "gaussian" if q >= 1.0 else "poisson_gaussian"
        return (kind, sigma, 1.0 if q >= 1.0 else q), int(self.steps)

    @property
    def private(self) -> bool:
        return _positive(self.noise_multiplier) or int(self.steps) <= 0

    def _what(self) -> str:
        sigma, q = float(self.noise_multiplier), float(self.sampling_rate)
        return f"{int(self.steps):,} Poisson-subsampled Gaussian steps (σ {sigma:.3g}, q {q:.3g})"


@dataclass(frozen=True)
class Gaussian(DpEvent):
    """`count` Gaussian mechanisms of sensitivity 1 (None: once, as old ledgers wrote it)."""

    KIND: ClassVar[str] = "gaussian"
    noise_multiplier: float
    count: int | None = None

    @property
    def times(self) -> int:
        """How many times the mechanism runs."""
        return 1 if self.count is None else int(self.count)

    def composition(self) -> tuple[CompositionKey, int] | None:
        if self.times <= 0:
            return None
        return ("gaussian", float(self.noise_multiplier), 1.0), self.times

    @property
    def private(self) -> bool:
        return _positive(self.noise_multiplier) or self.times <= 0

    def _what(self) -> str:
        plural = "s" if self.times != 1 else ""
        return f"{self.times:,} Gaussian release{plural} (σ {float(self.noise_multiplier):.3g})"


@dataclass(frozen=True)
class PureDp(DpEvent):
    """`count` pure `epsilon`-DP mechanisms, composed through their dominating pair,
    randomized response (Kairouz et al. 2015; its PRV is ±ε), which PRV composition allows
    under adaptive choice of what each selects (Zhu et al. 2022)."""

    KIND: ClassVar[str] = "pure_dp"
    epsilon: float
    count: int | None = None

    @property
    def times(self) -> int:
        """How many times the mechanism runs."""
        return 1 if self.count is None else int(self.count)

    def composition(self) -> tuple[CompositionKey, int] | None:
        if self.times <= 0 or float(self.epsilon) == 0.0 or not self.private:
            return None
        return ("pure_dp", float(self.epsilon), 1.0), self.times

    @property
    def private(self) -> bool:
        epsilon = float(self.epsilon)
        return self.times <= 0 or epsilon == 0.0 or (epsilon > 0 and math.isfinite(epsilon))

    def _what(self) -> str:
        plural = "s" if self.times != 1 else ""
        return f"{self.times:,} pure ε-DP release{plural} (ε {float(self.epsilon):.3g} each)"


@dataclass(frozen=True)
class NonPrivate(DpEvent):
    """A step without noise (the `--epsilon inf` baseline); its annotations say what ran
    (`sampling_rate`, `steps`, a `label`)."""

    KIND: ClassVar[str] = "non_private"

    @property
    def private(self) -> bool:
        return False

    def _what(self) -> str:
        return "no noise: not private"


@dataclass(frozen=True)
class ThresholdDelta(DpEvent):
    """The failure probability `delta` of a thresholding step: no ε of its own; it is taken
    off the δ at which the rest is composed."""

    KIND: ClassVar[str] = "threshold_delta"
    delta: float

    def __post_init__(self) -> None:
        super().__post_init__()
        value = float(self.delta)
        if not (0.0 <= value < 1.0) or math.isnan(value):
            raise UsageError(f"a threshold_delta event needs δ in [0, 1), got {value}")

    def _what(self) -> str:
        return f"a threshold that fails with probability ≤ {float(self.delta):.3g} (off δ)"


# A typed event, or the dict the ledger stores of one (what the accountant composes).
AnyEvent = DpEvent | Mapping[str, Any]

EVENT_KINDS: dict[str, type[DpEvent]] = {
    kind.KIND: kind for kind in (PoissonGaussian, Gaussian, PureDp, NonPrivate, ThresholdDelta)
}


def event_from_json(obj: AnyEvent) -> DpEvent:
    """The typed event of a stored dict (an event passes through); UsageError for an unknown
    kind or a missing parameter. Values are kept as stored, so `to_json` gives the dict back."""
    if isinstance(obj, DpEvent):
        return obj
    if not isinstance(obj, Mapping):
        raise UsageError(f"a mechanism event is a dict with a string 'type', got {obj!r}")
    kind = EVENT_KINDS.get(obj.get("type"))  # type: ignore[arg-type]
    if kind is None:
        raise UsageError(f"unknown mechanism event type {obj.get('type')!r}")
    names = {spec.name for spec in fields(kind)} - {"annotations"}
    params = {name: obj[name] for name in names if name in obj}
    annotations = tuple((k, v) for k, v in obj.items() if k != "type" and k not in names)
    try:
        return kind(**params, annotations=annotations)
    except TypeError as exc:
        raise UsageError(f"a {kind.KIND} event lacks a parameter: {obj!r}") from exc


def events_from_json(objs: Iterable[AnyEvent]) -> tuple[DpEvent, ...]:
    """`event_from_json` of each."""
    return tuple(event_from_json(obj) for obj in objs)


def events_to_json(events: Iterable[AnyEvent]) -> list[dict[str, Any]]:
    """The dict the ledger stores of each event (`to_json`); a stored dict stays as it is."""
    return [e.to_json() if isinstance(e, DpEvent) else dict(e) for e in events]


def _positive(sigma: float) -> bool:
    sigma = float(sigma)
    return sigma > 0 and not math.isnan(sigma)


def gaussian_release(noise_multiplier: float, **annotations: Any) -> DpEvent:
    """One Gaussian release of the whole data at σ = `noise_multiplier` (sensitivity 1 after
    the release's own scaling), or its non-private baseline at σ = 0."""
    if noise_multiplier > 0:
        return Gaussian(float(noise_multiplier), 1, annotations=annotations)
    return NonPrivate(annotations={"sampling_rate": 1.0, "steps": 1, **annotations})
