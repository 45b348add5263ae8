"""A new run's table, opened by its engine and made ready before anything is spent, and the
one spend of its planned DP releases (`PreparedTable.spend`: a table's first private read).

Rows in memory are one engine among the others. `prepare_table` chooses the engine
(`table_source.table_engine`: `memory`, `duckdb` or `dask`), and the engine opens the table
under its public schema with the release of the entries read off the data planned from public
facts, not spent: `table_schema.read_table_input` reads the rows into memory,
`engine_release.prepare_engine_table` makes an out-of-core engine's check pass. Each engine is
then a `TableEngine`: it gives the release the rows to read (a privacy unit's rows bounded in
memory), the release's counts (a `ReleaseRun`: `schema_counting` on the rows held, or the
engine's passes, `engine_release.EngineRun`) and the records afterwards (the rows encoded, or
the source under the released schema). `spend_release` is the one spend: one ledger entry
(command `schema-release`) reserved, the releases run, the entry completed or aborted.

`training.start` chooses the backend on `PreparedTable.info` (`--method auto`: the
description the release is planned on, so that the release and the run agree), checks that
the training plan still fits after the release's events, and only then calls `spend`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Protocol

from dpsynth.data.column_values import RELEASED_PREFIX
from dpsynth.data.engines import EngineChoice, PassCallback
from dpsynth.data.images import DataInfo
from dpsynth.data.records import Records
from dpsynth.data.schema import Schema
from dpsynth.errors import UsageError
from dpsynth.ledger import Ledger
from dpsynth.methods.base import Method
from dpsynth.privacy.accounting.compose import compose_epsilon
from dpsynth.privacy.mechanisms.contribution import UnitBound
from dpsynth.privacy.mechanisms.histograms import release_class_weights
from dpsynth.privacy.mechanisms.randomness import PrivateRandomness
from dpsynth.privacy.releases.unit_sizes import release_unit_sizes
from dpsynth.training.data import check_engine_method, check_modality
from dpsynth.training.request import TrainRequest
from dpsynth.training.schema_entries import AppliedRelease, ReleaseRun
from dpsynth.training.table_input import TableInput
from dpsynth.training.table_units import (
    check_unit_composition,
    check_unit_method,
    rows_with_labels,
    unit_bound,
    unit_sizes,
)


class TableEngine(Protocol):
    """What counts a table for its DP releases: the rows held (`table_schema.RowsInMemory`) or
    an out-of-core engine (`engine_release.CountedOutOfCore`)."""

    @property
    def name(self) -> str:
        """`memory`, or the out-of-core engine's spec."""
        ...

    @property
    def rows_in_memory(self) -> bool:
        """Whether the rows are held here (an engine's source counts them, never holds them)."""
        ...

    def for_release(self, table: TableInput, randomness: PrivateRandomness) -> TableInput:
        """The planned release with the rows it reads (a unit's rows bounded in memory)."""
        ...

    def release_run(self, table: TableInput) -> ReleaseRun:
        """The schema entries' release on this engine's counts of `table`'s rows."""
        ...

    def released(self, table: TableInput, schema: Schema) -> Records:
        """The records the run trains on, under the released `schema`."""
        ...

    def close(self) -> None:
        """Close an engine's connection or client (nothing for rows in memory)."""
        ...


@dataclass(frozen=True)
class PreparedTable:
    """A table before any spend: its engine, the public description `--method auto` chooses
    on and the training plan is checked on before the spend, the records the run trains on
    when nothing is released, else the release planned on them (`pending`, spent by
    `spend`), and the privacy unit."""

    engine: TableEngine
    info: DataInfo
    records: Records | None = None  # None while a release is pending
    pending: TableInput | None = None  # the planned release (None: nothing to release)
    unit: UnitBound | None = None

    @property
    def in_memory(self) -> bool:
        """Whether the rows are held here (an engine's source counts them, never holds them)."""
        return self.engine.rows_in_memory

    def spend(
        self,
        ledger: Ledger,
        method: str,
        run_id: str,
        randomness: PrivateRandomness,
        reach_ends: bool = True,
    ) -> tuple[Records, dict[str, Any] | None]:
        """Spend the planned release (one ledger entry) and return the records under the
        released schema with the release's record (None: nothing was released).
        `reach_ends`: the method draws a number's end bins by tails (`Method.draws_end_tails`)."""
        if self.pending is None:
            assert self.records is not None
            return self.records, None
        pending = self.pending
        if pending.release is not None and not reach_ends:
            columns, plan = pending.release
            pending = replace(pending, release=(columns, replace(plan, reach_ends=False)))
        table = self.engine.for_release(pending, randomness)
        run = self.engine.release_run(table)
        schema, record = spend_release(table, ledger, method, run_id, randomness, run)
        if not table.schema_epsilon_given and table.schema_epsilon is not None:
            record["default_share"] = table.default_share  # the safe default, not a user's flag
        return self.engine.released(table, schema), record

    def close(self) -> None:
        """Close an engine's connection or client (nothing for rows in memory)."""
        self.engine.close()


