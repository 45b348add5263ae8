"""A table for training: its schema made public (declared or released with DP), then encoded.

A schema entry read off the private data (`"source": "data ..."`, as `dpsynth data schema`
drafts it) is not public. `train`
- by default releases it with DP (`--schema-epsilon`, SCHEMA_SHARE of `--epsilon` unless given:
  `dpsynth.training.schema_entries`, noisy histograms for category lists, ranges, bin edges, missing
  flags and precision), recorded in the ledger as a spend of its own before training; the
  training run's plan then composes it as a prior spend, so that `--epsilon` stays the data
  set's total;
- or, with `--schema-public`, takes the entries as declared public (the user's statement,
  recorded in the run's schema). That path refuses a category list read off the data that is
  longer than N / 20 (most of its values are held by a few rows each: declaring them public
  would publish them), naming the column and the ways out.
With `--epsilon inf` (a non-private baseline) the entries are used as drafted and marked so.
The target's category list (the label set) follows the rule of every other list: declared
public, or released with DP through the same threshold (a label held by a few rows does not
survive, and its rows are left out of training, never relabelled).
With a privacy unit (`--privacy-unit COLUMN --max-rows-per-unit K`, `training.table_units`)
every unit keeps at most K rows, drawn with secret randomness before any release reads the
table; every release is scaled for K rows, and the rows-per-unit histogram is released too
(`privacy.releases.unit_sizes`, UNIT_SIZES_SHARE of `--epsilon`).
The target's class proportions (`weights`) may be declared, or released with
`--class-weights-epsilon E` through `privacy.histograms.release_class_weights` (a Gaussian
noisy histogram over the public classes, sensitivity 1, no threshold); that release's event
joins the same ledger entry as the schema release (command `schema-release`), spent before
training and composed into its plan, and the released weights are written into the run's
schema as declared ones would be.
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, ClassVar

from dpsynth.data.images import DataInfo
from dpsynth.data.schema import Column, Schema
from dpsynth.data.schema_draft import long_category_lists
from dpsynth.data.schema_file import SchemaInput, as_schema
from dpsynth.data.sources import DataInput, read_table, schema_needed
from dpsynth.data.table_codec import (
    RawTable,
    TableData,
    check_header,
    check_values,
    table_content_digest,
)
from dpsynth.errors import UsageError
from dpsynth.ledger import Ledger
from dpsynth.privacy.accounting.calibration import default_delta
from dpsynth.privacy.mechanisms.contribution import UnitBound
from dpsynth.privacy.mechanisms.histograms import plan_class_weights_release
from dpsynth.privacy.mechanisms.randomness import PrivateRandomness
from dpsynth.privacy.releases.unit_sizes import (
    UNIT_SIZES_SHARE,
    plan_unit_sizes_release,
)
from dpsynth.training.schema_counting import release_in_memory
from dpsynth.training.schema_entries import (
    ReleaseRun,
    check_reach,
    plan_release,
)
from dpsynth.training.table_input import TableInput
from dpsynth.training.table_units import (
    bound_table,
    bounded_rows,
    check_unit_column,
    rows_with_labels,
)

PUBLIC_SOURCE = "declared public by the user (--schema-public)"
NON_PRIVATE_SOURCE = "read off the data (non-private run, --epsilon inf)"
# The share of --epsilon the default schema release spends when --schema-epsilon is not given:
# REUSED_SCHEMA_SHARE for MST and AIM (and `--method auto`, which picks one of them), whose
# 1-way measurements are the release's own histograms (`methods.marginal.one_ways`), so that
# the release takes the budget they would have measured with. Chosen with mst at ε = 1 on
# loans, labor-market, ames and hhs-breaches (two runs each, docs/tables.md): 2-way TVD
# 0.152 / 0.170 / 0.272 / 0.421 at 50%, 0.130 / 0.157 / 0.247 / 0.386 at 70%, 0.125 / 0.147
# / 0.246 / 0.373 at 85%, where the classifiers' ROC-AUC began to fall (hhs-breaches' GB
# 0.74 → 0.69); SCHEMA_SHARE for the methods that learn every column again.
SCHEMA_SHARE = 0.25
REUSED_SCHEMA_SHARE = 0.7


def schema_share(reuses_one_ways: bool) -> float:
    """The default release's share of --epsilon for a method (see REUSED_SCHEMA_SHARE)."""
    return REUSED_SCHEMA_SHARE if reuses_one_ways else SCHEMA_SHARE


def resolve_schema(
    spec: DataInput, schema_path: SchemaInput | None
) -> tuple[RawTable, str, str, Schema]:
    """The table as read, its canonical spec and kind, and the schema to use (given or
    bundled). `schema_path` is a file, or a `Schema` (or its JSON as a dict) in memory."""
    raw, parsed, bundled = read_table(spec)
    if schema_path is not None:
        schema = as_schema(schema_path)
    elif bundled is not None:
        schema = bundled
    else:
        raise schema_needed(parsed)
    check_header(raw, schema)
    return raw, parsed.canonical, parsed.kind, schema


