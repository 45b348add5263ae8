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
The target's category list is the label set and is never released this way: it is declared.
Its class proportions (`weights`) may be declared, or released with `--class-weights-epsilon
E` through `privacy.histograms.release_class_weights` (a Gaussian noisy histogram over the
public classes, sensitivity 1, no threshold); that release's event joins the same ledger entry
as the schema release (command `schema-release`), spent before training and composed into its
plan, and the released weights are written into the run's schema as declared ones would be.
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from dpsynth.data.column_values import RELEASED_PREFIX
from dpsynth.data.images import DataInfo
from dpsynth.data.schema import Column, Schema
from dpsynth.data.schema_draft import long_category_lists
from dpsynth.data.schema_file import read_schema
from dpsynth.data.sources import read_table
from dpsynth.data.table_codec import (
    RawTable,
    TableData,
    check_header,
    check_values,
    encode_table,
    table_content_digest,
)
from dpsynth.errors import UsageError
from dpsynth.ledger import Ledger
from dpsynth.privacy.accounting.calibration import default_delta
from dpsynth.privacy.accounting.compose import compose_epsilon
from dpsynth.privacy.accounting.events import DpEvent
from dpsynth.privacy.mechanisms.histograms import (
    ClassWeightsPlan,
    plan_class_weights_release,
    release_class_weights,
)
from dpsynth.privacy.mechanisms.randomness import PrivateRandomness
from dpsynth.privacy.releases.schema_release import SchemaReleasePlan
from dpsynth.training.schema_entries import (
    ReleaseColumns,
    apply_release,
    check_reach,
    plan_release,
)

PUBLIC_SOURCE = "declared public by the user (--schema-public)"
NON_PRIVATE_SOURCE = "read off the data (non-private run, --epsilon inf)"
# The share of --epsilon the default schema release spends when --schema-epsilon is not given.
SCHEMA_SHARE = 0.25


def resolve_schema(spec: str, schema_path: Path | str | None) -> tuple[RawTable, str, str, Schema]:
    """The table as read, its canonical spec and kind, and the schema to use (given or bundled)."""
    raw, parsed, bundled = read_table(spec)
    if schema_path is not None:
        schema = read_schema(schema_path)
    elif bundled is not None:
        schema = bundled
    else:
        raise UsageError(
            f"{spec}: a {parsed.kind}: table needs --schema FILE.json "
            f"(draft one with `dpsynth data schema {spec} > schema.json` and review it)"
        )
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
        if derived == [schema.target]:
            raise UsageError(
                f"--schema-epsilon: only the target {schema.target!r}'s category list was read "
                "off the data, and the label set is declared, not released: review it and "
                "delete its 'source' mark"
            )
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
    schema: Schema, schema_public: bool, schema_epsilon: float | None, target_epsilon: float
) -> float | None:
    """The ε of the schema release: the one given, else SCHEMA_SHARE of a finite --epsilon
    when entries other than the target's label set were read off the data and not declared
    public (the safe default); None for nothing to release."""
    if schema_epsilon is not None or schema_public or not math.isfinite(target_epsilon):
        return schema_epsilon
    if not [n for n in schema.data_derived() if n != schema.target]:
        return None
    return SCHEMA_SHARE * target_epsilon


def public_marks(
    schema: Schema, schema_public: bool, schema_epsilon: float | None, target_epsilon: float
) -> Schema:
    """The schema with its `source` marks for this run: entries read off the data marked
    non-private (`--epsilon inf`) or declared public (`--schema-public`); the target's label
    set declared whenever the other entries are declared or released (`schema_epsilon`: the
    release's ε after `default_schema_epsilon`, None for none)."""
    if not math.isfinite(target_epsilon) and schema_epsilon is None and not schema_public:
        schema = schema.with_source(schema.data_derived(), NON_PRIVATE_SOURCE)
    if schema_public or schema_epsilon is not None:
        # the target's label set is declared whichever way the other entries go
        schema = schema.with_source([schema.target], PUBLIC_SOURCE)
    if schema_public:
        schema = schema.with_source(schema.data_derived(), PUBLIC_SOURCE)
        if schema.target_column.weights_derived:
            schema = schema.replace_column(
                replace(schema.target_column, weights_source=PUBLIC_SOURCE)
            )
    return schema


@dataclass(frozen=True)
class TableInput:
    """A table read under its public schema, with the DP release of its entries planned but not
    spent (`read_table_input`); `release_table_schema` spends it and encodes the table."""

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

    @property
    def events(self) -> tuple[DpEvent, ...]:
        """The events the release would spend (empty: nothing is released)."""
        return (
            *(self.release[1].events if self.release else ()),
            *(self.weights_plan.events if self.weights_plan else ()),
        )

    def encoded(self) -> TableData:
        """The table encoded under its schema as it stands (nothing released)."""
        return encode_table(self.raw, self.schema, self.spec, self.kind, self.dataset)


