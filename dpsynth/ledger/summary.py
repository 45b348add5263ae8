"""`ledger show`'s per-dataset totals: spends, releases, the group and the budget left."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from dpsynth.ledger.chain import as_float
from dpsynth.ledger.state import LedgerState, compose_at


def summarize(state: LedgerState, path: Path, delta: float | None = None) -> dict[str, Any]:
    """Per-dataset totals for `ledger show` (ε values are floats, possibly inf).

    The total is at `delta` if given, else at the budget's δ, else at the largest δ among
    the dataset's spends. It composes every spend linked to the dataset id by id or
    fingerprint (the grouping rule); `linked_ids` names the other ids of that group, and
    `private` is False when any spend of the group is not private. One composition per
    dataset.
    """
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
            compose_at(events, at) if at is not None else (0.0, None)
        )
        if budget is not None:
            cap, cap_delta = as_float(budget["epsilon"]), float(budget["delta"])
            spent = compose_at(events, cap_delta)[0]
            row["budget"] = {"epsilon": cap, "delta": cap_delta}
            row["budget_spent"] = spent
            row["remaining"] = cap - spent if math.isfinite(spent) else -math.inf
    return {"path": str(path), "entries": len(state.entries), "datasets": datasets}


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
