"""The anchor that binds a run to its spend in the ledger, and its check.

A run directory keeps the seq and hash of the ledger line that reserved its spend
(`config.json` → `ledger.spend_seq`, `ledger.spend_hash`). Everything that acts on a run's
privacy (resuming it, stating its ε on a sample or an evaluation) trusts the ledger line the
anchor points at, never the run directory alone: the line must exist in the ledger used, carry
exactly that hash, be a spend of this run id on this data (dataset id and fingerprint), and
record the same mechanism events as the run's plan. An edited `config.json` (another σ, another
run's seq) or another ledger (a different working directory) is refused with one line.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dpsynth.errors import DataError, UsageError
from dpsynth.privacy.ledger import Ledger
from dpsynth.privacy.ledger_file import canonical_json, json_safe


class AnchorError(UsageError):
    """A run's anchor does not match the ledger (exit 2): wrong ledger, or an edited run."""


class RunConfigEditedError(DataError):
    """config.json no longer matches the configuration its spend was reserved for (exit 4)."""


# The parts of a run's config.json that its spend binds: what is trained, on what, and how.
BOUND_CONFIG_KEYS = ("method", "config", "data", "privacy")


def run_config_digest(run_config: Mapping[str, Any]) -> str:
    """SHA-256 of the canonical JSON of the run's method, hyper-parameters, data description
    and privacy plan (`BOUND_CONFIG_KEYS`), as recorded in the spend at reservation."""
    bound = {key: run_config.get(key) for key in BOUND_CONFIG_KEYS}
    return hashlib.sha256(canonical_json(json_safe(bound)).encode("ascii")).hexdigest()


@dataclass(frozen=True)
class SpendAnchor:
    """Where a run's spend lives in the ledger: its seq and the SHA-256 hash of that line."""

    seq: int
    hash: str

    @classmethod
    def from_run_config(cls, run_config: Mapping[str, Any], run_name: str) -> SpendAnchor:
        """The anchor a run's `config.json` holds; AnchorError if it has none or a bad one."""
        ledger = run_config.get("ledger")
        seq = ledger.get("spend_seq") if isinstance(ledger, Mapping) else None
        digest = ledger.get("spend_hash") if isinstance(ledger, Mapping) else None
        if (
            isinstance(seq, bool)
            or not isinstance(seq, int)
            or seq < 0
            or not isinstance(digest, str)
            or len(digest) != 64
        ):
            raise AnchorError(
                f"{run_name}: config.json has no valid ledger anchor (ledger.spend_seq and "
                "ledger.spend_hash); it was edited or not written by dpsynth train"
            )
        return cls(seq, digest)


def _same_events(a: Sequence[Mapping[str, Any]], b: Sequence[Mapping[str, Any]]) -> bool:
    return canonical_json(json_safe(list(a))) == canonical_json(json_safe(list(b)))


def loop_events(
    private: bool, noise_multiplier: float, sampling_rate: float, steps: int
) -> dict[str, Any]:
    """The event that the shared training loop's parameters imply (σ, q, T, or non-private)."""
    if not private:
        return {"type": "non_private", "sampling_rate": float(sampling_rate), "steps": int(steps)}
    return {
        "type": "poisson_gaussian",
        "noise_multiplier": float(noise_multiplier),
        "sampling_rate": float(sampling_rate),
        "steps": int(steps),
    }


_ACCOUNTED_KEYS = ("type", "noise_multiplier", "sampling_rate", "steps")
# The annotation by which an event declares loop steps that read no data (they cost nothing).
IDLE_STEPS_KEY = "loop_steps_without_reads"


def idle_loop_steps(events: Sequence[Mapping[str, Any]]) -> int:
    """How many of the loop's steps read no data, as the plan's events declare (a value that
    is not a whole number ≥ 0 is an edited plan: AnchorError)."""
    total = 0
    for event in events:
        value = event.get(IDLE_STEPS_KEY, 0)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise AnchorError(f"the plan's {IDLE_STEPS_KEY} must be a whole number ≥ 0")
        total += value
    return total