def read_table_input(
    *,
    spec: str,
    schema_path: Path | str | None,
    schema_public: bool,
    schema_epsilon: float | None,
    dataset_id: str | None,
    ledger: Ledger,
    delta: float | None,
    public_size: int | None,
    target_epsilon: float,
    class_weights_epsilon: float | None = None,
) -> TableInput:
    """The table under its public schema, every row checked, and the DP release it needs
    planned from public facts (`events`); nothing is spent. δ is `delta`, else the default for
    `public_size` or the row count.

    A release is planned only when `--schema-epsilon` or `--class-weights-epsilon` is given (or
    the safe default applies), and is refused here when it would not leave room for training
    under `target_epsilon`.
    """
    raw, canonical, kind, schema = resolve_schema(spec, schema_path)
    check_public(schema, schema_public, schema_epsilon, raw.n)
    check_class_weights(schema, schema_public, class_weights_epsilon)
    given = schema_epsilon is not None
    schema_epsilon = default_schema_epsilon(schema, schema_public, schema_epsilon, target_epsilon)
    schema = public_marks(schema, schema_public, schema_epsilon, target_epsilon)
    table = TableInput(
        raw, schema, canonical, kind, dataset_id or canonical, schema_epsilon, given
    )  # fmt: skip
    spent = sum(e for e in (schema_epsilon, class_weights_epsilon) if e is not None)
    if not spent:
        check_values(raw, schema)
        return table
    flags = " + ".join(
        flag
        for flag, value in (
            ("--schema-epsilon" if given else "the default --schema-epsilon", schema_epsilon),
            ("--class-weights-epsilon", class_weights_epsilon),
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
    weights_plan = (
        plan_class_weights_release(class_weights_epsilon, delta)
        if class_weights_epsilon is not None
        else None
    )
    drafted = schema
    if weights_plan is not None:  # placeholder weights, so the config is checked with weights
        k = len(schema.classes)
        drafted = schema.replace_column(replace(schema.target_column, weights=(1.0 / k,) * k))
    release = (
        plan_release(schema, raw.n, schema_epsilon, delta) if schema_epsilon is not None else None
    )
    if release is not None:
        check_reach(*release, schema_epsilon, None if given else SCHEMA_SHARE)
    return replace(
        table,
        release=release,
        weights_plan=weights_plan,
        delta=delta,
        fingerprint=fingerprint,
        provisional=_provisional(raw, drafted, canonical, kind, table.dataset, fingerprint),
    )


def release_table_schema(
    table: TableInput, ledger: Ledger, method: str, run_id: str, randomness: PrivateRandomness
) -> tuple[TableData, dict[str, Any] | None]:
    """The encoded table, after spending its planned release (one ledger entry, command
    `schema-release`, one event per release), and the release's record (None: nothing was
    released). The caller checks first that training still fits after `table.events`."""
    if not table.events:
        return table.encoded(), None
    schema, release = _release(table, ledger, method, run_id, randomness)
    if not table.schema_epsilon_given and table.schema_epsilon is not None:
        release["default_share"] = SCHEMA_SHARE  # the safe default, not a flag the user gave
    return replace(table, schema=schema).encoded(), release


def _provisional(
    raw: RawTable, schema: Schema, spec: str, kind: str, dataset: str, fingerprint: str
) -> DataInfo:
    """The public description before the release (the encoded width is the drafted one)."""
    width = sum(len(c.categories) if c.type == "categorical" else 1 for c in schema.features)
    shape: Any = (width,)
    return DataInfo(
        spec, kind, raw.n, shape, schema.classes, fingerprint, dataset, "table", schema.to_json()
    )


def _release(
    table: TableInput, ledger: Ledger, method: str, run_id: str, randomness: PrivateRandomness
) -> tuple[Schema, dict[str, Any]]:
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
    )
    source = f"{RELEASED_PREFIX} (--schema-epsilon {epsilon or 0:g}, ledger seq {entry['seq']})"
    warnings: list[str] = []
    try:
        if planned is not None:
            columns, plan = planned
            schema, warnings = apply_release(
                raw, schema, columns, plan, randomness.generator("schema/release"), source
            )
        weights = None
        if weights_plan is not None:
            weights = release_class_weights(
                raw.column(schema.target),
                schema.classes,
                weights_plan,
                randomness.generator("schema/class-weights"),
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
    if weights_plan is not None:
        record["class_weights"] = {**weights_plan.to_json(), "weights": list(weights or ())}
        # the entry's ε: both releases composed (one event each)
        record["epsilon"] = compose_epsilon(events, delta).epsilon
        record["delta"] = delta
        record["events"] = [e.to_json() for e in events]
    return schema, record


def new_run_id() -> str:
    """A fresh run id (shared by the schema release and the training spend of one run)."""
    return uuid.uuid4().hex[:12]


def column_of(schema: Schema, name: str) -> Column:
    """The named column."""
    return next(c for c in schema.columns if c.name == name)
