"""`dpsynth audit`'s library call: a backend's plan on public facts → a white-box audit.

The plan comes from the backend itself (`Method.config` for a preset, then `Method.plan` at the
requested ε on a built-in data set's public description: its size, shape and classes, never
its pixels), so a new backend is audited through its plan's events without any change here.
A backend whose privacy step is not DP-SGD names its mechanism in a class attribute
`audit_mechanism` ("functional" for DP-Kernel's Gaussian-process release, "marginal" for AIM's
and MST's measurements and selections, "frequency_model" for `freq`); without one it is
audited as DP-SGD ("dpsgd"). A plan's one-shot releases, whatever the backend, run through
their own code beside its other steps (`auditing/releases.py`: the frequency model's
`frequency_statistics`, the central images' `noisy_statistics`). A table's public
description is its schema and N (`auditing/tables.py`).
Nothing reads a user's data or ledger: the canaries are synthetic and no spend is recorded.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from dpsynth.auditing.breaks import break_mode_of, check_break
from dpsynth.auditing.composition import ComposedBound
from dpsynth.auditing.functional import audit_field, field_canary_scores
from dpsynth.auditing.guesses import GuessOutcome
from dpsynth.auditing.limits import audit_memory, check_audit_values
from dpsynth.auditing.marginal import TABLE_CANARIES, audit_marginal_plan, canary_capacity
from dpsynth.auditing.releases import (
    RELEASE_BREAKS,
    audit_with_releases,
    release_name,
    split_releases,
)
from dpsynth.auditing.tables import is_table_data, table_info
from dpsynth.auditing.whitebox import (
    BREAK_MODES,
    CANARY_NORM_FACTOR,
    audit_events,
    canary_scores,
    mechanism_steps,
)
from dpsynth.data.builtin import BUILTINS
from dpsynth.data.images import DataInfo
from dpsynth.data.limits import over_budget
from dpsynth.errors import UsageError
from dpsynth.methods.recommend import AUTO, TIERS, recommend_method, resolve_preset
from dpsynth.methods.registry import get_method
from dpsynth.privacy.accounting.calibration import default_delta
from dpsynth.privacy.accounting.events import DpEvent
from dpsynth.privacy.accounting.plan import PrivacyPlan, PrivacyTarget

__all__ = ["AuditResult", "audit_memory", "check_audit_values", "public_info", "run_audit"]

MODE = "white-box"
IMAGE_CANARIES = 5000
DATA_NOTE = (
    "synthetic canaries only, on the public description of the data set (N, shape, classes): "
    "no user data is read and no ledger is read or charged"
)
TABLE_NOTE = (
    "synthetic canary records only, on the table's public schema and N: no row is read and no "
    "ledger is read or charged"
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
    events: tuple[DpEvent, ...]
    max_grad_norm: float
    canary_norm: float
    note: str = DATA_NOTE
    # Audits of single events against their own claims (a marginal plan's measurements and
    # selections): each part's verdict counts.
    parts: tuple[dict[str, Any], ...] = ()
    # The test whose bound is reported ("one-run": the guesses above; "trials": the region in
    # `trials`; "family": the region and factor in `family`, `auditing/family.py`).
    trials: dict[str, Any] | None = None
    test: str = "one-run"
    # Independent runs of the mechanism, each on `canaries` canaries of its own.
    runs: int = 1
    # `train`'s `--set` values the plan was made with ("key=value").
    overrides: tuple[str, ...] = ()
    # The parts' bounds composed (`auditing/composition.py`): a marginal plan's lower bound is
    # the larger of it and its best part's.
    composition: dict[str, Any] | None = None
    # The family test beside the trials test (the plan's noise family, a common factor k).
    family: dict[str, Any] | None = None

    @property
    def leaks(self) -> bool:
        """True when the measured lower bound exceeds the claimed ε (or a part's its own)."""
        return self.lower_bound > self.claimed_epsilon or any(
            p["verdict"] == "FAIL" for p in self.parts
        )

    @property
    def verdict(self) -> str:
        """ "pass" (lower bound ≤ claimed) or "FAIL" (the implementation leaks more)."""
        return "FAIL" if self.leaks else "pass"

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict with the verdict."""
        out = asdict(self)
        out["events"] = [e.to_json() for e in self.events]
        out["parts"] = [dict(p) for p in self.parts]
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


def describe(data: str, schema: str | None = None) -> DataInfo:
    """The public description of `--data`: a built-in image set's, or a table's (schema, N)."""
    if is_table_data(data):
        return table_info(data, schema)
    if schema is not None:
        raise UsageError("--schema applies to a table (--data german-credit or csv:PATH)")
    return public_info(data)


def _wrong_modality(method_name: str, modalities: tuple[str, ...]) -> UsageError:
    """The error for data of a kind the method does not take."""
    return UsageError(
        f"--method {method_name} takes {' and '.join(modalities)} data; audit it on "
        + (
            "german-credit or csv:PATH --schema FILE"
            if "table" in modalities
            else "a built-in image set (--data digits)"
        )
    )


def plan_for(
    method_name: str, preset: str, epsilon: float, data: str, schema: str | None = None,
    overrides: Mapping[str, str] | None = None,
) -> PrivacyPlan:  # fmt: skip
    """The backend's own plan for `preset` (with `train`'s `--set` overrides) at ε (δ: the data
    set's default) on public facts."""
    return planned(method_name, preset, epsilon, data, schema, overrides)[2]


def planned(
    method_name: str, preset: str, epsilon: float, data: str, schema: str | None = None,
    overrides: Mapping[str, str] | None = None,
) -> tuple[DataInfo, dict[str, Any], PrivacyPlan]:  # fmt: skip
    """The data's public description, the run's checked configuration and `plan_for`'s plan."""
    method = get_method(method_name)
    # an image method given a table spec (or the reverse): say so before the data's own checks
    if ("table" if is_table_data(data) else "image") not in method.modalities:
        raise _wrong_modality(method_name, method.modalities)
    info = describe(data, schema)
    if info.modality not in method.modalities:
        raise _wrong_modality(method_name, method.modalities)
    config = method.config(preset, dict(overrides or {}), info)
    method.validate_config(config, info)
    target = PrivacyTarget(epsilon=float(epsilon), delta=default_delta(info.n))
    if not target.private:
        raise UsageError("--epsilon must be finite: a non-private run has nothing to audit")
    return info, config, method.plan(info, target, config, ())


def resolve_auto(
    method_name: str, preset: str, epsilon: float, data: str, schema: str | None = None
) -> tuple[str, str]:
    """(method, preset) with `auto` replaced by `train`'s choice for the built-in's public shape
    at ε (the choice reads no records)."""
    if method_name != AUTO and preset not in TIERS:
        return method_name, preset
    info = describe(data, schema)
    if method_name == AUTO:
        method_name = recommend_method(info, float(epsilon))
    return method_name, resolve_preset(get_method(method_name), preset, info, float(epsilon))


def run_audit(
    method_name: str,
    preset: str,
    epsilon: float,
    *,
    canaries: int | None = None,
    confidence: float = 0.95,
    data: str = "digits",
    seed: int | None = None,
    break_mode: str | None = None,
    schema: str | None = None,
    runs: int = 1,
    overrides: Mapping[str, str] | None = None,
) -> AuditResult:
    """Audit `method_name`'s mechanism as planned for `preset` at ε (one white-box run).

    `auto` for either resolves as `train` would on the data set's public description: the
    recommended method for its shape and ε, then that method's recommended preset. A plan
    with the frequency model's or the central images' release, the DP classifier (a teacher)
    or DPAF's windows audits them through their own code, together with the rest of the plan;
    a marginal plan (aim, mst) audits its measurements and selections through
    `MarginalQueries`. `canaries` (per run) defaults to `IMAGE_CANARIES`, or `TABLE_CANARIES`
    on a table; `runs` independent runs pool their canaries (the multiple-run audit: memory of
    one run, trials of all). `overrides` are `train`'s `--set` values: audit what you train.
    """
    requested = canaries
    default = TABLE_CANARIES if is_table_data(data) else IMAGE_CANARIES
    canaries = default if canaries is None else canaries
    check_audit_values(canaries, confidence, runs)
    method_name, preset = resolve_auto(method_name, preset, epsilon, data, schema)
    method = get_method(method_name)
    mechanism = getattr(method, "audit_mechanism", "dpsgd")
    if mechanism == "frequency_model":
        mechanism = "dpsgd"  # the release through its own code, the teacher's steps as DP-SGD
    if mechanism not in ("dpsgd", "functional", "marginal"):
        raise UsageError(
            f"--method {method_name}: no white-box audit for its {mechanism!r} mechanism yet"
        )
    if mechanism == "marginal" and not is_table_data(data):
        raise UsageError(
            f"--method {method_name} audits tables: pass --data german-credit or "
            "--data csv:PATH --schema FILE"
        )
    info, config, plan = planned(method_name, preset, epsilon, data, schema, overrides)
    problem = over_budget(audit_memory(mechanism, plan, canaries))
    if problem:
        raise UsageError(f"--canaries {canaries}: the audit {problem}; use fewer canaries")
    parts: tuple[dict[str, Any], ...] = ()
    composition: ComposedBound | None = None
    # Without a clipped Gaussian sum (a marginal plan) a record moves each marginal's cell by 1.
    canary_norm = sensitivity = 1.0 if plan.gaussian_sum is None else plan.max_grad_norm
    if mechanism == "marginal":
        outcome, parts, canaries, composition = _marginal(
            config, info, plan, requested, confidence, seed, break_mode, runs
        )
        label = "marginal"
    else:
        outcome, label, parts = _gradient_steps(
            mechanism, config, info, plan, canaries, confidence, seed, break_mode, runs
        )
        if mechanism == "dpsgd":
            canary_norm = CANARY_NORM_FACTOR * plan.max_grad_norm
    return AuditResult(
        method=method_name,
        preset=preset,
        data=data,
        target_epsilon=float(epsilon),
        claimed_epsilon=plan.epsilon_bound,
        delta=plan.delta,
        # each part's bound is one on the whole plan too (its release is part of the output)
        lower_bound=max(
            outcome.lower_bound,
            *(p["lower_bound"] for p in parts),
            composition.lower_bound if composition else 0.0,
            composition.family_lower_bound if composition else 0.0,
        ),
        canaries=canaries,
        guesses=outcome.guesses,
        guesses_in=outcome.guesses_in,
        guesses_out=outcome.guesses_out,
        correct=outcome.correct,
        confidence=confidence,
        mode=f"{MODE} ({label})",
        broken=break_mode,
        events=plan.events,
        max_grad_norm=sensitivity,
        canary_norm=canary_norm,
        note=TABLE_NOTE if mechanism == "marginal" else DATA_NOTE,
        parts=parts,
        trials=None if outcome.trials is None else outcome.trials.to_json(),
        family=None if outcome.family is None else outcome.family.to_json(),
        test=outcome.test,
        runs=runs,
        overrides=tuple(f"{k}={v}" for k, v in (overrides or {}).items()),
        composition=None if composition is None else composition.to_json(),
    )


def _marginal(
    config: Mapping[str, Any],
    info: DataInfo,
    plan: PrivacyPlan,
    canaries: int | None,
    confidence: float,
    seed: int | None,
    break_mode: str | None,
    runs: int,
) -> tuple[GuessOutcome, tuple[dict[str, Any], ...], int, ComposedBound]:
    """A marginal plan's parts, the canaries per run (by default `TABLE_CANARIES`, or as many
    as the table's cells allow), the part with the largest lower bound and the parts' bounds
    composed (each part holds at 1 − β/k, so these hold together at 1 − β and each is a lower
    bound on the whole plan's ε)."""
    from dpsynth.methods.marginal.domain import table_domain

    domain = table_domain(info, config)
    if canaries is None:
        canaries = min(TABLE_CANARIES, canary_capacity(domain))
    parts, composed = audit_marginal_plan(
        domain, plan.events, plan.delta, canaries, confidence, seed=seed, break_mode=break_mode,
        runs=runs,
    )  # fmt: skip
    best = max(parts, key=lambda p: p.outcome.lower_bound)
    return best.outcome, tuple(p.to_json() for p in parts), canaries, composed


def _gradient_steps(
    mechanism: str,
    config: Mapping[str, Any],
    info: DataInfo,
    plan: PrivacyPlan,
    canaries: int,
    confidence: float,
    seed: int | None,
    break_mode: str | None,
    runs: int,
) -> tuple[GuessOutcome, str, tuple[dict[str, Any], ...]]:
    """DP-SGD or the functional mechanism for the plan's steps; a one-shot release in the
    plan (frequency model, central images) runs through its own code beside them."""
    releases, others = split_releases(plan.events)
    release = releases or None
    allowed = BREAK_MODES + tuple(b for b in RELEASE_BREAKS if b not in BREAK_MODES)
    check_break(break_mode, allowed)
    step_break = break_mode if break_mode_of(break_mode) in BREAK_MODES else None
    if mechanism == "functional":
        bandwidths = tuple(float(b) for b in config["bandwidths"])
        jitter = float(config.get("jitter", 1e-8))
        if release is None:
            outcome = audit_field(
                plan.events, plan.max_grad_norm, plan.expected_batch_size, bandwidths,
                plan.delta, canaries, confidence, seed=seed, break_mode=break_mode, jitter=jitter,
                runs=runs,
            )  # fmt: skip
            return outcome, mechanism, ()

        def rest(events, included, generator):  # type: ignore[no-untyped-def]
            return field_canary_scores(
                mechanism_steps(events), plan.max_grad_norm, plan.expected_batch_size,
                bandwidths, included, generator, step_break, jitter,
            )  # fmt: skip
    else:
        if release is None:
            outcome = audit_events(
                plan.events, plan.max_grad_norm, plan.delta, canaries, confidence,
                seed=seed, break_mode=break_mode, runs=runs,
            )  # fmt: skip
            return outcome, mechanism, ()

        def rest(events, included, generator):  # type: ignore[no-untyped-def]
            # the ghost path: the steps behind a release are the audit's dearest canaries
            return canary_scores(
                mechanism_steps(events), plan.max_grad_norm, included, generator, step_break,
                grad_mode="ghost",
            )  # fmt: skip

    outcome, own = audit_with_releases(
        plan.events, info.shape, rest, plan.delta, canaries, confidence, seed, break_mode, runs
    )
    names = " + ".join(release_name(e) for e in releases)
    label = f"{names} + {mechanism}" if others else names
    return outcome, label, tuple(p.to_json() for p in own)