def _merged_loop_events(events: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The events as the accountant composes them: annotation keys dropped, and the steps of
    events with the same type, σ and q added up (a backend may record the phases of one loop,
    all at the loop's σ and q, as separate annotated events)."""
    merged: dict[tuple, dict[str, Any]] = {}
    for event in events:
        if event.get("type") != "poisson_gaussian" or not isinstance(event.get("steps"), int):
            continue
        core = {k: event[k] for k in _ACCOUNTED_KEYS if k in event}
        key = (core.get("noise_multiplier"), core.get("sampling_rate"))
        if key in merged:
            merged[key]["steps"] += core["steps"]
        else:
            merged[key] = core
    return list(merged.values())


def _is_schedule(
    events: Sequence[Mapping[str, Any]],
    private: bool,
    noise_multiplier: float,
    sampling_rate: float,
    steps: int,
) -> bool:
    """True for a noise schedule: only `poisson_gaussian` events, all at the loop's q, whose
    steps add up to the loop's T and whose smallest σ is the plan's σ.

    A backend with a σ schedule (rdpgan) takes each step's σ from these events, which the
    ledger holds; the plan's single σ is their minimum, so every ε computed from it alone (the
    loop's progress display) is an upper bound on the schedule's.
    """
    if not private or not events:
        return False
    if any(e.get("type") != "poisson_gaussian" for e in events):
        return False
    try:
        rates = {float(e["sampling_rate"]) for e in events}
        total = sum(int(e["steps"]) for e in events)
        smallest = min(float(e["noise_multiplier"]) for e in events)
    except (KeyError, TypeError, ValueError):
        return False
    return (
        rates == {float(sampling_rate)}
        and total == int(steps)
        and (smallest == float(noise_multiplier))
    )


def check_plan_parameters(
    events: Sequence[Mapping[str, Any]],
    *,
    private: bool,
    noise_multiplier: float,
    sampling_rate: float,
    steps: int,
    run_name: str,
) -> None:
    """Refuse a plan whose loop parameters (what the trainer uses) are not among its events.

    The loop runs with the plan's σ, q and T; the ledger knows only the events. An edited σ in
    `config.json` that left the events alone would otherwise run at another noise than the one
    accounted for.
    """
    if private and not (math.isfinite(noise_multiplier) and noise_multiplier > 0):
        raise AnchorError(f"{run_name}: the plan in config.json has no valid noise multiplier")
    # Loop steps that read no data (DPAF's generator steps after its one release) are declared
    # by the event they follow; only the remaining steps are the loop's Poisson reads.
    steps = int(steps) - idle_loop_steps(events)
    if steps == 0:
        # No loop step reads a Poisson batch (a marginal method's rounds read the whole table
        # through its events): there are no loop parameters to check against the events.
        return
    expected = loop_events(private, noise_multiplier, sampling_rate, steps)
    exact = any(_same_events([expected], [event]) for event in events)
    merged = any(_same_events([expected], [e]) for e in _merged_loop_events(events))
    if (
        not exact
        and not merged
        and not _is_schedule(events, private, noise_multiplier, sampling_rate, steps)
    ):
        raise AnchorError(
            f"{run_name}: the plan in config.json (σ={noise_multiplier:g}, q={sampling_rate:g}, "
            f"T={steps}) does not match its mechanism events; config.json was edited"
        )


def verified_spend(
    ledger: Ledger,
    anchor: SpendAnchor,
    *,
    run_id: str,
    dataset_id: str,
    fingerprint: str,
    events: Sequence[Mapping[str, Any]] | None,
    run_name: str,
    run_config: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The run's spend (merged with its status, as `Ledger.spend` gives it), after checking it.

    The ledger line at `anchor.seq` must exist, have exactly `anchor.hash`, be a spend, and
    name this run id, dataset id and fingerprint; when `events` is given (the run's plan) the
    spend's reserved events must equal it. Raises AnchorError with one line otherwise.
    When `run_config` is given and the spend recorded a `config_sha256`, the run's method,
    hyper-parameters, data description and plan must still hash to it
    (RunConfigEditedError, exit 4, otherwise).
    """
    entries = ledger.entries()
    where = f"{run_name}: its spend (ledger seq {anchor.seq}) "
    if anchor.seq >= len(entries):
        raise AnchorError(
            where + f"is not in the ledger {ledger.path} ({len(entries)} entries): another "
            "ledger, or lines were cut off; pass the run's --ledger"
        )
    line = entries[anchor.seq]
    if line.get("hash") != anchor.hash:
        raise AnchorError(
            where + f"has another hash in the ledger {ledger.path}: another ledger, or it was "
            "rewritten; pass the run's --ledger"
        )
    if line.get("kind") != "spend":
        raise AnchorError(where + f"is a {line.get('kind')} line in {ledger.path}, not a spend")
    for name, expected in (
        ("run_id", run_id),
        ("dataset_id", dataset_id),
        ("fingerprint", fingerprint),
    ):
        if line.get(name) != expected:
            raise AnchorError(
                where + f"belongs to {name} {line.get(name)!r}, not this run's {expected!r}; "
                "config.json was edited"
            )
    if events is not None and not _same_events(line.get("events", []), events):
        raise AnchorError(
            where + "records other mechanism events than the plan in config.json; "
            "config.json was edited"
        )
    recorded = line.get("config_sha256")
    if (
        run_config is not None
        and recorded is not None
        and run_config_digest(run_config) != recorded
    ):
        raise RunConfigEditedError(
            f"{run_name}: config.json was edited after its spend was reserved (method, "
            "hyper-parameters, data or plan differ from the digest in the ledger)"
        )
    return ledger.spend(anchor.seq)


NOT_DP_LABEL = "not a DP guarantee"
"""The label of a `non_private` event whose run added noise under a claimed ε that is not a
proven bound (a paper's own accounting, reproduced behind an explicit flag). Such a run counts
as not private everywhere: its dataset's total ε is inf and its ε never enters a statement."""


def not_dp_label(events: Sequence[Mapping[str, Any]]) -> str | None:
    """The label (with its mechanism) of the first labelled `non_private` event, or None."""
    for event in events:
        if event.get("type") == "non_private" and event.get("label"):
            mechanism = event.get("mechanism")
            return f"{event['label']}: {mechanism}" if mechanism else str(event["label"])
    return None


def privacy_statement(spend: Mapping[str, Any]) -> dict[str, Any]:
    """What an output of the run may say about its privacy, taken from its ledger spend.

    For a completed spend, the ε of the events actually spent; for a reserved one (an
    interrupted run), the reserved ε, which bounds every prefix; for an aborted one, the
    reserved ε too (the larger, always a valid bound for weights saved before the abort).
    """
    status = spend.get("status")
    epsilon = spend.get("reserved_epsilon") if status == "aborted" else spend.get("epsilon")
    value = float(epsilon) if epsilon is not None else math.inf
    private = bool(spend.get("private", True)) and math.isfinite(value)
    delta = float(spend["delta"])
    if private:
        text = f"(ε ≤ {value:.4g}, δ = {delta:g})-DP, {spend.get('accountant')}"
    else:
        label = not_dp_label(spend.get("events") or ())
        text = f"NOT PRIVATE ({label})" if label else "NOT PRIVATE (trained with --epsilon inf)"
    return {
        "private": private,
        "epsilon": value if private else "inf",
        "delta": delta,
        "accountant": spend.get("accountant"),
        "ledger_seq": int(spend["seq"]),
        "ledger_hash": spend.get("hash"),
        "status": status,
        "statement": text,
    }
