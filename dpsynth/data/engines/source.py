"""A table counted by an out-of-core engine, in the place of the in-memory `TableData`.

The training loop hands every trainer the records as tensors; a `TableSource` holds none (its
`x` has no rows) and gives the marginal trainers its counter instead (`counter_for`, over the
trainer's own binning of the public schema). N is the count of the engine's check pass, as
the in-memory N is the rows read; the content digest is the check pass's (see
`counting.rows_digest`: it names the rows whatever their order or partitioning, and is keyed
by the ledger before it is written anywhere).

A target whose label set was released with DP (`dpsynth.training.schema_entries`) keeps only
the labels that cleared the noise: a row of any other label is left out of training, never
relabelled, as `training.table_units.rows_with_labels` leaves it out in memory. Its source's
encoder is a `LabelledEncoder`, which leaves those rows out of every count; N is then the rows
counted, and the check pass's digest still names every row read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import torch

from dpsynth.data.column_values import is_released
from dpsynth.data.csvtable import RawTable
from dpsynth.data.discrete import ChunkEncoder, TableDomain, TypedChunk, codes_from_raw
from dpsynth.data.engines.base import TableCounter
from dpsynth.data.images import DataInfo
from dpsynth.data.schema import Schema
from dpsynth.data.table_codec import TableCodec, table_info
from dpsynth.errors import UsageError


@dataclass(frozen=True)
class LabelledEncoder(ChunkEncoder):
    """The one encoding of the rows whose target is one of the schema's classes (a DP-released
    label set); the other rows are left out."""

    def __call__(self, raw: RawTable) -> np.ndarray:
        """`codes_from_raw` of the chunk's rows with a released label."""
        return codes_from_raw(labelled_rows(raw, self.schema), self.schema, self.domain)


def chunk_encoder(schema: Schema, domain: TableDomain) -> ChunkEncoder:
    """The encoder of a source's chunks: a `LabelledEncoder` when the target's label set was
    released with DP, else the one encoding of every row."""
    if is_released(schema.target_column):
        return LabelledEncoder(schema, domain)
    return ChunkEncoder(schema, domain)


def labelled_rows(raw: RawTable, schema: Schema) -> RawTable:
    """The chunk's rows whose target is one of `schema.classes` (exact text, as in memory)."""
    labels = list(schema.classes)
    typed = getattr(raw, "categories", {}).get(schema.target)
    if typed is not None:
        indices, uniques = typed
        keep = np.isin(np.asarray(uniques, dtype=object), labels)[indices]
    else:
        keep = np.isin(np.asarray(raw.column(schema.target), dtype=object), labels)
    if keep.all():
        return raw
    columns = tuple(c[keep] for c in raw.columns)
    if isinstance(raw, TypedChunk):
        numbers = {name: values[keep] for name, values in raw.numbers.items()}
        categories = {name: (i[keep], u) for name, (i, u) in raw.categories.items()}
        return TypedChunk(raw.header, columns, raw.source, numbers, categories)
    return RawTable(raw.header, columns, raw.source)


@dataclass
class TableSource:
    """A public schema, the source's identity and N, and the engine that counts it."""

    schema: Schema
    spec: str
    kind: str
    content_digest: str = field(repr=False)
    dataset_id: str
    counter: TableCounter = field(repr=False)
    engine: str

    def __post_init__(self) -> None:
        self.codec = TableCodec(self.schema)
        self.x = torch.zeros((0, self.codec.dim), dtype=torch.float32)
        self.y = torch.zeros(0, dtype=torch.int64)

    @property
    def classes(self) -> tuple[str, ...]:
        """The public label set (the target's categories)."""
        return self.schema.classes

    @property
    def n(self) -> int:
        """N, the rows the check pass counted (of a released label: see the module)."""
        return self.counter.kept_count

    @property
    def passes(self) -> int:
        """The passes the engine made over the data in this command (public: the run's
        schedule and settings fix them), the check pass included."""
        return self.counter.passes

    @property
    def pass_names(self) -> tuple[str, ...]:
        """What each of those passes did, in order (`check, 1,226 marginals`, …)."""
        return tuple(self.counter.pass_names)

    @property
    def shape(self) -> tuple[int]:
        """Per-record shape (D,): the encoded width."""
        return (self.codec.dim,)

    def info(self, fingerprint: str = "") -> DataInfo:
        """The public description, as `TableData.info` gives it."""
        return table_info(self, fingerprint)

    def as_float(self) -> torch.Tensor:
        """No rows: the engine counts them (a trainer that needs rows is refused first)."""
        return self.x

    def counter_for(self, domain: TableDomain) -> TableCounter:
        """The engine's counter over a trainer's binning of this schema."""
        self.counter.use_domain(chunk_encoder(self.schema, domain))
        return self.counter

    # the `Records` interface (`dpsynth.data.records`): no rows here, and no units sampled
    rows_in_memory: ClassVar[bool] = False
    sampling_units: ClassVar[None] = None

    def attach_to(self, trainer: object, method: str) -> None:
        """Give a marginal trainer the engine's counter over its own binning (UsageError,
        exit 2, for a trainer that needs the rows themselves: refused before any spend)."""
        attach = getattr(trainer, "attach_counter", None)
        domain = getattr(trainer, "domain", None)
        if attach is None or domain is None:
            raise UsageError(needs_rows_message(self.engine, method))
        attach(self.counter_for(domain))

    def close(self) -> None:
        """Release the engine (a cluster client; DuckDB holds nothing between passes)."""
        self.counter.close()


def needs_rows_message(engine: str, method: str) -> str:
    """Why a method that trains on the rows themselves cannot run on an out-of-core engine."""
    return (
        f"--engine {engine}: --method {method} trains on the rows in memory; the out-of-core "
        "engines count marginals for mst and aim (use --engine memory)"
    )
