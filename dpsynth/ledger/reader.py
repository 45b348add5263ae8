"""The privacy ledger read, never written: its lines brought up to date and the queries on them.

`LedgerReader` owns the ledger file and the state its lines were read into, and answers what
the ledger holds: the lines, the head to publish, budgets, a dataset's counting events, merged
spends, `ledger show`'s summary and `ledger verify`. Each query first reads what other
processes appended since the last one (`verify` re-reads the whole file). `Ledger`
(`dpsynth.ledger.spends`) is this class plus the writes (reserve, complete, abort, releases,
budgets), the fingerprint key and the composed totals.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dpsynth.errors import UsageError
from dpsynth.ledger.chain import GENESIS_HASH
from dpsynth.ledger.file import LedgerFile
from dpsynth.ledger.state import LedgerState
from dpsynth.ledger.summary import summarize
from dpsynth.ledger.verify import verify_ledger


class LedgerReader:
    """The ledger at `path` (a missing file is an empty ledger), for reading."""

    def __init__(self, path: Path | str) -> None:
        self._file = LedgerFile(path)
        self.path = self._file.path
        self.lock_path = self._file.lock_path
        self._state = LedgerState(self.path)

    def check_path(self) -> None:
        """UsageError (exit 2) when the ledger path names a folder rather than a file."""
        self._file.check_path()

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

    def units_for(self, dataset_id: str, fingerprint: str | None = None) -> set[str]:
        """The privacy units of every counting spend linked to this dataset id or fingerprint,
        each as 'COLUMN:K', or 'row' for a spend per row (the composed ε of a group is a
        bound per unit only when every spend in it protects the same unit)."""
        state = self._read_state()
        units: set[str] = set()
        for seq in state.group_spends(dataset_id, fingerprint):
            if not state.spent_events(seq):
                continue
            unit = state.spends[seq].get("privacy_unit")
            units.add(f"{unit['column']}:{unit['max_rows_per_unit']}" if unit else "row")
        return units

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

    def _read_state(self) -> LedgerState:
        """Bring the in-memory state up to date with the file (reads only new bytes)."""
        self._file.read_chain(self._state)
        return self._state
