"""The privacy ledger: an append-only, hash-chained JSON Lines record of every privacy spend.

This module is the spend API (reserve, complete, abort, releases, budgets, composed totals and
the grouping of dataset ids); the file format (the hash chain, reading, locking, appending) is
`dpsynth.privacy.ledger_file`, whose names are re-exported here.

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

Fingerprints are keyed (`dpsynth.privacy.ledger_key`): `data_fingerprint` makes them under
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dpsynth import __version__
from dpsynth.errors import BudgetExceededError, UsageError
from dpsynth.privacy.accounting import compose_epsilon
from dpsynth.privacy.ledger_file import (
    DEFAULT_LEDGER_NAME,
    GENESIS_HASH,
    KINDS,
    Chain,
    LedgerFile,
    as_float,
    canonical_json,
    entry_hash,
    json_safe,
)
from dpsynth.privacy.ledger_key import FingerprintKey, create_key, key_id_of, key_path_for, read_key

__all__ = [
    "DEFAULT_LEDGER_NAME",
    "GENESIS_HASH",
    "KINDS",
    "LEDGER_ENV_VAR",
    "Ledger",
    "as_float",
    "canonical_json",
    "default_ledger_path",
    "entry_hash",
    "json_safe",
]

LEDGER_ENV_VAR = "DPSYNTH_LEDGER"
_TOTAL_RTOL = 1e-6
_OTHER_ACCOUNTANT_RTOL = 0.05


def default_ledger_path() -> Path:
    """`$DPSYNTH_LEDGER` if set, else `./dpsynth-ledger.jsonl`."""
    return Path(os.environ.get(LEDGER_ENV_VAR) or DEFAULT_LEDGER_NAME)


def _epsilon_field(value: float) -> float | str:
    return value if math.isfinite(value) else "inf"


def _compose(events: Sequence[Mapping[str, Any]], delta: float) -> tuple[float, str]:
    """(ε upper bound, accountant) of `events` at `delta` (the accountant caches by events)."""
    bound = compose_epsilon(events, delta)
    return float(bound.epsilon), bound.accountant


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


@dataclass
class _State(Chain):
    """What the lines read so far say: spends, their closing status lines and budgets."""

    spends: dict[int, dict[str, Any]] = field(default_factory=dict)
    closing: dict[int, dict[str, Any]] = field(default_factory=dict)
    budgets: dict[str, dict[str, Any]] = field(default_factory=dict)
    spends_by_dataset: dict[str, list[int]] = field(default_factory=dict)
    # Union-find over "id:<dataset id>" and "fp:<fingerprint>" keys: the grouping rule.
    links: dict[str, str] = field(default_factory=dict)
    # keyed fingerprint → the content digest it was made from, for the fingerprints this
    # process made (in memory only): it finds legacy spends that recorded the plain digest.
    legacy_digests: dict[str, str] = field(default_factory=dict)

    def _root(self, key: str) -> str:
        while self.links.get(key, key) != key:
            key = self.links[key]
        return key

    def _link(self, dataset_id: str, fingerprint: str) -> None:
        if not fingerprint:
            return  # an unknown fingerprint links nothing
        a, b = self._root(_id_key(dataset_id)), self._root(_fp_key(fingerprint))
        if a != b:
            self.links[b] = a

    def group_roots(self, dataset_id: str, fingerprint: str | None = None) -> set[str]:
        """The groups a spend on (dataset_id, fingerprint) belongs to (two until it is written)."""
        roots = {self._root(_id_key(dataset_id))}
        if fingerprint:
            roots.add(self._root(_fp_key(fingerprint)))
            if fingerprint in self.legacy_digests:
                roots.add(self._root(_fp_key(self.legacy_digests[fingerprint])))
        return roots

    def legacy_links(self, fingerprint: str) -> list[int]:
        """Seqs of the spends that recorded the plain digest behind this keyed fingerprint."""
        digest = self.legacy_digests.get(fingerprint)
        return [
            seq for seq, spend in self.spends.items() if digest and spend["fingerprint"] == digest
        ]

    def key_ids(self) -> set[str]:
        """The ids of the keys the ledger's fingerprints were made with."""
        found = (key_id_of(str(entry.get("fingerprint", ""))) for entry in self.entries)
        return {key_id for key_id in found if key_id is not None}

    def group_spends(self, dataset_id: str, fingerprint: str | None = None) -> list[int]:
        """Seqs of the spends linked to this dataset id (or fingerprint), in order."""
        roots = self.group_roots(dataset_id, fingerprint)
        return [
            seq
            for seq, spend in self.spends.items()
            if self._root(_id_key(spend["dataset_id"])) in roots
        ]

    def group_budgets(
        self, dataset_id: str, fingerprint: str | None = None
    ) -> list[dict[str, Any]]:
        """The latest budget line of every dataset id linked to this one (or its fingerprint)."""
        roots = self.group_roots(dataset_id, fingerprint)
        return [b for i, b in self.budgets.items() if self._root(_id_key(i)) in roots]

    def group_members(self, dataset_id: str) -> tuple[list[str], list[str]]:
        """(dataset ids, fingerprints) of the spends linked to this dataset id."""
        ids: list[str] = []
        fingerprints: list[str] = []
        for seq in self.group_spends(dataset_id):
            spend = self.spends[seq]
            if spend["dataset_id"] not in ids:
                ids.append(spend["dataset_id"])
            if spend["fingerprint"] and spend["fingerprint"] not in fingerprints:
                fingerprints.append(spend["fingerprint"])
        return ids, fingerprints

    def record(self, entry: dict[str, Any], line: int) -> None:
        """Learn what a valid line of the chain means, rejecting one that makes no sense."""
        kind = entry["kind"]
        if kind == "spend":
            links = entry.get("links", [])
            if not isinstance(links, list) or any(
                not isinstance(ref, int) or ref not in self.spends for ref in links
            ):
                raise self.fail(line, f"spend links to unknown spends {links!r}")
            self.spends[entry["seq"]] = entry
            self.spends_by_dataset.setdefault(entry["dataset_id"], []).append(entry["seq"])
            self._link(entry["dataset_id"], entry["fingerprint"])
            for ref in links:  # the same records, recorded by a plain digest before the key
                self._link(entry["dataset_id"], self.spends[ref]["fingerprint"])
        elif kind == "status":
            ref = entry["ref"]
            spend = self.spends.get(ref) if isinstance(ref, int) else None
            if spend is None:
                raise self.fail(line, f"status line refers to unknown spend seq {ref!r}")
            if ref in self.closing:
                raise self.fail(line, f"spend seq {ref} was already closed")
            if entry["status"] not in ("completed", "aborted"):
                raise self.fail(line, f"unknown status {entry['status']!r}")
            if entry["dataset_id"] != spend["dataset_id"]:
                raise self.fail(line, f"status line names another dataset than spend seq {ref}")
            for name in ("run_id", "fingerprint"):
                if name in entry and entry[name] != spend[name]:
                    raise self.fail(line, f"status line names another {name} than spend seq {ref}")
            self.closing[ref] = entry
        elif kind == "budget":
            self.budgets[entry["dataset_id"]] = entry

    def spent_events(self, seq: int) -> list[dict[str, Any]]:
        """The events spend `seq` counts with under the counting rule."""
        closing = self.closing.get(seq)
        if closing is not None and closing.get("events") is not None:
            return closing["events"]
        return self.spends[seq]["events"]

    def counting_events(
        self,
        dataset_id: str,
        replace: Mapping[int, list[dict[str, Any]]] | None = None,
        fingerprint: str | None = None,
    ) -> list[dict[str, Any]]:
        """All counting events of the dataset's group (see the grouping rule), optionally with
        some spends' events replaced; with `fingerprint`, also of the group of that fingerprint
        (a spend on (dataset_id, fingerprint) about to be written joins both)."""
        replace = replace or {}
        events: list[dict[str, Any]] = []
        for seq in self.group_spends(dataset_id, fingerprint):
            events.extend(replace[seq] if seq in replace else self.spent_events(seq))
        return events

    def merged_spend(self, seq: int) -> dict[str, Any]:
        """The spend line with its current status and spent events merged in."""
        spend = copy.deepcopy(self.spends[seq])
        closing = self.closing.get(seq)
        spend["reserved_events"] = spend["events"]
        spend["reserved_epsilon"] = spend["epsilon"]
        spend["events"] = copy.deepcopy(self.spent_events(seq))
        spend["status_seq"] = None
        if closing is not None:
            spend["status"] = closing["status"]
            spend["epsilon"] = closing["epsilon"]
            spend["status_seq"] = closing["seq"]
            spend["closed_time"] = closing["time"]
        return spend


