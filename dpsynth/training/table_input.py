"""A table read under its public schema, with its DP releases planned but not spent: what
`training.table_schema.read_table_input` returns and `training.table_prepare.PreparedTable.spend`
spends."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from dpsynth.data.csvtable import RawTable
from dpsynth.data.images import DataInfo
from dpsynth.data.schema import Schema
from dpsynth.data.table_codec import TableData, encode_table, table_content_digest
from dpsynth.privacy.accounting.events import DpEvent
from dpsynth.privacy.mechanisms.contribution import UnitBound, unit_indices
from dpsynth.privacy.mechanisms.histograms import ClassWeightsPlan
from dpsynth.privacy.releases.schema_release import SchemaReleasePlan
from dpsynth.privacy.releases.unit_sizes import UnitSizesPlan
from dpsynth.training.schema_entries import ReleaseColumns


@dataclass(frozen=True)
class TableInput:
    """A table read under its public schema, with the DP release of its entries planned but not
    spent (`read_table_input`); `PreparedTable.spend` spends it, and the memory engine
    (`table_schema.RowsInMemory`) encodes the table."""

    raw: RawTable
    schema: Schema
    spec: str
    kind: str
    dataset: str
    # the release's ε (None: nothing to release), and whether the user gave it
    schema_epsilon: float | None
    schema_epsilon_given: bool
    release: tuple[ReleaseColumns, SchemaReleasePlan] | None = None
    weights_plan: ClassWeightsPlan | None = None
    delta: float | None = None
    fingerprint: str | None = None
    # the public description before the release (None when nothing is released)
    provisional: DataInfo | None = None
    # the privacy unit and the release of its rows-per-unit histogram (None: per row)
    unit: UnitBound | None = None
    unit_plan: UnitSizesPlan | None = None
    # the share of --epsilon the default release takes (when the user gave no schema ε)
    default_share: float = 0.25

    @property
    def events(self) -> tuple[DpEvent, ...]:
        """The events the release would spend (empty: nothing is released)."""
        return (
            *(self.release[1].events if self.release else ()),
            *(self.weights_plan.events if self.weights_plan else ()),
            *(self.unit_plan.events if self.unit_plan else ()),
        )

    def encoded(self, raw: RawTable | None = None, schema: Schema | None = None) -> TableData:
        """The table encoded under its schema as it stands (nothing released), or `raw` (its
        rows bounded per unit, or without the labels a release dropped) under `schema`; the
        content digest always names the whole table as read."""
        schema = schema or self.schema
        rows = self.raw if raw is None else raw
        table = encode_table(rows, schema, self.spec, self.kind, self.dataset)
        if self.unit is None and raw is None:
            return table
        return replace(
            table,
            content_digest=table_content_digest(self.raw, schema),
            unit=self.unit.column if self.unit else None,
            rows_per_unit=self.unit.max_rows if self.unit else 1,
            unit_codes=unit_codes(rows, self.unit),
        )


def unit_codes(raw: RawTable, unit: UnitBound | None) -> torch.Tensor | None:
    """Each row's unit as an index 0 … U − 1, for the loop's sampling of units (None without
    a unit)."""
    if unit is None:
        return None
    return torch.from_numpy(unit_indices(raw.column(unit.column)))
