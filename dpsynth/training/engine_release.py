"""A table counted out of core (`--engine duckdb|dask://…`) with the DP release of its schema
entries read off the data, from the counts the engine makes.

The order is the in-memory path's (`training.table_schema`, `training.start`): the check pass
(`training.table_source.prepare_table_source`: N, the content digest, every row checked); the
release planned from public facts (N or `--public-size`, δ; `check_reach`); the run's training
plan checked to fit after the release's events (`training.start`, as for the in-memory path);
then one ledger entry (command `schema-release`) reserved, the release run,
and the entry completed or aborted (`training.table_prepare.spend_release`). The release is
`schema_entries.apply_release` on the engine's counts: round 1 each chunk's `count_ranges`
summed by the check pass itself (the release's columns are known before the read; the sums
wait in the counter, `TableCounter.take_folded`, until the round draws its noise after the
reservation), rounds 2 and 3 a pass each summing `count_shapes` over the grids the round
before fixed (`TableCounter.fold`: DuckDB's processes or Dask's workers count their parts and
the sums are merged). The counts are exact integers summed over chunks, and the noise is drawn
from the run's secret stream `schema/release` as in memory, so one privacy seed gives the same
release whichever engine counted.

The source then counts under the released schema. Its content digest (the keyed fingerprint
of the training spend, and what `--resume` checks) is the one a check pass under the released
schema gives: round 2 adds up the rows' hashes over the columns the release keeps, so no pass
of its own is needed (unless the release turned out to keep other columns than round 1 said:
then the check pass is made again). A target whose label set was released keeps the rows of
the labels that cleared the noise (`data.engines.source.LabelledEncoder`); N is then those
rows, read off round 1's exact tally as the in-memory path counts them.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial

import numpy as np
import torch

from dpsynth.data.csvtable import RawTable
from dpsynth.data.discrete import schema_domain
from dpsynth.data.engines import EngineChoice, PassCallback, TableCounter
from dpsynth.data.engines.counting import row_hash_sums, rows_digest
from dpsynth.data.engines.source import TableSource, chunk_encoder
from dpsynth.data.schema import Column, Schema
from dpsynth.errors import UsageError
from dpsynth.ledger import Ledger
from dpsynth.privacy.accounting.calibration import default_delta
from dpsynth.privacy.mechanisms.randomness import PrivateRandomness
from dpsynth.privacy.releases.schema_counts import RangeCounts, ShapeCounts
from dpsynth.privacy.releases.schema_plan import SchemaReleasePlan
from dpsynth.training.request import TrainRequest
from dpsynth.training.schema_counting import count_ranges, count_shapes
from dpsynth.training.schema_entries import (
    AppliedRelease,
    ReleaseColumns,
    apply_release,
    check_reach,
    number_spec,
    plan_release,
    release_columns,
)
from dpsynth.training.table_input import TableInput
from dpsynth.training.table_source import RELEASE_ROUND_1, FirstCounts, prepare_table_source


def prepare_engine_table(
    request: TrainRequest,
    engine: EngineChoice,
    ledger: Ledger,
    share: float,
    on_pass: PassCallback | None = None,
    ahead: FirstCounts | None = None,
) -> tuple[TableSource, TableInput | None]:
    """The table as an engine's source under a public schema (its check pass made, which
    counts what `ahead` plans when nothing is to be released), and the DP release of its
    entries read off the data planned on it (None: nothing to release); nothing is spent
    (see the module)."""
    data, table = request.input, request.table
    assert data.data is not None
    source, epsilon = prepare_table_source(
        spec=data.data,
        engine=engine,
        schema_path=table.schema,
        schema_public=table.schema_public,
        schema_epsilon=table.schema_epsilon,
        class_weights_epsilon=table.class_weights_epsilon,
        dataset_id=data.dataset_id,
        target_epsilon=request.target_epsilon,
        budget=table.memory_budget,
        on_pass=on_pass,
        share=share,
        workers=table.workers,
        ahead=ahead,
    )
    if epsilon is None:
        return source, None
    try:
        return source, plan_engine_release(source, epsilon, request, ledger, share)
    except BaseException:
        source.close()
        raise


class CountedOutOfCore:
    """An out-of-core engine (a `table_prepare.TableEngine`): the source its check pass
    opened, the release's rounds as the engine's passes (`EngineRun`), and the source under
    the released schema afterwards."""

    rows_in_memory = False

    def __init__(self, source: TableSource) -> None:
        self.source = source
        self.run = EngineRun(source.counter)

    @property
    def name(self) -> str:
        """The engine's spec (`duckdb`, `dask://…`)."""
        return self.source.engine

    def for_release(self, table: TableInput, randomness: PrivateRandomness) -> TableInput:
        """The planned release as it stands: a privacy unit is refused out of core."""
        return table

    def release_run(self, table: TableInput) -> EngineRun:
        """The schema entries' release on the engine's passes."""
        return self.run

    def released(self, table: TableInput, schema: Schema) -> TableSource:
        """The source under the released schema (its encoder, N and digest)."""
        return self.run.released_source(self.source, schema)

    def close(self) -> None:
        """Close the engine's connection or cluster client."""
        self.source.close()


