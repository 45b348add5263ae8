"""What the ledger's lines mean: spends, their closing status lines, budgets and the groups.

`LedgerState` is the chain of lines read so far (`dpsynth.ledger.chain.Chain`) with what they
say: the spends and the status lines that close them (the counting rule: a spend counts with
its reserved events until a status line closes it, then with the status line's events), the
latest budget per dataset id, and the grouping rule (spends sharing a dataset id or a
fingerprint are linked, transitively; a spend line's `links` names earlier spends on the same
records recorded by a plain digest). See `dpsynth.ledger.spends` for the API on top.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dpsynth.ledger.chain import Chain
from dpsynth.ledger.key import key_id_of
from dpsynth.privacy.accounting.compose import compose_epsilon


def compose_at(events: Sequence[Mapping[str, Any]], delta: float) -> tuple[float, str]:
    """(ε upper bound, accountant) of `events` at `delta` (the accountant caches by events)."""
    bound = compose_epsilon(events, delta)
    return float(bound.epsilon), bound.accountant


@dataclass
class LedgerState(Chain):
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
        """The ids of the keys this ledger's spend fingerprints were made with. Release lines
        are left out: they quote fingerprints from manifests that other ledgers' keys made."""
        found = (key_id_of(str(spend.get("fingerprint", ""))) for spend in self.spends.values())
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


def _id_key(dataset_id: str) -> str:
    return "id:" + dataset_id


def _fp_key(fingerprint: str) -> str:
    return "fp:" + fingerprint
