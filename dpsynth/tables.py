"""A table for training: its schema made public (declared or released with DP), then encoded.

A schema entry read off the private data (`"source": "data ..."`, as `dpsynth data schema`
drafts it) is not public. `train` refuses it (exit 2) unless the user
- passes `--schema-public`: the entries are declared public (the user's statement, recorded in
  the run's schema), or
- passes `--schema-epsilon E`: they are released through `privacy.histograms` (noisy, for
  category lists thresholded, histograms), recorded in the ledger as a spend of their own
  before training; the training run's plan then composes it as a prior spend, so that
  `--epsilon` stays the data set's total.
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
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from dpsynth.data.images import DataInfo
from dpsynth.data.schema import Column, Schema, read_schema
from dpsynth.data.sources import read_table
from dpsynth.data.tabular import (
    RawTable,
    TableData,
    check_header,
    check_values,
    encode_table,
    table_content_digest,
)
from dpsynth.errors import UsageError
from dpsynth.ledger import Ledger
from dpsynth.privacy.accounting import compose_epsilon
from dpsynth.privacy.histograms import (
    ClassWeightsPlan,
    plan_class_weights_release,
    plan_histogram_release,
    release_class_weights,
    release_schema_statistics,
)
from dpsynth.privacy.randomness import PrivateRandomness

PUBLIC_SOURCE = "declared public by the user (--schema-public)"
OTHER = "(other)"

# Called with a provisional public description and the release's events before anything is
# spent, so that a training plan that could not fit after the release fails first.
PlanCheck = Callable[[DataInfo, tuple[dict[str, Any], ...]], None]


def resolve_schema(spec: str, schema_path: Path | str | None) -> tuple[RawTable, str, str, Schema]:
    """The table as read, its canonical spec and kind, and the schema to use (given or bundled)."""
    raw, parsed, bundled = read_table(spec)
    if schema_path is not None:
        schema = read_schema(schema_path)
    elif bundled is not None:
        schema = bundled
    else:
        raise UsageError(
            f"{spec}: a csv: table needs --schema FILE.json "
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


def check_public(schema: Schema, schema_public: bool, schema_epsilon: float | None) -> None:
    """UsageError (exit 2) for data-derived entries that are neither declared nor released."""
    if schema_public and schema_epsilon is not None:
        raise UsageError("--schema-public and --schema-epsilon exclude each other")
    derived = schema.data_derived()
    if schema_epsilon is not None:
        if not derived:
            raise UsageError("--schema-epsilon: the schema has no entry read off the data")
        if schema.target in derived:
            raise UsageError(
                f"the target {schema.target!r}'s category list is the label set: declare it "
                "public (review it and delete its 'source' mark); --schema-epsilon releases "
                "the other columns"
            )
        return
    if derived and not schema_public:
        shown = ", ".join(derived[:6]) + (" …" if len(derived) > 6 else "")
        raise UsageError(
            f"the schema's bounds or categories of {len(derived)} column(s) ({shown}) were read "
            "off the data and are not private: review and replace them (then delete their "
            "'source' mark), or pass --schema-public to declare them public, or --schema-epsilon "
            "E to release them with DP"
        )


def prepare_table(
    *,
    spec: str,
    schema_path: Path | str | None,
    schema_public: bool,
    schema_epsilon: float | None,
    dataset_id: str | None,
    ledger: Ledger,
    delta_for: Callable[[int], float],
    target_epsilon: float,
    method_name: Callable[[], str],
    run_id: str,
    randomness: PrivateRandomness,
    plan_check: PlanCheck,
    class_weights_epsilon: float | None = None,
) -> tuple[TableData, dict[str, Any] | None]:
    """The encoded table under a public schema, and the release's record (or None).

    Nothing is spent unless `--schema-epsilon` or `--class-weights-epsilon` is given, and then
    only after the release(s) and the training plan after them were checked to fit under
    `target_epsilon`; both releases go into one ledger entry (one event each).
    """
    raw, canonical, kind, schema = resolve_schema(spec, schema_path)
    check_public(schema, schema_public, schema_epsilon)
    check_class_weights(schema, schema_public, class_weights_epsilon)
    if schema_public:
        schema = schema.with_source(schema.data_derived(), PUBLIC_SOURCE)
        if schema.target_column.weights_derived:
            schema = schema.replace_column(
                replace(schema.target_column, weights_source=PUBLIC_SOURCE)
            )
    dataset = dataset_id or canonical
    spent = sum(e for e in (schema_epsilon, class_weights_epsilon) if e is not None)
    if not spent:
        return encode_table(raw, schema, canonical, kind, dataset), None
    flags = " + ".join(
        flag
        for flag, value in (
            ("--schema-epsilon", schema_epsilon),
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
    delta = delta_for(raw.n)
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
    provisional = _provisional(raw, drafted, canonical, kind, dataset, fingerprint)
    schema, release = _release(
        raw, schema, schema_epsilon, delta, dataset, fingerprint, ledger, method_name, run_id,
        randomness, lambda events: plan_check(provisional, events), weights_plan,
    )  # fmt: skip
    return encode_table(raw, schema, canonical, kind, dataset), release


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
    raw: RawTable,
    schema: Schema,
    epsilon: float | None,
    delta: float,
    dataset: str,
    fingerprint: str,
    ledger: Ledger,
    method_name: Callable[[], str],
    run_id: str,
    randomness: PrivateRandomness,
    check: Callable[[tuple[dict[str, Any], ...]], None],
    weights_plan: ClassWeightsPlan | None = None,
) -> tuple[Schema, dict[str, Any]]:
    derived = (
        [schema.columns[[c.name for c in schema.columns].index(n)] for n in schema.data_derived()]
        if epsilon is not None
        else []
    )
    categorical = [c for c in derived if c.type == "categorical"]
    numeric = [c for c in derived if c.is_numeric]
    plan = (
        plan_histogram_release(epsilon, delta, len(derived), len(categorical))
        if epsilon is not None
        else None
    )
    events = (*(plan.events if plan else ()), *(weights_plan.events if weights_plan else ()))
    check(events)  # the training run must still fit after these spends
    entry = ledger.reserve(
        dataset_id=dataset,
        fingerprint=fingerprint,
        command="schema-release",
        method=method_name(),
        run_id=run_id,
        events=list(events),
        delta=delta,
        max_total_epsilon=None,
    )
    try:
        categories: dict[str, list[str]] = {}
        bounds: dict[str, tuple[float, float] | None] = {}
        if plan is not None:
            categories, bounds = release_schema_statistics(
                {c.name: raw.column(c.name) for c in categorical},
                {c.name: raw.column(c.name).astype(float) for c in numeric},
                plan,
                randomness.generator("schema/release"),
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
    source = f"released with DP (--schema-epsilon {epsilon or 0:g}, ledger seq {entry['seq']})"
    warnings = []
    for column in categorical:
        kept = categories[column.name]
        other = OTHER
        while other in kept:
            other += "*"
        schema = schema.replace_column(
            replace(column, categories=(*kept, other), other=other, source=source)
        )
    for column in numeric:
        found = bounds[column.name]
        if found is None:
            warnings.append(
                f"column {column.name!r}: no histogram bin cleared the noise threshold; its "
                "bounds are set to [0, 0] (every value becomes 0): declare public bounds instead"
            )
            found = (0.0, 0.0)
        low, high = found
        if column.type == "integer":
            low, high = float(math.ceil(low)), float(math.floor(high))
            high = max(high, low)
        schema = schema.replace_column(replace(column, min=low, max=high, source=source))
    record: dict[str, Any] = {
        "ledger_seq": entry["seq"],
        "released_columns": [c.name for c in derived],
        **(plan.to_json() if plan is not None else {}),
        "warnings": warnings,
    }
    if weights_plan is not None:
        record["class_weights"] = {**weights_plan.to_json(), "weights": list(weights or ())}
        # the entry's ε: both releases composed (one event each)
        record["epsilon"] = compose_epsilon(events, delta).epsilon
        record["delta"] = delta
        record["events"] = [dict(e) for e in events]
    return schema, record


def new_run_id() -> str:
    """A fresh run id (shared by the schema release and the training spend of one run)."""
    return uuid.uuid4().hex[:12]


def column_of(schema: Schema, name: str) -> Column:
    """The named column."""
    return next(c for c in schema.columns if c.name == name)
