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
from dpsynth.data.tabular import RawTable, TableData, check_header, encode_table, table_fingerprint
from dpsynth.errors import UsageError
from dpsynth.privacy.histograms import plan_histogram_release, release_schema_statistics
from dpsynth.privacy.ledger import Ledger
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
    method: str,
    run_id: str,
    randomness: PrivateRandomness,
    plan_check: PlanCheck,
) -> tuple[TableData, dict[str, Any] | None]:
    """The encoded table under a public schema, and the schema release's record (or None).

    Nothing is spent unless `--schema-epsilon` is given, and then only after the release and
    the training plan after it were both checked to fit under `target_epsilon`.
    """
    raw, canonical, kind, schema = resolve_schema(spec, schema_path)
    check_public(schema, schema_public, schema_epsilon)
    if schema_public:
        schema = schema.with_source(schema.data_derived(), PUBLIC_SOURCE)
    dataset = dataset_id or canonical
    release = None
    if schema_epsilon is not None:
        if not math.isfinite(target_epsilon):
            raise UsageError("--schema-epsilon needs a finite --epsilon (the data set's total)")
        if not schema_epsilon < target_epsilon:
            raise UsageError(
                f"--schema-epsilon {schema_epsilon:g} must be below --epsilon {target_epsilon:g} "
                "(the total, training included)"
            )
        fingerprint = table_fingerprint(raw, schema)
        schema, release = _release(
            raw, schema, schema_epsilon, delta_for(raw.n), dataset, fingerprint, ledger, method,
            run_id, randomness, lambda events: plan_check(_provisional(raw, schema, canonical,
                                                  kind, dataset, fingerprint), events),
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
    epsilon: float,
    delta: float,
    dataset: str,
    fingerprint: str,
    ledger: Ledger,
    method: str,
    run_id: str,
    randomness: PrivateRandomness,
    check: Callable[[tuple[dict[str, Any], ...]], None],
) -> tuple[Schema, dict[str, Any]]:
    derived = [
        schema.columns[[c.name for c in schema.columns].index(n)] for n in schema.data_derived()
    ]
    categorical = [c for c in derived if c.type == "categorical"]
    numeric = [c for c in derived if c.is_numeric]
    plan = plan_histogram_release(epsilon, delta, len(derived), len(categorical))
    check(plan.events)  # the training run must still fit after this spend
    entry = ledger.reserve(
        dataset_id=dataset,
        fingerprint=fingerprint,
        command="schema-release",
        method=method,
        run_id=run_id,
        events=list(plan.events),
        delta=delta,
        max_total_epsilon=None,
    )
    try:
        categories, bounds = release_schema_statistics(
            {c.name: raw.column(c.name) for c in categorical},
            {c.name: raw.column(c.name).astype(float) for c in numeric},
            plan,
            randomness.generator("schema/release"),
        )
    except BaseException:
        ledger.abort(entry["seq"], run_id=run_id, fingerprint=fingerprint)
        raise
    ledger.complete(entry["seq"], list(plan.events), run_id=run_id, fingerprint=fingerprint)
    source = f"released with DP (--schema-epsilon {epsilon:g}, ledger seq {entry['seq']})"
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
    record = {
        "ledger_seq": entry["seq"],
        "released_columns": [c.name for c in derived],
        **plan.to_json(),
        "warnings": warnings,
    }
    return schema, record


def new_run_id() -> str:
    """A fresh run id (shared by the schema release and the training spend of one run)."""
    return uuid.uuid4().hex[:12]


def column_of(schema: Schema, name: str) -> Column:
    """The named column."""
    return next(c for c in schema.columns if c.name == name)
