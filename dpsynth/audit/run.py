"""`dpsynth audit`'s library call: a backend's plan on public facts → a white-box audit.

The plan comes from the backend itself (`Method.config` for a preset, then `Method.plan` at the
requested ε on a built-in data set's public description: its size, shape and classes, never
its pixels), so a new backend is audited through its plan's events without any change here.
A backend whose privacy step is not DP-SGD names its mechanism in a class attribute
`audit_mechanism` ("functional" for DP-Kernel's Gaussian-process release); without one it is
audited as DP-SGD ("dpsgd").
Nothing reads a user's data or ledger: the canaries are synthetic and no spend is recorded.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from dpsynth.audit.functional import audit_field
from dpsynth.audit.whitebox import CANARY_NORM_FACTOR, audit_events
from dpsynth.data.builtin import BUILTINS
from dpsynth.data.images import DataInfo
from dpsynth.data.limits import over_budget
from dpsynth.errors import UsageError
from dpsynth.methods.recommend import AUTO, recommend_method, resolve_preset
from dpsynth.methods.registry import get_method
from dpsynth.privacy.calibration import default_delta
from dpsynth.privacy.plan import PrivacyPlan, PrivacyTarget

__all__ = ["AuditResult", "audit_memory", "check_audit_values", "public_info", "run_audit"]

MODE = "white-box"
DATA_NOTE = (
    "synthetic canaries only, on the public description of the data set (N, shape, classes): "
    "no user data is read and no ledger is read or charged"
)


@dataclass(frozen=True)
class AuditResult:
    """Claimed ε (the plan's accountant bound) beside the measured lower bound."""

    method: str
    preset: str
    data: str
    target_epsilon: float
    claimed_epsilon: float
    delta: float
    lower_bound: float
    canaries: int
    guesses: int
    guesses_in: int
    guesses_out: int
    correct: int
    confidence: float
    mode: str
    broken: str | None
    events: tuple[dict[str, Any], ...]
    max_grad_norm: float
    canary_norm: float
    note: str = DATA_NOTE

    @property
    def leaks(self) -> bool:
        """True when the measured lower bound exceeds the claimed ε."""
        return self.lower_bound > self.claimed_epsilon

    @property
    def verdict(self) -> str:
        """ "pass" (lower bound ≤ claimed) or "FAIL" (the implementation leaks more)."""
        return "FAIL" if self.leaks else "pass"

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict with the verdict."""
        out = asdict(self)
        out["events"] = [dict(e) for e in self.events]
        out["verdict"] = self.verdict
        return out


def public_info(name: str) -> DataInfo:
    """A built-in data set's public description (no pixel is read)."""
    if name not in BUILTINS:
        raise UsageError(f"unknown built-in data set {name!r}; choose from {', '.join(BUILTINS)}")
    described = BUILTINS[name]
    return DataInfo(
        spec=name,
        kind="builtin",
        n=described.n_train,
        shape=described.shape,
        classes=described.classes,
        fingerprint="audit:public-description",
        dataset_id=f"audit:{name}",
    )


def plan_for(method_name: str, preset: str, epsilon: float, data: str) -> PrivacyPlan:
    """The backend's own plan for `preset` at ε (δ: the data set's default) on public facts."""
    method = get_method(method_name)
    info = public_info(data)
    config = method.config(preset, {}, info)
    method.validate_config(config, info)
    target = PrivacyTarget(epsilon=float(epsilon), delta=default_delta(info.n))
    if not target.private:
        raise UsageError("--epsilon must be finite: a non-private run has nothing to audit")
    return method.plan(info, target, config, ())


def resolve_auto(method_name: str, preset: str, epsilon: float, data: str) -> tuple[str, str]:
    """(method, preset) with `auto` replaced by `train`'s choice for the built-in's public shape
    at ε (the choice reads no records)."""
    if AUTO not in (method_name, preset):
        return method_name, preset
    info = public_info(data)
    if method_name == AUTO:
        method_name = recommend_method(info, float(epsilon))
    return method_name, resolve_preset(get_method(method_name), preset, info, float(epsilon))


def check_audit_values(canaries: int, confidence: float) -> None:
    """UsageError for a canary count or confidence the audit cannot use, before any work."""
    if isinstance(canaries, bool) or not isinstance(canaries, int) or canaries < 2:
        raise UsageError(f"--canaries must be an integer of at least 2, got {canaries!r}")
    if not 0.0 < confidence < 1.0:
        raise UsageError(
            f"--confidence must be strictly between 0 and 1 (e.g. 0.95), got {confidence:g}"
        )


def audit_memory(mechanism: str, plan: PrivacyPlan, canaries: int) -> float:
    """Bytes the white-box audit of `canaries` canaries holds at its peak (an upper estimate).

    DP-SGD: a few float64 vectors of length m, and per step the batch's records and their
    per-record gradients, [b, m] each, b the largest Poisson batch expected (q·m/2 plus six
    standard deviations). Functional: the canaries' field and noise over m·16 points, measured
    at about 11 bytes per m² (16 here).
    """
    m = float(canaries)
    if mechanism == "functional":
        return 16.0 * m * m + 64.0 * m * 16
    rates = [float(e.get("sampling_rate", 1.0)) for e in plan.events] or [1.0]
    mean = max(rates) * m / 2.0
    batch = min(m, mean + 6.0 * mean**0.5 + 1.0)
    return 8.0 * m * (16.0 + 4.0 * batch)


def run_audit(
    method_name: str,
    preset: str,
    epsilon: float,
    *,
    canaries: int = 5000,
    confidence: float = 0.95,
    data: str = "digits",
    seed: int | None = None,
    break_mode: str | None = None,
) -> AuditResult:
    """Audit `method_name`'s mechanism as planned for `preset` at ε (one white-box run).

    `auto` for either resolves as `train` would on the data set's public description: the
    recommended method for its shape and ε, then that method's recommended preset.
    """
    check_audit_values(canaries, confidence)
    method_name, preset = resolve_auto(method_name, preset, epsilon, data)
    method = get_method(method_name)
    mechanism = getattr(method, "audit_mechanism", "dpsgd")
    if mechanism not in ("dpsgd", "functional"):
        raise UsageError(
            f"--method {method_name}: no white-box audit for its {mechanism!r} mechanism yet"
        )
    plan = plan_for(method_name, preset, epsilon, data)
    problem = over_budget(audit_memory(mechanism, plan, canaries))
    if problem:
        raise UsageError(f"--canaries {canaries}: the audit {problem}; use fewer canaries")
    if mechanism == "dpsgd":
        outcome = audit_events(
            plan.events,
            plan.max_grad_norm,
            plan.delta,
            canaries,
            confidence,
            seed=seed,
            break_mode=break_mode,
        )
        canary_norm = CANARY_NORM_FACTOR * plan.max_grad_norm
    elif mechanism == "functional":
        config = method.config(preset, {}, public_info(data))
        outcome = audit_field(
            plan.events,
            plan.max_grad_norm,
            plan.expected_batch_size,
            tuple(float(b) for b in config["bandwidths"]),
            plan.delta,
            canaries,
            confidence,
            seed=seed,
            break_mode=break_mode,
            jitter=float(config.get("jitter", 1e-8)),
        )
        canary_norm = plan.max_grad_norm
    else:
        raise UsageError(
            f"--method {method_name}: no white-box audit for its {mechanism!r} mechanism yet"
        )
    return AuditResult(
        method=method_name,
        preset=preset,
        data=data,
        target_epsilon=float(epsilon),
        claimed_epsilon=plan.epsilon_bound,
        delta=plan.delta,
        lower_bound=outcome.lower_bound,
        canaries=canaries,
        guesses=outcome.guesses,
        guesses_in=outcome.guesses_in,
        guesses_out=outcome.guesses_out,
        correct=outcome.correct,
        confidence=confidence,
        mode=f"{MODE} ({mechanism})",
        broken=break_mode,
        events=tuple(dict(e) for e in plan.events),
        max_grad_norm=plan.max_grad_norm,
        canary_norm=canary_norm,
    )