def plan_engine_release(
    source: TableSource, epsilon: float, request: TrainRequest, ledger: Ledger, share: float
) -> TableInput:
    """The release of the source's entries read off the data, planned from public facts (N
    from the check pass, or `--public-size`); nothing is spent. UsageError when it would not
    leave room for training, or keep hardly anything (`check_reach`)."""
    given = request.table.schema_epsilon is not None
    target = request.target_epsilon
    flag = "--schema-epsilon" if given else "the default --schema-epsilon"
    if not math.isfinite(target):
        raise UsageError(f"{flag} needs a finite --epsilon (the data set's total)")
    if not epsilon < target:
        raise UsageError(
            f"{flag} ({epsilon:g}) must be below --epsilon {target:g} (the total, training "
            "included)"
        )
    rows = request.input.public_size or source.n
    given_delta = request.privacy.delta
    delta = float(given_delta) if given_delta is not None else default_delta(rows)
    # keyed under the ledger's secret key: the plain digest would be a membership test
    fingerprint = ledger.data_fingerprint(source.content_digest)
    release = plan_release(source.schema, rows, epsilon, delta)
    check_reach(*release, epsilon, None if given else share)
    no_rows = RawTable(tuple(c.name for c in source.schema.columns), (), source.spec)
    return TableInput(
        no_rows, source.schema, source.spec, source.kind, source.dataset_id, epsilon, given,
        release=release, delta=delta, fingerprint=fingerprint, default_share=share,
    )  # fmt: skip


@dataclass
class ShapesAndHashes:
    """Round 2's counts of some rows, and the digest's hash sums of those rows over the columns
    the released schema will use."""

    shapes: ShapeCounts
    hashes: np.ndarray

    def add(self, other: ShapesAndHashes) -> ShapesAndHashes:
        """This plus another chunk's (in place; returns self)."""
        self.shapes.add(other.shapes)
        with np.errstate(over="ignore"):
            self.hashes = self.hashes + other.hashes
        return self


def shapes_and_hashes(
    raw: RawTable, columns: ReleaseColumns, grids: Mapping[str, np.ndarray], schema: Schema
) -> ShapesAndHashes:
    """A chunk's round-2 counts and its rows' hash sums under `schema` (picklable: a fold)."""
    return ShapesAndHashes(count_shapes(raw, columns, grids), row_hash_sums(raw, schema))


class EngineRun:
    """The release's three rounds as three passes of an engine's counter (a `ReleaseRun` of
    `spend_release`); it keeps what the source needs afterwards: round 1's exact label tally
    (N of a released label set) and round 3's hash sums (the digest)."""

    def __init__(self, counter: TableCounter) -> None:
        self.counter = counter
        self.ranges = RangeCounts()
        self.hashed: Schema | None = None
        self.hashes = np.zeros(2, dtype=np.uint64)

    def __call__(
        self,
        schema: Schema,
        columns: ReleaseColumns,
        plan: SchemaReleasePlan,
        generator: torch.Generator,
        source: str,
    ) -> AppliedRelease:
        """`apply_release` on this engine's counts."""

        def ranges() -> RangeCounts:
            # made by the check pass (the same columns, every row as read), else a pass now
            taken, counted = self.counter.take_folded(RELEASE_ROUND_1)
            if not taken or columns != release_columns(schema):
                count = partial(count_ranges, columns=columns)
                counted = self.counter.fold(count, RELEASE_ROUND_1)
            self.ranges = counted or RangeCounts()
            return self.ranges

        def shapes(grids: Mapping[str, np.ndarray]) -> ShapeCounts:
            # the columns the released schema will use: a number with no range is ignored
            self.hashed = schema
            for column in columns.numbers:
                if column.name not in grids:
                    self.hashed = self.hashed.replace_column(Column(column.name, "ignored"))
            count = partial(shapes_and_hashes, columns=columns, grids=dict(grids))
            count = partial(count, schema=self.hashed)
            # a float's decimals are counted on its text, not on its typed value
            text = [c.name for c in columns.numbers if c.name in grids and number_spec(c).decimals]
            out = self.counter.fold(count, "schema release round 3", text)
            if out is None:
                return ShapeCounts()
            self.hashes = out.hashes
            return out.shapes

        def spans(grids: Mapping[str, np.ndarray]) -> ShapeCounts:
            count = partial(count_shapes, columns=columns, grids=dict(grids))
            return self.counter.fold(count, "schema release round 2") or ShapeCounts()

        return apply_release(schema, columns, plan, generator, source, ranges, shapes, spans)

    def released_source(self, source: TableSource, schema: Schema) -> TableSource:
        """The source under the released `schema`: its counter's encoder, N and digest."""
        counter = self.counter
        counter.use_domain(chunk_encoder(schema, schema_domain(schema, 2, False)))
        if self.hashed is not None and _used(self.hashed) == _used(schema):
            digest = rows_digest(schema, counter.record_count, self.hashes)
            counter.kept_count = counter.record_count
            if schema.target in self.ranges.categories:  # the rows of the labels that cleared
                tally = self.ranges.categories.get(schema.target, Counter())
                counter.kept_count = sum(tally[label] for label in schema.classes)
        else:  # the check pass again, under the released schema
            digest = counter.scan()
        return TableSource(
            schema, source.spec, source.kind, digest, source.dataset_id, counter, source.engine
        )


def _used(schema: Schema) -> list[tuple[str, str]]:
    """The columns a digest hashes, with their types."""
    return [(c.name, c.type) for c in schema.columns if c.type != "ignored"]