def prepare_table(
    request: TrainRequest, backend: Method | None, ledger: Ledger, on_pass: PassCallback | None
) -> PreparedTable:
    """The table of `request` opened by its engine, ready to train on or to release (see the
    module); `backend` is None for `--method auto`. UsageError for what cannot start, before
    anything is spent."""
    from dpsynth.training.table_schema import schema_share
    from dpsynth.training.table_source import table_engine

    if backend is not None:
        check_modality(backend, "table")
    images = request.images
    if images.image_size is not None or images.channels is not None:
        raise UsageError(
            "{image_size} and {channels} are for images, not tables",
            parameters=("image_size", "channels"),
        )
    if images.classes is not None:
        message = "a table's classes are its schema's target categories; drop {classes}"
        raise UsageError(message, parameter="classes")
    data, table, privacy = request.input, request.table, request.privacy
    assert data.data is not None
    unit = unit_bound(privacy.privacy_unit, privacy.max_rows_per_unit)
    if unit is not None and backend is not None:
        check_unit_method(backend, unit)
    counts = backend is None or hasattr(getattr(backend, "trainer_class", None), "attach_counter")
    chosen = table_engine(data.data, table.engine, table.schema, table.memory_budget, counts)
    share = schema_share(backend is None or backend.reuses_one_ways)  # auto: mst or aim
    if chosen == "memory":
        prepared = _open_in_memory(request, ledger, unit, share)
    else:
        prepared = _open_out_of_core(request, backend, chosen, ledger, unit, share, on_pass)
    try:
        # before the release is spent: the data set's earlier spends must protect the same unit
        dataset = prepared.info.dataset_id
        fingerprint = prepared.pending.fingerprint if prepared.pending else None
        if fingerprint is None and prepared.records is not None:
            fingerprint = ledger.data_fingerprint(prepared.records.content_digest, create=False)
        check_unit_composition(ledger, dataset, fingerprint, unit)
    except BaseException:
        prepared.close()
        raise
    if data.public_size is not None and prepared.pending is not None:
        prepared = replace(prepared, info=replace(prepared.info, n=data.public_size))
    return prepared


def _open_in_memory(
    request: TrainRequest, ledger: Ledger, unit: UnitBound | None, share: float
) -> PreparedTable:
    """The memory engine: the rows read under the public schema, every row checked."""
    from dpsynth.training.table_schema import RowsInMemory, read_table_input

    data, table, privacy = request.input, request.table, request.privacy
    assert data.data is not None
    pending = read_table_input(
        spec=data.data,
        schema_path=table.schema,
        schema_public=table.schema_public,
        schema_epsilon=table.schema_epsilon,
        class_weights_epsilon=table.class_weights_epsilon,
        dataset_id=data.dataset_id,
        ledger=ledger,
        delta=privacy.delta,
        public_size=data.public_size,
        target_epsilon=request.target_epsilon,
        unit=unit,
        share=share,
    )
    engine = RowsInMemory(pending)
    if pending.provisional is None:  # nothing to release: choose on the encoded table
        records = pending.encoded()
        return PreparedTable(engine, records.info(""), records, unit=unit)
    return PreparedTable(engine, pending.provisional, None, pending, unit)


def _open_out_of_core(
    request: TrainRequest, backend: Method | None, chosen: str, ledger: Ledger,
    unit: UnitBound | None, share: float, on_pass: PassCallback | None,
) -> PreparedTable:  # fmt: skip
    """An out-of-core engine (DuckDB, Dask): its check pass made over the table (counting the
    trainer's first marginals too under a public schema: `table_source.first_counts`)."""
    from dpsynth.training.engine_release import CountedOutOfCore, prepare_engine_table
    from dpsynth.training.table_source import first_counts

    engine = request.table.engine
    if engine.name == "auto":  # DuckDB, chosen for the table's size
        engine = EngineChoice(chosen)
    if backend is not None:
        check_engine_method(backend, EngineChoice(chosen, engine.address).spec)
    if unit is not None:
        raise UsageError(
            f"{{privacy_unit}}: the table is counted out of core ({chosen}); a privacy "
            "unit bounds rows in memory for now (--engine memory, within the memory budget)",
            parameters=("privacy_unit", "engine"),
        )
    ahead = first_counts(request, backend)
    source, pending = prepare_engine_table(request, engine, ledger, share, on_pass, ahead)
    counted = CountedOutOfCore(source)
    if pending is None:
        return PreparedTable(counted, source.info(""), source)
    assert pending.fingerprint is not None
    return PreparedTable(counted, source.info(pending.fingerprint), None, pending)


