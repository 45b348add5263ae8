"""The privacy ledger: an append-only, hash-chained JSON Lines record of every privacy spend.

This module is the spend API (reserve, complete, abort, releases, budgets, composed totals);
the read-only queries it inherits are `dpsynth.ledger.reader`, the hash chain (the line format,
canonical JSON, hashes) `dpsynth.ledger.chain`, the file (reading, locking, appending)
`dpsynth.ledger.file`, what the lines mean (the counting and grouping rules)
`dpsynth.ledger.state`, the fingerprint key `dpsynth.ledger.key`, and `ledger show` /
`ledger verify` `dpsynth.ledger.summary` / `dpsynth.ledger.verify`.

One file is shared by all commands. Each line is one JSON object in the hash chain (`seq`,
`time`, `kind`, `prev_hash`, `hash`; see `dpsynth.ledger.chain`). Kinds:

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
from dpsynth.ledger.chain import as_float, json_safe
from dpsynth.ledger.file import DEFAULT_LEDGER_NAME
from dpsynth.ledger.key import FingerprintKey, key_path_for, ledger_key
from dpsynth.ledger.reader import LedgerReader
from dpsynth.ledger.state import LedgerState, compose_at
from dpsynth.privacy.accounting.events import AnyEvent, DpEvent

LEDGER_ENV_VAR = "DPSYNTH_LEDGER"


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


def _check_events(events: Sequence[AnyEvent]) -> list[dict[str, Any]]:
    if isinstance(events, (str, bytes, Mapping, DpEvent)):
        raise UsageError("events must be a list of mechanism event dicts")
    out = []
    for event in events:
        if isinstance(event, DpEvent):
            event = event.to_json()
        if not isinstance(event, Mapping) or not isinstance(event.get("type"), str):
            raise UsageError(f"a mechanism event needs a string 'type', got {event!r}")
        out.append(json_safe(event))
    return out


class Ledger(LedgerReader):
    """The append-only privacy ledger at `path` (a missing file is an empty ledger); the
    queries (`entries`, `head`, `budget_for`, `events_for`, `spend`, `summary`, `verify`, ...)
    are `LedgerReader`'s."""

    def __init__(self, path: Path | str) -> None:
        super().__init__(path)
        self.key_path = key_path_for(self.path)
        self._key: FingerprintKey | None = None

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
        if self._key is None:
            # a ledger path that is a folder is the user's mistake: exit 2, not 4
            self._file.check_path()
            self._key = ledger_key(self.path, lambda: self._read_state().key_ids(), create=create)
        return self._key

    # ----------------------------------------------------------------- writing

    def reserve(
        self,
        *,
        dataset_id: str,
        fingerprint: str,
        command: str,
        method: str,
        run_id: str,
        events: Sequence[AnyEvent],
        delta: float,
        private: bool = True,
        max_total_epsilon: float | None = None,
        config_sha256: str | None = None,
        public: Mapping[str, Any] | None = None,
        privacy_unit: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Record a spend before any private data is read; return the written line.

        `privacy_unit` (optional; column and max_rows_per_unit) says that the events bound
        what one unit of at most that many rows changes, not one row: the line's `privacy_unit`.

        `config_sha256` (optional) binds the spend to the run's configuration (see
        `dpsynth.ledger.anchors.run_config_digest`), so that a later edit is detected.
        `public` (optional) describes the declared-public inputs the run pretrains on (spec,
        n, content digest, what uses them): recorded as the line's `public`, at no cost.

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
            if public is not None:
                line["public"] = json_safe(dict(public))
            if privacy_unit is not None:
                line["privacy_unit"] = json_safe(dict(privacy_unit))
            links = state.legacy_links(fingerprint)
            if links:
                line["links"] = links
            return line

        return self._append(build)

    def complete(
        self, seq: int, events: Sequence[AnyEvent], *, run_id: str, fingerprint: str
    ) -> dict[str, Any]:
        """Close spend `seq` as completed with the events actually spent; return the line.

        `run_id` and `fingerprint` must be the spend's (a run can only close its own spend),
        and the spend must still be reserved; otherwise a UsageError and nothing is written.
        """
        return self._close(seq, "completed", _check_events(events), run_id, fingerprint)

    def abort(
        self,
        seq: int,
        events: Sequence[AnyEvent] | None = None,
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

    # ----------------------------------------------------------------- composing

    def total_epsilon(self, dataset_id: str, delta: float) -> float:
        """The composed ε upper bound at `delta` of all counting events linked to the dataset."""
        return compose_at(self.events_for(dataset_id), _check_delta(delta))[0]

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

    def _append(self, build: Callable[[LedgerState], dict[str, Any]]) -> dict[str, Any]:
        """Under the exclusive lock: re-read, build the line, write it in one call, fsync."""
        return copy.deepcopy(self._file.append(self._state, build))
