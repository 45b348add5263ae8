"""Tables at scale: a `csv:` or `parquet:` source counted out of core by an engine (`--engine`).

`table_engine` resolves `--engine auto` (the default): the in-memory path of
`dpsynth.training.table_schema` when the table's estimated size in memory fits the memory budget
(and always for the built-in tables), else DuckDB. `prepare_table_source` is that path's twin for
the out-of-core engines: the same schema marks and the same default DP release of the entries read
off the data (`--schema-epsilon`, a share of `--epsilon` unless given), then the engine's check
pass (every row encoded, so a bad cell fails before anything is spent; N counted; the content
digest; the columns a release will replace are checked as in memory: their lists and missing
flags are not, as the release replaces them), then the check of category lists read off the data
against N. The release itself is planned, spent and run on the engine's passes by
`dpsynth.training.engine_release`. The DP release of the target's class weights
(`--class-weights-epsilon`) is not made on an engine: refused (exit 2) before anything is read.

Passes over the data in a run: the check pass; with a DP schema release, its three rounds (one
pass each, the first made by the check pass itself); then the marginal trainer's counting
passes (`MarginalQueries.prefetch`: one for mst and aim, every candidate marginal counted up
front). Under a public schema (nothing to release) the check pass is also the counting pass:
the marginals the trainer will first ask for follow from public facts (the method, its preset
and the schema: `first_counts`), so the check pass counts them besides N and the digest, and
the counter hands them to the trainer when it asks, after the reservation
(`data.engines.base`): one pass in all. The reservation still comes after the pass and before
any noise (N sets the default δ and the plan, and the keyed fingerprint of the digest composes
the earlier spends), and a bad cell still fails that pass before anything is spent. With a DP
schema release pending, the check pass counts the release's first round instead (its columns
are known before the read: `release_columns`), which the release takes after its reservation
(`engine_release.EngineRun`): the check pass and the three rounds are three passes, then the
counting pass under the released schema (whose domain the release's noise decides).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path

import numpy as np

from dpsynth.data.csvtable import RawTable
from dpsynth.data.discrete import TableDomain, schema_domain, table_domain
from dpsynth.data.engines import (
    EngineChoice,
    PassCallback,
    choose_engine,
    memory_estimate,
    open_counter,
    parquet_rows,
    table_files,
)
from dpsynth.data.engines.base import Ahead
from dpsynth.data.engines.chunks import footer_rows
from dpsynth.data.engines.counting import Clique
from dpsynth.data.engines.source import TableSource, chunk_encoder
from dpsynth.data.images import DataInfo
from dpsynth.data.limits import memory_budget
from dpsynth.data.schema import Schema
from dpsynth.data.schema_file import SchemaInput, as_schema
from dpsynth.data.sources import DataInput, parse_spec
from dpsynth.data.table_codec import TableCodec, check_header
from dpsynth.errors import DpsynthError, UsageError
from dpsynth.methods.base import Method
from dpsynth.methods.recommend import recommend_method, resolve_preset
from dpsynth.methods.registry import get_method
from dpsynth.training.request import TrainRequest
from dpsynth.training.schema_counting import count_ranges
from dpsynth.training.schema_entries import OTHER, release_columns
from dpsynth.training.table_schema import (
    SCHEMA_SHARE,
    check_class_weights,
    check_public,
    default_schema_epsilon,
    public_marks,
)

# The marginals a trainer will first count, under its binning, planned from public facts for
# the schema the check pass reads and the footers' row count (None: not known before the read).
FirstCounts = Callable[[Schema, int | None], tuple[TableDomain, Sequence[Clique]] | None]


# The DP schema release's first round, which the check pass counts when a release is pending.
RELEASE_ROUND_1 = "schema release round 1"


def first_counts(request: TrainRequest, backend: Method | None) -> FirstCounts:
    """What the check pass may count for the run's trainer (see the module): the cliques
    `backend.first_cliques` gives under the domain of the preset the run will resolve, on the
    public description the run will plan on (`--method auto`: the method it will recommend on
    the footers' N, the N the check pass counts; a CSV has none, so no guess). Public facts
    only; a wrong guess costs a counting pass of its own, never a count."""

    def plan(schema: Schema, rows: int | None) -> tuple[TableDomain, Sequence[Clique]] | None:
        assert request.input.data is not None
        spec = parse_spec(request.input.data)
        shape: tuple = (TableCodec(schema).dim,)
        classes = tuple(schema.classes)
        description = (spec.canonical, spec.kind, rows or 0, shape, classes, "", spec.canonical)
        info = DataInfo(*description, modality="table", schema=schema.to_json())
        target = request.target_epsilon
        chosen = backend
        try:
            if chosen is None and rows is not None:
                chosen = get_method(recommend_method(info, target))
            cliques = getattr(chosen, "first_cliques", None)
            if chosen is None or cliques is None:
                return None
            preset = resolve_preset(chosen, request.backend.preset, info, target)
            config = chosen.config(preset, dict(request.backend.overrides), info)
            # the run's own refusal of a domain too large for its marginals, before counting
            chosen.validate_config(config, info, rows_in_memory=False)  # type: ignore[call-arg]
            domain = table_domain(info, config)
            return domain, [tuple(int(j) for j in c) for c in cliques(domain, config)]
        except (DpsynthError, KeyError, ValueError, TypeError):
            return None  # the run says what is wrong, after the check pass as before

    return plan


def table_engine(
    spec: DataInput,
    choice: EngineChoice,
    schema_path: SchemaInput | None,
    budget: int | None,
    counts_marginals: bool = True,
) -> str:
    """The engine that counts this table: `memory`, `duckdb` or `dask` (see the module).
    `auto` keeps the in-memory path for a method that trains on rows (`counts_marginals`
    false), and wherever the in-memory reader should say what is wrong with the input."""
    parsed = parse_spec(spec)
    if parsed.kind in ("builtin", "frame"):
        if choice.name not in ("auto", "memory"):
            where = "a DataFrame is" if parsed.kind == "frame" else f"{spec} is built in and"
            raise UsageError(
                f"{{engine}} {choice.spec} reads csv:FILE or parquet:PATH; {where} read in "
                "memory ({engine} memory)",
                parameter="engine",
            )
        return "memory"
    if choice.name != "auto":
        return choice.name
    if not counts_marginals:
        return "memory"
    if not Path(parsed.target).is_file():
        try:  # a partitioned folder or a glob: the in-memory reader takes one file
            return "duckdb" if table_files(spec).kind == "parquet" else "memory"
        except UsageError:
            return "memory"  # nothing to read: the in-memory reader says so
    if schema_path is None:
        return "memory"  # the in-memory path says that a schema is needed
    files = table_files(spec)
    width = TableCodec(as_schema(schema_path)).dim
    rows = footer_rows(files.paths[0]) if files.kind == "parquet" else None
    if files.kind == "parquet" and rows is None:
        return "memory"  # unreadable: the in-memory reader says why, naming the spec
    return choose_engine(choice, memory_estimate(files, rows, width), budget or memory_budget())


def prepare_table_source(
    *,
    spec: DataInput,
    engine: EngineChoice,
    schema_path: SchemaInput | None,
    schema_public: bool,
    schema_epsilon: float | None,
    class_weights_epsilon: float | None,
    dataset_id: str | None,
    target_epsilon: float,
    budget: int | None,
    on_pass: PassCallback | None = None,
    share: float = SCHEMA_SHARE,
    workers: int | None = None,
    ahead: FirstCounts | None = None,
) -> tuple[TableSource, float | None]:
    """The table as an engine's source under its schema with this run's marks, and the ε of
    the DP release of its entries read off the data (None: nothing to release; the default:
    `share` of a finite `target_epsilon`), counted by `workers` (None: the engine's default);
    with nothing to release, its check pass counts what `ahead` plans too. Nothing is spent
    (see the module)."""
    if schema_path is None:
        raise UsageError(
            f"--engine {engine.spec}: {spec} needs --schema FILE.json (draft one with "
            f"`dpsynth data schema {spec} > schema.json`)"
        )
    schema = as_schema(schema_path)
    if schema_public and schema_epsilon is not None:
        raise UsageError("--schema-public and --schema-epsilon exclude each other")
    if class_weights_epsilon is not None:
        raise UsageError(
            f"--engine {engine.spec}: the DP release of the class weights "
            "(--class-weights-epsilon) is made in memory only; declare public weights in the "
            "schema, leave them out, or use --engine memory",
            parameters=("class_weights_epsilon", "engine"),
        )
    check_class_weights(schema, schema_public, None)
    released = default_schema_epsilon(schema, schema_public, schema_epsilon, target_epsilon, share)
    schema = public_marks(schema, schema_public, released, target_epsilon)
    pending = schema.data_derived() if released is not None else ()
    ahead = ahead if released is None else None  # a release changes the schema: no guess
    source = open_table_source(
        spec, schema, engine, budget, dataset_id, on_pass, pending, workers, ahead
    )
    check_public(schema, schema_public, schema_epsilon, source.n)
    return source, released


def pending_schema(schema: Schema, names: Sequence[str]) -> Schema:
    """The schema the check pass encodes with while a DP release of the named columns is
    pending: their values outside the drafted lists (an `other` category) and their missing
    cells (a missing flag) pass, as `check_values` lets them pass in memory; the rest, and
    every number and time, is checked as always."""
    for name in names:
        column = next(c for c in schema.columns if c.name == name)
        if column.type == "categorical":
            other = OTHER
            while other in column.categories:
                other += "*"
            column = replace(column, categories=(*column.categories, other), other=other)
        elif column.is_numeric or column.type == "boolean":
            column = replace(column, missing=True)
        schema = schema.replace_column(column)
    return schema


def open_table_source(
    spec: DataInput,
    schema: Schema,
    engine: EngineChoice,
    budget: int | None,
    dataset_id: str | None,
    on_pass: PassCallback | None = None,
    pending: Sequence[str] = (),
    workers: int | None = None,
    ahead: FirstCounts | None = None,
) -> TableSource:
    """The source on its engine after the check pass (DataError for a bad file or cell; the
    `pending` columns, which a DP release is about to replace, checked as `pending_schema`
    says), counted by `workers` (None: the engine's default); with no `pending` column, the
    check pass also counts the marginals `ahead` plans, and with some, the release's first
    round (see the module)."""
    files = table_files(spec)
    rows = None
    if files.kind == "parquet":
        header, rows = parquet_rows(files)  # every footer checked before any row is read
        check_header(RawTable(header, tuple(np.empty(0, object) for _ in header), spec), schema)
    # the check pass encodes under any binning: a bad cell fails whatever the bins
    checked = pending_schema(schema, pending)
    encoder = chunk_encoder(checked, schema_domain(checked, 2, False))
    counter = open_counter(engine, files, encoder, None, budget or memory_budget(), workers)
    counter.on_pass = on_pass
    # The reservation needs what this pass gives (N sets the default δ and the plan; the keyed
    # fingerprint of its digest composes the earlier spends on these rows under the budget
    # cap), so it is made first; the counting needs only the trainer's binning and marginals,
    # which public facts give (`first_counts`), so this pass counts them too when it can. Their
    # exact counts wait in the counter until the trainer asks, after the reservation.
    try:
        planned = ahead(checked, rows) if ahead is not None and not pending else None
        first = None
        if planned is not None:
            first = Ahead(chunk_encoder(checked, planned[0]), tuple(planned[1]))
        round_1 = None
        if pending:  # the release's first round: exact counts of the rows as read
            round_1 = (RELEASE_ROUND_1, partial(count_ranges, columns=release_columns(schema)))
        digest = counter.scan(first, round_1)
    except BaseException:
        counter.close()
        raise
    canonical = parse_spec(spec).canonical
    return TableSource(
        schema, canonical, files.kind, digest, dataset_id or canonical, counter, engine.spec
    )