def check_class_weights(
    schema: Schema, schema_public: bool, class_weights_epsilon: float | None
) -> None:
    """UsageError (exit 2) for target weights read off the data and neither declared nor
    released, or for a release of weights the schema already declares public."""
    target = schema.target_column
    if class_weights_epsilon is not None:
        if target.weights is not None and not target.weights_derived:
            raise UsageError(
                f"--class-weights-epsilon: the target {target.name!r} already declares public "
                "'weights'; drop them from the schema to release them with DP instead"
            )
        return
    if target.weights_derived and not schema_public:
        raise UsageError(
            f"the target {target.name!r}'s 'weights' were read off the data and are not "
            "private: replace them with public figures (then delete 'weights_source'), or "
            "pass --schema-public to declare them public, or --class-weights-epsilon E to "
            "release them with DP"
        )


def check_public(
    schema: Schema, schema_public: bool, schema_epsilon: float | None, rows: int
) -> None:
    """UsageError (exit 2) for flags that do not fit the schema, and for a category list read
    off the data that `--schema-public` would publish although most of its values are held by
    a few rows (longer than rows / 20)."""
    if schema_public and schema_epsilon is not None:
        raise UsageError("--schema-public and --schema-epsilon exclude each other")
    derived = schema.data_derived()
    if schema_epsilon is not None:
        if not derived:
            raise UsageError("--schema-epsilon: the schema has no entry read off the data")
        return
    if schema_public:
        for column in long_category_lists(schema, rows):
            raise UsageError(
                f"--schema-public: column {column.name!r} lists {len(column.categories):,} "
                f"categories read off the data for {rows:,} rows (most held by a few rows: "
                "declaring them public would publish them); set its type to 'id' or 'ignored', "
                "make it numeric, or release the list with --schema-epsilon"
            )


def default_schema_epsilon(
    schema: Schema,
    schema_public: bool,
    schema_epsilon: float | None,
    target_epsilon: float,
    share: float = SCHEMA_SHARE,
) -> float | None:
    """The ε of the schema release: the one given, else `share` of a finite --epsilon when
    entries (the target's label set included) were read off the data and not declared public
    (the safe default); None for nothing to release."""
    if schema_epsilon is not None or schema_public or not math.isfinite(target_epsilon):
        return schema_epsilon
    if not schema.data_derived():
        return None
    return share * target_epsilon


def public_marks(
    schema: Schema, schema_public: bool, schema_epsilon: float | None, target_epsilon: float
) -> Schema:
    """The schema with its `source` marks for this run: entries read off the data marked
    non-private (`--epsilon inf`) or declared public (`--schema-public`, the user's statement);
    with a release (`schema_epsilon`), the entries read off the data, the target's label set
    included, keep their marks until the release replaces them."""
    if not math.isfinite(target_epsilon) and schema_epsilon is None and not schema_public:
        schema = schema.with_source(schema.data_derived(), NON_PRIVATE_SOURCE)
    if schema_public:
        schema = schema.with_source(schema.data_derived(), PUBLIC_SOURCE)
        if schema.target_column.weights_derived:
            schema = schema.replace_column(
                replace(schema.target_column, weights_source=PUBLIC_SOURCE)
            )
    return schema


