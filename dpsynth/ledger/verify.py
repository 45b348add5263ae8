"""`ledger verify`: re-read the whole file, check the chain and recompute every ε."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from dpsynth import __version__
from dpsynth.ledger.chain import KINDS, as_float
from dpsynth.ledger.file import LedgerFile
from dpsynth.ledger.key import is_legacy
from dpsynth.ledger.state import LedgerState, compose_at

_TOTAL_RTOL = 1e-6
_OTHER_ACCOUNTANT_RTOL = 0.05


def verify_ledger(
    ledger_file: LedgerFile,
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
    state = LedgerState(ledger_file.path)
    other_accountant = []
    for number, line in enumerate(ledger_file.read_lines(state), start=1):
        entry = state.add_line(line, number)
        if recompute and not _check_recorded_epsilons(state, entry, number):
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
            "total_epsilon": compose_at(state.counting_events(dataset_id), at)[0],
        }
    return {
        "path": str(ledger_file.path),
        "ok": True,
        "entries": len(state.entries),
        "counts": counts,
        "open_spends": open_spends,
        "head_hash": state.head_hash,
        "datasets": totals,
        "recomputed": recompute,
        "other_accountant_seqs": other_accountant,
        # lines from before the fingerprint key: they name their data by its plain digest
        "plain_digest_seqs": [
            e["seq"] for e in state.entries if is_legacy(str(e.get("fingerprint", "")))
        ],
    }


def _check_recorded_epsilons(state: LedgerState, entry: dict[str, Any], line: int) -> bool:
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
        recomputed, accountant = compose_at(events, delta)
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
