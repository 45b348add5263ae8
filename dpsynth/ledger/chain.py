"""The privacy ledger's hash chain: what makes a line valid, and the canonical JSON it hashes.

Each line is one JSON object in canonical form (sorted keys, no spaces, ASCII) with `seq`
(0, 1, 2, ...), `time` (UTC), `kind`, `prev_hash` (the previous line's `hash`, 64 zeros for the
first line) and `hash` (SHA-256 of the line's canonical JSON without `hash`). `Chain` checks
each line against the ones before it (JSON object, hash, seq, prev_hash, kind, the fields'
types); how lines are read from and appended to the file is `dpsynth.ledger.file`, and what
they mean (spends, budgets, totals) `dpsynth.ledger.state`.
"""

from __future__ import annotations

import hashlib
import json
import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dpsynth.errors import LedgerIntegrityError, UsageError

GENESIS_HASH = "0" * 64
KINDS = ("spend", "status", "release", "budget")
REQUIRED_FIELDS: dict[str, tuple[str, ...]] = {
    "spend": ("dataset_id", "fingerprint", "run_id", "events", "delta", "epsilon", "total_epsilon"),
    "status": ("ref", "status", "dataset_id", "events", "delta", "epsilon", "total_epsilon"),
    "release": ("dataset_id", "fingerprint", "run_id", "output_sha256", "events"),
    "budget": ("dataset_id", "epsilon", "delta"),
}


def json_safe(obj: Any) -> Any:
    """A copy of `obj` that JSON can hold: non-finite floats become "inf"/"-inf"/"nan" strings,
    tuples become lists and numpy scalars plain numbers."""
    if isinstance(obj, Mapping):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    if isinstance(obj, (bool, str)) or obj is None:
        return obj
    if isinstance(obj, numbers.Integral):
        return int(obj)
    if isinstance(obj, numbers.Real):
        value = float(obj)
        return value if math.isfinite(value) else str(value)
    if hasattr(obj, "item"):  # zero-dimensional arrays and tensors
        return json_safe(obj.item())
    raise UsageError(f"cannot record a value of type {type(obj).__name__} in the ledger")


def as_float(value: float | str) -> float:
    """Read an ε as the ledger stores it (a number, or "inf")."""
    return float(value)


def canonical_json(obj: Any) -> str:
    """The canonical text that hashes are taken over (sorted keys, no spaces, ASCII)."""
    return json.dumps(
        obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
    )


def entry_hash(entry: Mapping[str, Any]) -> str:
    """SHA-256 hex of the entry's canonical JSON without its `hash` key."""
    body = {k: v for k, v in entry.items() if k != "hash"}
    return hashlib.sha256(canonical_json(body).encode("ascii")).hexdigest()


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not allowed in the ledger")


def is_json(raw: bytes) -> bool:
    """True when `raw` parses as one JSON value (a complete line, whatever it says), parsed
    as `Chain.add_line` parses it; the file tells a torn last write from an entry by this."""
    try:
        json.loads(raw.decode("ascii"), parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError):
        return False
    except RecursionError:
        return True  # complete, but nested too deeply: `add_line` says so
    return True


_TEXT_FIELDS = frozenset(
    ("dataset_id", "fingerprint", "run_id", "output_sha256", "status", "command", "method", "kind")
)
_NUMBER_FIELDS = frozenset(("delta", "epsilon", "total_epsilon"))


def _field_problem(name: str, value: Any) -> str | None:
    """Why a known field's value has the wrong JSON type (None when it is fine): a line
    re-hashed by hand may hold anything, and the ledger's state keys and sums these fields."""
    if name in _TEXT_FIELDS and not isinstance(value, str):
        return f"must be a string, not {type(value).__name__}"
    if name in _NUMBER_FIELDS:
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            return f"must be a number, not {type(value).__name__}"
        try:
            float(value)
        except ValueError:
            return f"must be a number, not {value[:40]!r}"
    well_formed = isinstance(value, list) and all(isinstance(e, dict) for e in value)
    if name == "events" and value is not None and not well_formed:
        return "must be a list of objects"
    if name == "public" and not isinstance(value, dict):
        return "must be an object"
    return None


