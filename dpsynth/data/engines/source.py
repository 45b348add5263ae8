"""A table counted by an out-of-core engine, in the place of the in-memory `TableData`.

The training loop hands every trainer the records as tensors; a `TableSource` holds none (its
`x` has no rows) and gives the marginal trainers its counter instead (`counter_for`, over the
trainer's own binning of the public schema). N is the count of the engine's check pass, as
the in-memory N is the rows read; the content digest is the check pass's (see
`counting.rows_digest`: it names the rows whatever their order or partitioning, and is keyed
by the ledger before it is written anywhere).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from dpsynth.data.discrete import ChunkEncoder, TableDomain
from dpsynth.data.engines.base import TableCounter
from dpsynth.data.images import DataInfo
from dpsynth.data.schema import Schema
from dpsynth.data.table_codec import TableCodec, table_info


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
        """N, the rows the check pass counted."""
        return self.counter.record_count

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
        self.counter.use_domain(ChunkEncoder(self.schema, domain))
        return self.counter

    def close(self) -> None:
        """Release the engine (a cluster client; DuckDB holds nothing between passes)."""
        self.counter.close()
