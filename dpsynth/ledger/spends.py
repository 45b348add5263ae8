"""The privacy ledger: an append-only, hash-chained JSON Lines record of every privacy spend.

This module is the spend API (reserve, complete, abort, releases, budgets, composed totals);
the file format (the hash chain, reading, locking, appending) is `dpsynth.ledger.file`, what
the lines mean (the counting and grouping rules) `dpsynth.ledger.state`, the fingerprint key
`dpsynth.ledger.key`, and `ledger show` / `ledger verify` `dpsynth.ledger.summary` /
`dpsynth.ledger.verify`.

One file is shared by all commands. Each line is one JSON object with `seq` (0, 1, 2, ...),
`time` (UTC), `kind`, `prev_hash` (the previous line's `hash`, 64 zeros for the first line) and
`hash` (SHA-256 of the line's canonical JSON without `hash`). Kinds:

- `spend`: a reservation written (and fsynced) before a command reads private data; it carries
  the mechanism events, δ, this spend's ε, the dataset's composed total after it, and
  `status: "reserved"`.
- `status`: closes a spend (`ref` = its seq) as `completed` or `aborted`, with the events
  actually spent.
- `release`: a zero-cost post-processing output (sampling, evaluation on synthetic data) with
  the SHA-256 of what was written.
- `budget`: a per-dataset cap (ε at a δ) that later reservations are checked against.

Counting rule: a spend counts with its reserved events until a status line closes it; then it
counts with the status line's events (for an abort without events, the reserved ones in full).
A crash therefore leaves the whole reservation counted. Totals are always recomputed by
composing the counting events (heterogeneous PRV composition), never by adding ε values.

Grouping rule (budgets follow the data, not the name): spends that share a dataset id **or** a
fingerprint are linked, and linking is transitive, so the spends form groups (connected
components). A spend composes with every counting event of its group; the total reported for a
dataset id, a budget cap set on a dataset id and the prior events of a new plan all cover the
whole group. The same records under a new `--dataset-id` (same fingerprint), or a converted
file recorded under the same id (new fingerprint), therefore never get a fresh budget.

Fingerprints are keyed (`dpsynth.ledger.key`): `data_fingerprint` makes them under
the ledger's secret key, so the ledger links spends on the same records without holding a
digest anyone could test a record against. Ledgers from before the key hold plain digests;
a new spend on the same records links to those spends by listing their seqs in `links`
(computed in memory from the content digest, which is never written).

Infinite ε (a non-private run) is stored as the string "inf", since JSON has no infinity.
"""

from __future__ import annotations

import copy
import math
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from dpsynth.errors import BudgetExceededError, UsageError
from dpsynth.ledger.file import (
    DEFAULT_LEDGER_NAME,
    GENESIS_HASH,
    LedgerFile,
    as_float,
    json_safe,
)
from dpsynth.ledger.key import FingerprintKey, create_key, key_path_for, read_key
from dpsynth.ledger.state import LedgerState, compose_at
from dpsynth.ledger.summary import summarize
from dpsynth.ledger.verify import verify_ledger

LEDGER_ENV_VAR = "DPSYNTH_LEDGER"
_TOTAL_RTOL = 1e-6
_OTHER_ACCOUNTANT_RTOL = 0.05


def default_ledger_path() -> Path:
    """`$DPSYNTH_LEDGER` if set, else `./dpsynth-ledger.jsonl`."""
    return Path(os.environ.get(LEDGER_ENV_VAR) or DEFAULT_LEDGER_NAME)


def _epsilon_field(value: float) -> float | str:
    return value if math.isfinite(value) else "inf"


def _check_delta(delta: float) -> float:
    delta = float(delta)
    if not (0.0 < delta < 1.0):
        raise UsageError(f"delta must be in (0, 1), got {delta}")
    return delta


