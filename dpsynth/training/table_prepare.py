"""A new run's table made ready before anything is spent: read under a public schema in memory,
or opened as an out-of-core engine's source, with the DP release of its entries read off the
data planned from public facts but not spent (`PreparedTable`).

`training.start` then chooses the backend on `PreparedTable.info` (`--method auto`: the
description the release is planned on, so that the release and the run agree), checks that
the training plan still fits after the release's events, and only then calls `spend`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from dpsynth.data.engines import EngineChoice, PassCallback
from dpsynth.data.engines.source import TableSource
from dpsynth.data.images import DataInfo
from dpsynth.data.table_codec import TableData
from dpsynth.errors import UsageError
from dpsynth.ledger import Ledger
from dpsynth.methods.base import Method
from dpsynth.privacy.mechanisms.contribution import UnitBound
from dpsynth.privacy.mechanisms.randomness import PrivateRandomness
from dpsynth.training.data import check_engine_method, check_modality
from dpsynth.training.request import TrainRequest
from dpsynth.training.table_input import TableInput
from dpsynth.training.table_units import check_unit_composition, check_unit_method, unit_bound


@dataclass(frozen=True)
class PreparedTable:
    """A table before any spend: the records the run trains on when nothing is released, else
    the release planned on them (`pending`, spent by `spend`); `info` is the public description
    `--method auto` chooses on and the training plan is checked on before the spend."""

    # the records (None in memory while a release is pending: encoded once it is spent)
    records: TableData | TableSource | None
    info: DataInfo
    pending: TableInput | None = None  # the planned release (None: nothing to release)
    unit: UnitBound | None = None

    @property
    def in_memory(self) -> bool:
        """Whether the rows are held here (an engine's source counts them, never holds them)."""
        return not isinstance(self.records, TableSource)

    def spend(
        self, ledger: Ledger, method: str, run_id: str, randomness: PrivateRandomness
    ) -> tuple[TableData | TableSource, dict[str, Any] | None]:
        """Spend the planned release (one ledger entry) and return the records under the
        released schema with the release's record (None: nothing was released)."""
        if self.pending is None:
            assert self.records is not None
            return self.records, None
        if isinstance(self.records, TableSource):
            from dpsynth.training.engine_release import spend_engine_release

            return spend_engine_release(
                self.records, self.pending, ledger, method, run_id, randomness
            )
        from dpsynth.training.table_schema import release_table_schema

        return release_table_schema(self.pending, ledger, method, run_id, randomness)

    def close(self) -> None:
        """Close an engine's connection or client (nothing for rows in memory)."""
        if isinstance(self.records, TableSource):
            self.records.close()


def prepare_table(
    request: TrainRequest, backend: Method | None, ledger: Ledger, on_pass: PassCallback | None
) -> PreparedTable:
    """The table of `request` ready to train on or to release (see the module); `backend` is
    None for `--method auto`. UsageError for what cannot start, before anything is spent."""
    from dpsynth.training.table_schema import read_table_input, schema_share
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
    engine = table.engine
    counts = backend is None or hasattr(getattr(backend, "trainer_class", None), "attach_counter")
    chosen = table_engine(data.data, engine, table.schema, table.memory_budget, counts)
    share = schema_share(backend is None or backend.reuses_one_ways)  # auto: mst or aim
    if chosen != "memory":
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
        from dpsynth.training.engine_release import prepare_engine_table

        source, pending = prepare_engine_table(request, engine, ledger, share, on_pass)
        if pending is None:
            return PreparedTable(source, source.info(""))
        assert pending.fingerprint is not None
        info = source.info(pending.fingerprint)
    else:
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
        if pending.provisional is None:  # nothing to release: choose on the encoded table
            records = pending.encoded()
            existing = ledger.data_fingerprint(records.content_digest, create=False)
            check_unit_composition(ledger, pending.dataset, existing, unit)
            return PreparedTable(records, records.info(""), unit=unit)
        source, info = None, pending.provisional
    try:
        # before the release is spent: the data set's earlier spends must protect the same unit
        check_unit_composition(ledger, pending.dataset, pending.fingerprint, unit)
    except BaseException:
        if source is not None:
            source.close()
        raise
    if data.public_size is not None:
        info = replace(info, n=data.public_size)
    return PreparedTable(source, info, pending, unit)