def spend_release(
    table: TableInput,
    ledger: Ledger,
    method: str,
    run_id: str,
    randomness: PrivateRandomness,
    run: ReleaseRun,
) -> tuple[Schema, dict[str, Any]]:
    """Spend the table's planned releases in one ledger entry (command `schema-release`): the
    schema entries' release on `run` (the engine's counts), and in memory the class weights
    and a unit's rows-per-unit histogram on `table.raw` (bounded per unit already). Returns
    the schema with the released entries (and weights), and the release's record for
    config.json."""
    raw, schema, events = table.raw, table.schema, table.events
    planned, weights_plan, epsilon = table.release, table.weights_plan, table.schema_epsilon
    delta, dataset, fingerprint = table.delta, table.dataset, table.fingerprint
    assert delta is not None and fingerprint is not None
    entry = ledger.reserve(
        dataset_id=dataset,
        fingerprint=fingerprint,
        command="schema-release",
        method=method,
        run_id=run_id,
        events=list(events),
        delta=delta,
        max_total_epsilon=None,
        privacy_unit=table.unit.to_json() if table.unit else None,
    )
    source = f"{RELEASED_PREFIX} (--schema-epsilon {epsilon or 0:g}, ledger seq {entry['seq']})"
    warnings: list[str] = []
    applied = None
    shares: tuple[float, ...] | None = None
    try:
        if planned is not None:
            columns, plan = planned
            # one secret stream for the release, whatever reads the rows: the same release
            generator = randomness.generator("schema/release")
            applied = run(schema, columns, plan, generator, source)
            schema, warnings = applied.schema, applied.warnings
        weights = None
        if weights_plan is not None:
            weights = release_class_weights(
                rows_with_labels(raw, schema.target, schema.classes).column(schema.target),
                schema.classes,
                weights_plan,
                randomness.generator("schema/class-weights"),
            )
        if table.unit is not None and table.unit_plan is not None:
            shares = release_unit_sizes(
                unit_sizes(raw, table.unit),
                table.unit_plan,
                randomness.generator("schema/unit-sizes"),
            )
    except BaseException:
        ledger.abort(entry["seq"], run_id=run_id, fingerprint=fingerprint)
        raise
    ledger.complete(entry["seq"], list(events), run_id=run_id, fingerprint=fingerprint)
    if weights_plan is not None and weights is not None:
        schema = schema.replace_column(
            replace(
                schema.target_column,
                weights=weights,
                weights_source=(
                    f"released with DP (--class-weights-epsilon {weights_plan.epsilon:.3g}, "
                    f"ledger seq {entry['seq']})"
                ),
            )
        )
    record: dict[str, Any] = {
        "ledger_seq": entry["seq"],
        "released_columns": planned[0].names if planned else [],
        **(planned[1].to_json() if planned is not None else {}),
        "warnings": warnings,
    }
    if applied is not None:
        record["clipped"] = {name: round(share, 4) for name, share in applied.clipped.items()}
        record["clipped_deviation"] = {
            name: round(deviation, 4) for name, deviation in applied.clipped_deviation.items()
        }
        record["one_ways"] = one_way_record(applied)
        if applied.second_looks:
            record["second_looks"] = list(applied.second_looks)
    if weights_plan is not None:
        record["class_weights"] = {**weights_plan.to_json(), "weights": list(weights or ())}
    if table.unit is not None and table.unit_plan is not None:
        record["unit_sizes"] = {**table.unit_plan.to_json(), "shares": list(shares or ())}
    if weights_plan is not None or table.unit_plan is not None:
        # the entry's ε: every release composed (one event each)
        record["epsilon"] = compose_epsilon(events, delta).epsilon
        record["delta"] = delta
        record["events"] = [e.to_json() for e in events]
    return schema, record


def one_way_record(applied: AppliedRelease) -> dict[str, dict[str, Any]]:
    """Each released column's noisy histogram, as MST and AIM reuse it for their 1-way
    measurement (`dpsynth.methods.marginal.one_ways`): DP outputs of the release."""
    out: dict[str, dict[str, Any]] = {}
    for name, (kept, counts) in applied.category_counts.items():
        out[name] = {
            "kind": "category",
            "values": list(kept),
            "counts": list(counts),
            "noise_std": applied.category_noise[name],
        }
    for name, shape in applied.shapes.items():
        kind = "number" if shape.grid else "boolean"
        entry: dict[str, Any] = {"kind": kind, "counts": list(shape.counts)}
        if shape.grid:
            entry["grid"] = list(shape.grid)
        out[name] = {**entry, "noise_std": shape.noise_std}
    return out


def with_released_one_ways(
    config: dict[str, Any], release: dict[str, Any] | None, reuses: bool
) -> dict[str, Any]:
    """The run's config with the release's 1-way histograms (taken out of its record) when
    the method `reuses` them as its 1-way measurements (MST, AIM); unchanged otherwise."""
    from dpsynth.methods.marginal.one_ways import ONE_WAYS_KEY

    one_ways = (release or {}).pop("one_ways", None)
    return {**config, ONE_WAYS_KEY: one_ways} if one_ways and reuses else config