@dataclass
class Chain:
    """The lines read so far, each checked against the chain before it is kept.

    `record` is the hook where a subclass learns what a line means (it may reject it); the
    chain itself checks only the format: JSON object, hash, seq, prev_hash, kind and fields.
    """

    path: Path
    entries: list[dict[str, Any]] = field(default_factory=list)

    @property
    def head_hash(self) -> str:
        """The last line's hash (the genesis hash when there is none)."""
        return self.entries[-1]["hash"] if self.entries else GENESIS_HASH

    def fail(self, line: int, reason: str) -> LedgerIntegrityError:
        """The one-line error for a bad line (1-based `line`)."""
        return LedgerIntegrityError(f"ledger {self.path}: line {line}: {reason}")

    def add_line(self, raw: bytes, line: int) -> dict[str, Any]:
        """Parse, check against the chain so far, and record one line (1-based `line`)."""
        try:
            entry = json.loads(raw.decode("ascii"), parse_constant=_reject_constant)
        except (UnicodeDecodeError, ValueError):
            raise self.fail(line, "not valid JSON (edited or corrupted)") from None
        except RecursionError:
            raise self.fail(line, "JSON nested too deeply (edited or corrupted)") from None
        if not isinstance(entry, dict):
            raise self.fail(line, "not a JSON object (edited or corrupted)")
        if entry.get("hash") != entry_hash(entry):
            raise self.fail(line, "hash mismatch (the line was edited)")
        expected_seq = len(self.entries)
        seq = entry.get("seq")
        if seq != expected_seq:
            raise self.fail(
                line,
                f"seq {seq} where {expected_seq} was expected (a line was removed or reordered)",
            )
        if entry.get("prev_hash") != self.head_hash:
            raise self.fail(
                line, "prev_hash does not match the previous line (a line was removed or reordered)"
            )
        kind = entry.get("kind")
        if kind not in KINDS:
            raise self.fail(line, f"unknown kind {kind!r}")
        missing = [name for name in REQUIRED_FIELDS[kind] if name not in entry]
        if missing:
            raise self.fail(line, f"{kind} line lacks {', '.join(missing)}")
        for name, value in entry.items():
            problem = _field_problem(name, value)
            if problem:
                raise self.fail(line, f"{name} {problem} (edited or corrupted)")
        self.record(entry, line)
        self.entries.append(entry)
        return entry

    def record(self, entry: dict[str, Any], line: int) -> None:
        """What a valid line means; the plain chain keeps nothing beyond the entries."""

    def check_anchors(
        self,
        anchors: Mapping[int, str] | None = None,
        runs: Mapping[str, tuple[int, str]] | None = None,
        heads: Sequence[str] = (),
    ) -> None:
        """LedgerIntegrityError unless every anchor (seq → hash), every run's spend (name →
        (seq, hash)) and every published head hash is a line of the chain; this catches
        lines cut off the end and a file rewritten and re-hashed."""
        for seq, expected in (anchors or {}).items():
            seq = int(seq)
            if seq >= len(self.entries) or self.entries[seq]["hash"] != expected:
                raise LedgerIntegrityError(
                    f"ledger {self.path}: entry seq {seq} known from a run is missing or differs "
                    "(lines were cut off or the file was rewritten)"
                )
        for name, (seq, expected) in (runs or {}).items():
            if seq >= len(self.entries):
                raise LedgerIntegrityError(
                    f"ledger {self.path}: run {name}: its spend (seq {seq}) is missing from the "
                    f"chain of {len(self.entries)} entries (lines were cut off or the file was "
                    "rewritten, or this is another ledger)"
                )
            if self.entries[seq]["hash"] != expected:
                raise LedgerIntegrityError(
                    f"ledger {self.path}: run {name}: its spend (seq {seq}) differs in the chain "
                    "(the file was rewritten, or this is another ledger)"
                )
        known = {entry["hash"] for entry in self.entries}
        for head in heads:
            if head != GENESIS_HASH and head not in known:
                raise LedgerIntegrityError(
                    f"ledger {self.path}: the published head {head} is not in the chain "
                    "(lines were cut off or the file was rewritten since it was published)"
                )