def read_table_input(
    *,
    spec: DataInput,
    schema_path: SchemaInput | None,
    schema_public: bool,
    schema_epsilon: float | None,
    dataset_id: str | None,
    ledger: Ledger,
    delta: float | None,
    public_size: int | None,
    target_epsilon: float,
    class_weights_epsilon: float | None = None,
    unit: UnitBound | None = None,
    share: float = SCHEMA_SHARE,
) -> TableInput:
    """The table under its public schema, every row checked, and the DP release it needs
    planned from public facts (`events`); nothing is spent. δ is `delta`, else the default for
    `public_size` or the row count; every N-derived setting of the release reads `public_size`
    when given, else the row count (after bounding, with a `unit`).

    A release is planned only when `--schema-epsilon` or `--class-weights-epsilon` is given (or
    the safe default applies, or a unit needs its rows-per-unit release), and is refused here
    when it would not leave room for training under `target_epsilon`.
    """
    raw, canonical, kind, schema = resolve_schema(spec, schema_path)
    if unit is not None:
        schema = check_unit_column(raw, schema, unit, builtin=kind == "builtin")
        if not math.isfinite(target_epsilon):
            raise UsageError(
                "{privacy_unit} needs a finite {epsilon}: a unit bounds what a DP release "
                "reads, and --epsilon inf releases nothing with DP",
                parameters=("privacy_unit", "epsilon"),
            )
    check_public(schema, schema_public, schema_epsilon, raw.n)
    check_class_weights(schema, schema_public, class_weights_epsilon)
    given = schema_epsilon is not None
    schema_epsilon = default_schema_epsilon(
        schema, schema_public, schema_epsilon, target_epsilon, share
    )
    schema = public_marks(schema, schema_public, schema_epsilon, target_epsilon)
    table = TableInput(
        raw, schema, canonical, kind, dataset_id or canonical, schema_epsilon, given, unit=unit,
        default_share=share,
    )  # fmt: skip
    unit_epsilon = UNIT_SIZES_SHARE * target_epsilon if unit is not None else None
    spent = sum(e for e in (schema_epsilon, class_weights_epsilon, unit_epsilon) if e is not None)
    if not spent:
        check_values(raw, schema)
        return table
    flags = " + ".join(
        flag
        for flag, value in (
            ("--schema-epsilon" if given else "the default --schema-epsilon", schema_epsilon),
            ("--class-weights-epsilon", class_weights_epsilon),
            (f"the rows-per-unit release ({UNIT_SIZES_SHARE:.0%} of --epsilon)", unit_epsilon),
        )
        if value is not None
    )
    if not math.isfinite(target_epsilon):
        raise UsageError(f"{flags} needs a finite --epsilon (the data set's total)")
    if not spent < target_epsilon:
        raise UsageError(
            f"{flags} ({spent:g}) must be below --epsilon {target_epsilon:g} "
            "(the total, training included)"
        )
    # Every row is checked against the schema before anything is spent: after the release
    # only the released columns' lists change (a value outside them falls in '(other)').
    check_values(raw, schema, released=schema.data_derived() if schema_epsilon is not None else ())
    delta = float(delta) if delta is not None else default_delta(public_size or raw.n)
    # keyed under the ledger's secret key: the plain digest would be a membership test
    fingerprint = ledger.data_fingerprint(table_content_digest(raw, schema))
    assert fingerprint is not None
    unit_rows = unit.max_rows if unit is not None else 1
    weights_plan = (
        plan_class_weights_release(class_weights_epsilon, delta, unit_rows)
        if class_weights_epsilon is not None
        else None
    )
    unit_plan = (
        plan_unit_sizes_release(unit_epsilon, delta, unit.max_rows)
        if unit is not None and unit_epsilon is not None
        else None
    )
    drafted = schema
    if weights_plan is not None:  # placeholder weights, so the config is checked with weights
        k = len(schema.classes)
        drafted = schema.replace_column(replace(schema.target_column, weights=(1.0 / k,) * k))
    rows = bounded_rows(raw, unit) if unit is not None else raw.n
    planned_rows = public_size or rows
    release = (
        plan_release(schema, planned_rows, schema_epsilon, delta, unit_rows)
        if schema_epsilon is not None
        else None
    )
    if release is not None:
        check_reach(*release, schema_epsilon, None if given else share)
    provisional = _provisional(raw, drafted, canonical, kind, table.dataset, fingerprint)
    provisional = replace(
        provisional,
        n=rows,
        unit=unit.column if unit is not None else None,
        rows_per_unit=unit_rows,
    )
    return replace(
        table,
        release=release,
        weights_plan=weights_plan,
        unit_plan=unit_plan,
        delta=delta,
        fingerprint=fingerprint,
        provisional=provisional,
    )


@dataclass(frozen=True)
class RowsInMemory:
    """The memory engine (a `table_prepare.TableEngine`): the rows held, as read
    (`read_table_input`), counted by the release on its own (`schema_counting`), and encoded
    under the released schema afterwards. With a unit, every unit is first bounded to its K
    rows (secret randomness), and every release and the training read only those."""

    read: TableInput  # the table as read: the content digest always names every row read
    name: ClassVar[str] = "memory"
    rows_in_memory: ClassVar[bool] = True

    def for_release(self, table: TableInput, randomness: PrivateRandomness) -> TableInput:
        """The rows the releases read: each unit bounded to its K rows."""
        if table.unit is None:
            return table
        return replace(table, raw=bound_table(table.raw, table.unit, randomness))

    def release_run(self, table: TableInput) -> ReleaseRun:
        """The schema entries' release on the rows held."""
        return partial(release_in_memory, table.raw)

    def released(self, table: TableInput, schema: Schema) -> TableData:
        """The released rows encoded under the released schema (a row whose label did not
        clear the label set's release is left out, never relabelled)."""
        raw = rows_with_labels(table.raw, schema.target, schema.classes)
        return self.read.encoded(raw, schema)

    def close(self) -> None:
        """Nothing to release: the rows are held."""


def _provisional(
    raw: RawTable, schema: Schema, spec: str, kind: str, dataset: str, fingerprint: str
) -> DataInfo:
    """The public description before the release (the encoded width is the drafted one)."""
    width = sum(len(c.categories) if c.type == "categorical" else 1 for c in schema.features)
    shape: Any = (width,)
    return DataInfo(
        spec, kind, raw.n, shape, schema.classes, fingerprint, dataset, "table", schema.to_json()
    )


def new_run_id() -> str:
    """A fresh run id (shared by the schema release and the training spend of one run)."""
    return uuid.uuid4().hex[:12]


def column_of(schema: Schema, name: str) -> Column:
    """The named column."""
    return next(c for c in schema.columns if c.name == name)