class Ledger:
    """The append-only privacy ledger at `path` (a missing file is an empty ledger)."""

    def __init__(self, path: Path | str) -> None:
        self._file = LedgerFile(path)
        self.path = self._file.path
        self.lock_path = self._file.lock_path
        self.key_path = key_path_for(self.path)
        self._state = _State(self.path)
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
        `dpsynth.privacy.anchors.run_config_digest`), so that a later edit is detected.

        Raises BudgetExceededError (and writes nothing) if a budget set on any dataset id linked
        to this spend (by id or fingerprint, see the grouping rule) would be exceeded by the
        group's composed total at the budget's δ, this spend included; or if the total at
        `delta` would exceed `max_total_epsilon` (the run's target, planned from `events_for`
        earlier: this catches spends that other processes recorded since).
        """
        events_list = _check_events(events)
        delta = _check_delta(delta)
        epsilon, accountant = _compose(events_list, delta)
        is_private = bool(private) and math.isfinite(epsilon)
        # Warm the accountant's cache outside the lock; under the lock it is then a lookup
        # unless another process appended a spend for this dataset in between.
        self._totals_for_reserve(self._read_state(), dataset_id, fingerprint, events_list, delta)

        def build(state: _State) -> dict[str, Any]:
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

        def build(state: _State) -> dict[str, Any]:
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

        def build(state: _State) -> dict[str, Any]:
            total, accountant = _compose(state.counting_events(dataset_id), delta)
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
        return _compose(self.events_for(dataset_id), _check_delta(delta))[0]

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
        """Per-dataset totals for `ledger show` (ε values are floats, possibly inf).

        The total is at `delta` if given, else at the budget's δ, else at the largest δ among
        the dataset's spends. It composes every spend linked to the dataset id by id or
        fingerprint (the grouping rule); `linked_ids` names the other ids of that group, and
        `private` is False when any spend of the group is not private. One composition per
        dataset.
        """
        state = self._read_state()
        datasets: dict[str, dict[str, Any]] = {}
        for entry in state.entries:
            row = datasets.setdefault(entry["dataset_id"], _empty_row(entry["dataset_id"]))
            row["entries"] += 1
            row["last_time"] = entry["time"]
            if entry.get("fingerprint") and entry["fingerprint"] not in row["fingerprints"]:
                row["fingerprints"].append(entry["fingerprint"])
            if entry["kind"] == "spend":
                row["spends"] += 1
                if entry["seq"] not in state.closing:
                    row["open_spends"] += 1
            elif entry["kind"] == "release":
                row["releases"] += 1
        for dataset_id, row in datasets.items():
            events = state.counting_events(dataset_id)
            group = [state.spends[seq] for seq in state.group_spends(dataset_id)]
            row["linked_ids"] = state.group_members(dataset_id)[0]
            row["linked_ids"] = [i for i in row["linked_ids"] if i != dataset_id]
            row["private"] = all(bool(spend.get("private", True)) for spend in group)
            budget = state.budgets.get(dataset_id)
            at = delta
            if at is None:
                deltas = [float(spend["delta"]) for spend in group]
                at = float(budget["delta"]) if budget else max(deltas, default=None)
            row["delta"] = at
            row["total_epsilon"], row["accountant"] = (
                _compose(events, at) if at is not None else (0.0, None)
            )
            if budget is not None:
                cap, cap_delta = as_float(budget["epsilon"]), float(budget["delta"])
                spent = _compose(events, cap_delta)[0]
                row["budget"] = {"epsilon": cap, "delta": cap_delta}
                row["budget_spent"] = spent
                row["remaining"] = cap - spent if math.isfinite(spent) else -math.inf
        return {"path": str(self.path), "entries": len(state.entries), "datasets": datasets}

    def verify(
        self,
        anchors: Mapping[int, str] | None = None,
        *,
        recompute: bool = True,
        runs: Mapping[str, tuple[int, str]] | None = None,
        heads: Sequence[str] = (),
    ) -> dict[str, Any]:
        """Re-read the whole file and check it; raise LedgerIntegrityError with a one-line
        reason at the first problem, else return counts and per-dataset totals.

        Checks: every line is complete JSON, its hash is right (no edit), seqs run 0, 1, 2, ...
        (no removal), each prev_hash is the previous line's hash (no reordering), status lines
        close a known open spend, and every recorded ε and total ε equals the recomputation
        (relative tolerance 1e-6; lines written by another dpsynth version or accountant only
        must not under-report by more than 5%, and their seqs are listed in
        `other_accountant_seqs`). That is one accountant call per spend line, skipped with
        `recompute=False`. `anchors` (seq → hash, e.g. from run directories) must all be
        present, which also catches lines cut off the end. `runs` (run name → (seq, hash) of
        its spend, as the run directory keeps it) does the same, naming the run in the
        failure; `heads` are head hashes published earlier (`ledger head`): each must still be
        the hash of a line of the chain.

        A chain alone cannot tell a consistent rewrite (lines dropped from the end, or the
        file rebuilt and re-hashed) from the original; anchors kept outside the ledger can.
        """
        state = _State(self.path)
        other_accountant = []
        for number, line in enumerate(self._file.read_lines(state), start=1):
            entry = state.add_line(line, number)
            if recompute and not self._check_recorded_epsilons(state, entry, number):
                other_accountant.append(entry["seq"])
        state.check_anchors(anchors, runs, heads)
        counts = {kind: 0 for kind in KINDS}
        for entry in state.entries:
            counts[entry["kind"]] += 1
        open_spends = [seq for seq in state.spends if seq not in state.closing]
        totals = {}
        for dataset_id in state.spends_by_dataset:
            budget = state.budgets.get(dataset_id)
            seqs = state.group_spends(dataset_id)
            at = float(budget["delta"]) if budget else max(state.spends[s]["delta"] for s in seqs)
            totals[dataset_id] = {
                "delta": at,
                "total_epsilon": _compose(state.counting_events(dataset_id), at)[0],
            }
        return {
            "path": str(self.path),
            "ok": True,
            "entries": len(state.entries),
            "counts": counts,
            "open_spends": open_spends,
            "head_hash": state.head_hash,
            "datasets": totals,
            "recomputed": recompute,
            "other_accountant_seqs": other_accountant,
        }

    # ----------------------------------------------------------------- internals

    @staticmethod
    def _totals_for_reserve(
        state: _State,
        dataset_id: str,
        fingerprint: str,
        events: list[dict[str, Any]],
        delta: float,
    ) -> tuple[float, list[tuple[dict[str, Any], float]]]:
        """(total at the spend's δ, [(budget, total at its δ)] for each finite budget of the
        group) after adding `events` to the spend's group."""
        combined = [*state.counting_events(dataset_id, fingerprint=fingerprint), *events]
        total = _compose(combined, delta)[0]
        capped = []
        for budget in state.group_budgets(dataset_id, fingerprint):
            if not math.isfinite(as_float(budget["epsilon"])):
                continue
            budget_delta = float(budget["delta"])
            at_budget = total if budget_delta == delta else _compose(combined, budget_delta)[0]
            capped.append((budget, at_budget))
        return total, capped

    def _warm(self, dataset_id: str, delta: float) -> None:
        _compose(self._read_state().counting_events(dataset_id), delta)

    def _close(
        self,
        seq: int,
        status: str,
        events: list[dict[str, Any]] | None,
        run_id: str,
        fingerprint: str,
    ) -> dict[str, Any]:
        def build(state: _State) -> dict[str, Any]:
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
            epsilon, accountant = _compose(spent, delta)
            dataset_id = spend["dataset_id"]
            total = _compose(state.counting_events(dataset_id, {seq: spent}), delta)[0]
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

    def _check_recorded_epsilons(self, state: _State, entry: dict[str, Any], line: int) -> bool:
        """Recompute a line's `epsilon` and `total_epsilon` as of that line and compare.

        Lines written by this dpsynth version with the same accountant must match to 1e-6
        (relative); lines from another version or accountant only must not under-report by more
        than 5%. Returns False for such a line.
        """
        kind = entry["kind"]
        if kind in ("spend", "status"):
            delta = float(entry["delta"])
            own = entry["events"] if kind == "spend" else state.spent_events(entry["ref"])
            checks = {
                "epsilon": own,
                "total_epsilon": state.counting_events(entry["dataset_id"]),
            }
        elif kind == "budget" and "total_epsilon" in entry:
            delta = float(entry["delta"])
            checks = {"total_epsilon": state.counting_events(entry["dataset_id"])}
        else:
            if kind == "release" and (entry["events"] or as_float(entry.get("epsilon", 0)) != 0):
                raise state.fail(line, "release line carries a privacy cost")
            return True
        same_accountant = entry.get("dpsynth_version") == __version__
        for name, events in checks.items():
            recorded = as_float(entry[name])
            recomputed, accountant = _compose(events, delta)
            if name == "epsilon" or kind == "budget":
                same_accountant = same_accountant and entry.get("accountant") == accountant
            if same_accountant:
                ok = recorded == recomputed or math.isclose(
                    recorded, recomputed, rel_tol=_TOTAL_RTOL, abs_tol=1e-12
                )
            else:
                # Another accountant gives another valid upper bound: only a clearly smaller
                # recorded value (an under-report) is a fault.
                ok = recorded >= recomputed * (1.0 - _OTHER_ACCOUNTANT_RTOL)
            if not ok:
                raise state.fail(
                    line, f"recorded {name} {recorded:.6g} differs from recomputed {recomputed:.6g}"
                )
        return same_accountant

    def _read_state(self) -> _State:
        """Bring the in-memory state up to date with the file (reads only new bytes)."""
        self._file.read_chain(self._state)
        return self._state

    def _append(self, build: Callable[[_State], dict[str, Any]]) -> dict[str, Any]:
        """Under the exclusive lock: re-read, build the line, write it in one call, fsync."""
        return copy.deepcopy(self._file.append(self._state, build))


def _id_key(dataset_id: str) -> str:
    return "id:" + dataset_id


def _fp_key(fingerprint: str) -> str:
    return "fp:" + fingerprint


def _empty_row(dataset_id: str) -> dict[str, Any]:
    return {
        "dataset_id": dataset_id,
        "fingerprints": [],
        "entries": 0,
        "spends": 0,
        "open_spends": 0,
        "releases": 0,
        "private": True,
        "linked_ids": [],
        "budget": None,
        "budget_spent": None,
        "remaining": None,
        "last_time": None,
    }