def _check_events(events: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    if isinstance(events, (str, bytes, Mapping)):
        raise UsageError("events must be a list of mechanism event dicts")
    out = []
    for event in events:
        if not isinstance(event, Mapping) or not isinstance(event.get("type"), str):
            raise UsageError(f"a mechanism event needs a string 'type', got {event!r}")
        out.append(json_safe(event))
    return out


class Ledger:
    """The append-only privacy ledger at `path` (a missing file is an empty ledger)."""

    def __init__(self, path: Path | str) -> None:
        self._file = LedgerFile(path)
        self.path = self._file.path
        self.lock_path = self._file.lock_path
        self.key_path = key_path_for(self.path)
        self._state = LedgerState(self.path)
        self._key: FingerprintKey | None = None

    def check_path(self) -> None:
        """UsageError (exit 2) when the ledger path names a folder rather than a file."""
        self._file.check_path()

    def data_fingerprint(self, content_digest: str, *, create: bool = True) -> str | None:
        """The publishable fingerprint of data with this content digest: an HMAC under the
        ledger's key (`LEDGER.key`, created here on first use unless `create` is False, then
        None without a key). A UsageError when the ledger's fingerprints were made with a key
        that is missing or not the one on disk: spends could no longer be linked by data."""
        key = self._fingerprint_key(create)
        if key is None:
            return None
        fingerprint = key.fingerprint(content_digest)
        self._state.legacy_digests[fingerprint] = content_digest
        return fingerprint

    def _fingerprint_key(self, create: bool) -> FingerprintKey | None:
        if self._key is not None:
            return self._key
        # a ledger path under a file (notes.txt/l.jsonl) is the user's mistake: exit 2, not 4
        self._file.check_path()
        if self.path.parent.exists() and not self.path.parent.is_dir():
            raise UsageError(
                f"ledger {self.path}: cannot write to it ({self.path.parent} is a file, not a "
                "folder); give a writable --ledger"
            )
        key = read_key(self.key_path)
        used = self._read_state().key_ids()
        if key is None and used:
            raise UsageError(
                f"the ledger {self.path} links its spends by fingerprints made with the key "
                f"{self.key_path}, which is missing: restore that file from your backup (it "
                "belongs with the ledger and must never be published); without it new spends "
                "cannot be linked to this ledger's earlier spends on the same data"
            )
        if key is None:
            if not create:
                return None
            key = create_key(self.key_path)
        if used - {key.key_id}:
            raise UsageError(
                f"{self.key_path} is not the key this ledger's fingerprints were made with "
                f"(key id {key.key_id}, the ledger uses {', '.join(sorted(used))}): restore the "
                "ledger's own key file"
            )
        self._key = key
        return key

    # ----------------------------------------------------------------- writing

    def reserve(
        self,
        *,
        dataset_id: str,
        fingerprint: str,
        command: str,
        method: str,
        run_id: str,
        events: Sequence[Mapping[str, Any]],
        delta: float,
        private: bool = True,
        max_total_epsilon: float | None = None,
        config_sha256: str | None = None,
    ) -> dict[str, Any]:
        """Record a spend before any private data is read; return the written line.

        `config_sha256` (optional) binds the spend to the run's configuration (see
        `dpsynth.ledger.anchors.run_config_digest`), so that a later edit is detected.

        Raises BudgetExceededError (and writes nothing) if a budget set on any dataset id linked
        to this spend (by id or fingerprint, see the grouping rule) would be exceeded by the
        group's composed total at the budget's δ, this spend included; or if the total at
        `delta` would exceed `max_total_epsilon` (the run's target, planned from `events_for`
        earlier: this catches spends that other processes recorded since).
        """
        events_list = _check_events(events)
        delta = _check_delta(delta)
        epsilon, accountant = compose_at(events_list, delta)
        is_private = bool(private) and math.isfinite(epsilon)
        # Warm the accountant's cache outside the lock; under the lock it is then a lookup
        # unless another process appended a spend for this dataset in between.
        self._totals_for_reserve(self._read_state(), dataset_id, fingerprint, events_list, delta)

        def build(state: LedgerState) -> dict[str, Any]:
            total, capped = self._totals_for_reserve(
                state, dataset_id, fingerprint, events_list, delta
            )
            for budget, budget_total in capped:
                if budget_total > as_float(budget["epsilon"]):
                    linked = budget["dataset_id"]
                    via = "" if linked == dataset_id else f" (linked to {linked!r}: same data)"
                    raise BudgetExceededError(
                        f"dataset {dataset_id!r}{via}: this run would bring the total to "
                        f"ε ≤ {budget_total:.4g} at δ={float(budget['delta']):g}, over the "
                        f"budget cap ε={as_float(budget['epsilon']):g} set on {linked!r} "
                        "(nothing was run or recorded)"
                    )
            if max_total_epsilon is not None and total > max_total_epsilon:
                raise BudgetExceededError(
                    f"dataset {dataset_id!r}: spends recorded since this run was planned bring "
                    f"the total to ε ≤ {total:.4g} at δ={delta:g}, over the target "
                    f"ε={max_total_epsilon:g}; plan again (nothing was run or recorded)"
                )
            line = {
                "kind": "spend",
                "dataset_id": dataset_id,
                "fingerprint": fingerprint,
                "command": command,
                "method": method,
                "run_id": run_id,
                "events": events_list,
                "delta": delta,
                "epsilon": _epsilon_field(epsilon),
                "total_epsilon": _epsilon_field(total),
                "accountant": accountant,
                "status": "reserved",
                "private": is_private,
            }
            if config_sha256 is not None:
                line["config_sha256"] = config_sha256
            links = state.legacy_links(fingerprint)
            if links:
                line["links"] = links
            return line

        return self._append(build)

    def complete(
        self, seq: int, events: Sequence[Mapping[str, Any]], *, run_id: str, fingerprint: str
    ) -> dict[str, Any]:
        """Close spend `seq` as completed with the events actually spent; return the line.

        `run_id` and `fingerprint` must be the spend's (a run can only close its own spend),
        and the spend must still be reserved; otherwise a UsageError and nothing is written.
        """
        return self._close(seq, "completed", _check_events(events), run_id, fingerprint)

    def abort(
        self,
        seq: int,
        events: Sequence[Mapping[str, Any]] | None = None,
        *,
        run_id: str,
        fingerprint: str,
    ) -> dict[str, Any]:
        """Close spend `seq` as aborted, counting `events` (the part actually spent) or, when
        None, the reserved events in full; return the line. Checked as in `complete`."""
        spent = None if events is None else _check_events(events)
        return self._close(seq, "aborted", spent, run_id, fingerprint)

    def record_release(
        self,
        *,
        dataset_id: str,
        fingerprint: str,
        command: str,
        method: str,
        run_id: str,
        output_sha256: str,
        details: Mapping[str, Any],
    ) -> dict[str, Any]:
        """Record a zero-cost post-processing output (its SHA-256 and details); return the line."""
        safe_details = json_safe(dict(details))

        def build(state: LedgerState) -> dict[str, Any]:
            return {
                "kind": "release",
                "dataset_id": dataset_id,
                "fingerprint": fingerprint,
                "command": command,
                "method": method,
                "run_id": run_id,
                "output_sha256": output_sha256,
                "details": safe_details,
                "events": [],
                "epsilon": 0.0,
            }

        return self._append(build)

    def set_budget(self, dataset_id: str, epsilon: float, delta: float) -> dict[str, Any]:
        """Set the dataset's cap (ε at δ; ε = inf lifts it); return the line, which also holds
        the total spent so far at that δ and what is left (negative if already over)."""
        epsilon = float(epsilon)
        if math.isnan(epsilon) or epsilon <= 0:
            raise UsageError(f"a budget ε must be positive, got {epsilon}")
        delta = _check_delta(delta)
        self._warm(dataset_id, delta)

        def build(state: LedgerState) -> dict[str, Any]:
            total, accountant = compose_at(state.counting_events(dataset_id), delta)
            return {
                "kind": "budget",
                "dataset_id": dataset_id,
                "epsilon": _epsilon_field(epsilon),
                "delta": delta,
                "total_epsilon": _epsilon_field(total),
                "remaining": _epsilon_field(epsilon - total) if math.isfinite(total) else "-inf",
                "accountant": accountant,
            }

        return self._append(build)

    # ----------------------------------------------------------------- reading

    def entries(self) -> list[dict[str, Any]]:
        """All lines, in order, as stored (ε values may be the string "inf")."""
        return copy.deepcopy(self._read_state().entries)

    def head(self) -> dict[str, Any]:
        """The last line's seq, hash and time (seq None and the genesis hash when empty): the
        value to keep or publish so that a later rewrite of the ledger can be detected."""
        state = self._read_state()
        if not state.entries:
            return {"seq": None, "hash": GENESIS_HASH, "time": None, "entries": 0}
        last = state.entries[-1]
        return {
            "seq": last["seq"],
            "hash": last["hash"],
            "time": last["time"],
            "entries": len(state.entries),
        }

    def budget_for(self, dataset_id: str) -> dict[str, Any] | None:
        """The dataset's latest budget line; without one, the latest budget set on an id linked
        to it (the grouping rule); None if its group has none."""
        state = self._read_state()
        budget = state.budgets.get(dataset_id)
        if budget is None:
            linked = state.group_budgets(dataset_id)
            budget = max(linked, key=lambda line: line["seq"]) if linked else None
        return copy.deepcopy(budget)

    def events_for(
        self, dataset_id: str, fingerprint: str | None = None
    ) -> tuple[dict[str, Any], ...]:
        """The counting events of every spend linked to this dataset id or fingerprint (the
        `prior_events` of its next plan; see the grouping rule)."""
        state = self._read_state()
        return tuple(copy.deepcopy(state.counting_events(dataset_id, fingerprint=fingerprint)))

    def total_epsilon(self, dataset_id: str, delta: float) -> float:
        """The composed ε upper bound at `delta` of all counting events linked to the dataset."""
        return compose_at(self.events_for(dataset_id), _check_delta(delta))[0]

    def spend(self, seq: int) -> dict[str, Any]:
        """Spend `seq` with its current status merged in: `status`, the spent `events` and their
        `epsilon`, plus `reserved_events`, `reserved_epsilon` and `status_seq`."""
        state = self._read_state()
        if seq not in state.spends:
            raise UsageError(f"the ledger {self.path} has no spend with seq {seq}")
        return state.merged_spend(seq)

    def spends_for_fingerprint(self, fingerprint: str) -> list[dict[str, Any]]:
        """All spends (merged as in `spend`) on data with this fingerprint, in order."""
        state = self._read_state()
        same = {fingerprint, state.legacy_digests.get(fingerprint)}
        return [
            state.merged_spend(seq)
            for seq, spend in state.spends.items()
            if spend["fingerprint"] in same
        ]

    def summary(self, delta: float | None = None) -> dict[str, Any]:
        """Per-dataset totals for `ledger show` (see `dpsynth.ledger.summary.summarize`)."""
        return summarize(self._read_state(), self.path, delta)

    def verify(
        self,
        anchors: Mapping[int, str] | None = None,
        *,
        recompute: bool = True,
        runs: Mapping[str, tuple[int, str]] | None = None,
        heads: Sequence[str] = (),
    ) -> dict[str, Any]:
        """Re-read and check the whole file (see `dpsynth.ledger.verify.verify_ledger`)."""
        return verify_ledger(self._file, anchors, recompute=recompute, runs=runs, heads=heads)

    # ----------------------------------------------------------------- internals

    @staticmethod
    def _totals_for_reserve(
        state: LedgerState,
        dataset_id: str,
        fingerprint: str,
        events: list[dict[str, Any]],
        delta: float,
    ) -> tuple[float, list[tuple[dict[str, Any], float]]]:
        """(total at the spend's δ, [(budget, total at its δ)] for each finite budget of the
        group) after adding `events` to the spend's group."""
        combined = [*state.counting_events(dataset_id, fingerprint=fingerprint), *events]
        total = compose_at(combined, delta)[0]
        capped = []
        for budget in state.group_budgets(dataset_id, fingerprint):
            if not math.isfinite(as_float(budget["epsilon"])):
                continue
            budget_delta = float(budget["delta"])
            at_budget = total if budget_delta == delta else compose_at(combined, budget_delta)[0]
            capped.append((budget, at_budget))
        return total, capped

    def _warm(self, dataset_id: str, delta: float) -> None:
        compose_at(self._read_state().counting_events(dataset_id), delta)

    def _close(
        self,
        seq: int,
        status: str,
        events: list[dict[str, Any]] | None,
        run_id: str,
        fingerprint: str,
    ) -> dict[str, Any]:
        def build(state: LedgerState) -> dict[str, Any]:
            spend = state.spends.get(seq)
            if spend is None:
                raise UsageError(f"the ledger {self.path} has no spend with seq {seq}")
            if seq in state.closing:
                raise UsageError(
                    f"spend seq {seq} in {self.path} is already {state.closing[seq]['status']}, "
                    "not reserved; nothing was written"
                )
            if spend["run_id"] != run_id or spend["fingerprint"] != fingerprint:
                raise UsageError(
                    f"spend seq {seq} in {self.path} belongs to run {spend['run_id']!r} on data "
                    f"{spend['fingerprint'][:12]}…, not to run {run_id!r} on data "
                    f"{fingerprint[:12]}…; nothing was written"
                )
            spent = copy.deepcopy(spend["events"]) if events is None else events
            delta = float(spend["delta"])
            epsilon, accountant = compose_at(spent, delta)
            dataset_id = spend["dataset_id"]
            total = compose_at(state.counting_events(dataset_id, {seq: spent}), delta)[0]
            return {
                "kind": "status",
                "ref": seq,
                "status": status,
                "dataset_id": dataset_id,
                "fingerprint": spend["fingerprint"],
                "run_id": spend["run_id"],
                "events": spent,
                "delta": delta,
                "epsilon": _epsilon_field(epsilon),
                "total_epsilon": _epsilon_field(total),
                "accountant": accountant,
                "private": bool(spend.get("private", True)) and math.isfinite(epsilon),
            }

        return self._append(build)

    def _read_state(self) -> LedgerState:
        """Bring the in-memory state up to date with the file (reads only new bytes)."""
        self._file.read_chain(self._state)
        return self._state

    def _append(self, build: Callable[[LedgerState], dict[str, Any]]) -> dict[str, Any]:
        """Under the exclusive lock: re-read, build the line, write it in one call, fsync."""
        return copy.deepcopy(self._file.append(self._state, build))
