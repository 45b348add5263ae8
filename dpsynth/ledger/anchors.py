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

from dpsynth.errors import AnchorError, RunConfigEditedError
from dpsynth.ledger.chain import canonical_json, json_safe
from dpsynth.ledger.spends import Ledger
from dpsynth.privacy.accounting.events import AnyEvent, events_to_json
from dpsynth.privacy.accounting.plan_check import not_dp_label

# The parts of a run's config.json that its spend binds: what is trained, on what, and how.
BOUND_CONFIG_KEYS = ("method", "config", "data", "privacy")
# Bound too when present (`public`: the declared-public inputs); runs written without them keep
# the digest they were reserved with.
OPTIONAL_BOUND_KEYS = ("public",)


def run_config_digest(run_config: Mapping[str, Any]) -> str:
    """SHA-256 of the canonical JSON of the run's method, hyper-parameters, data description
    and privacy plan (`BOUND_CONFIG_KEYS`), and its public inputs when it has any, as recorded
    in the spend at reservation."""
    bound = {key: run_config.get(key) for key in BOUND_CONFIG_KEYS}
    bound |= {key: run_config[key] for key in OPTIONAL_BOUND_KEYS if key in run_config}
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


def _same_events(a: Sequence[Mapping[str, Any]], b: Sequence[AnyEvent]) -> bool:
    return canonical_json(json_safe(list(a))) == canonical_json(json_safe(events_to_json(b)))


def verified_spend(
    ledger: Ledger,
    anchor: SpendAnchor,
    *,
    run_id: str,
    dataset_id: str,
    fingerprint: str,
    events: Sequence[AnyEvent] | None,
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
    unit = spend.get("privacy_unit")
    if private:
        # with a unit, the neighbouring data sets differ by one unit's records, not one record
        text = f"(ε ≤ {value:.4g}, δ = {delta:g})-DP{unit_phrase(unit)}, {spend.get('accountant')}"
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
        **({"privacy_unit": dict(unit)} if unit else {}),
    }


def unit_phrase(unit: Mapping[str, Any] | None) -> str:
    """' per COLUMN (at most K rows each)' for a spend with a privacy unit ('' without one);
    images say 'image(s)'."""
    if not unit:
        return ""
    k = int(unit["max_rows_per_unit"])
    word = "image" if unit.get("records") == "images" else "row"
    return f" per {unit['column']} (at most {k} {word}{'s' if k != 1 else ''} each)"
