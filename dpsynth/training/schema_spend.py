"""Spending a table's planned DP releases: the schema entries, the target's class weights and
a privacy unit's rows-per-unit histogram, in one ledger entry reserved before the read. The
schema entries' release runs on the rows in memory, or on an engine's passes
(`training.engine_release`: a `ReleaseRun` given to `spend_release`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch

from dpsynth.data.column_values import RELEASED_PREFIX
from dpsynth.data.schema import Schema
from dpsynth.ledger import Ledger
from dpsynth.privacy.accounting.compose import compose_epsilon
from dpsynth.privacy.mechanisms.histograms import release_class_weights
from dpsynth.privacy.mechanisms.randomness import PrivateRandomness
from dpsynth.privacy.releases.unit_sizes import release_unit_sizes
from dpsynth.training.schema_counting import release_in_memory
from dpsynth.training.table_units import rows_with_labels, unit_sizes

if TYPE_CHECKING:
    from dpsynth.privacy.releases.schema_plan import SchemaReleasePlan
    from dpsynth.training.schema_entries import AppliedRelease, ReleaseColumns
    from dpsynth.training.table_input import TableInput

# The schema entries' release on some rows: (schema, columns, plan, generator, source) → the
# applied release (`schema_entries.apply_release` on the counts of whatever reads the rows).
ReleaseRun = Callable[
    ["Schema", "ReleaseColumns", "SchemaReleasePlan", torch.Generator, str], "AppliedRelease"
]


def spend_release(
    table: TableInput,
    ledger: Ledger,
    method: str,
    run_id: str,
    randomness: PrivateRandomness,
    run: ReleaseRun | None = None,
) -> tuple[Schema, dict[str, Any]]:
    """Spend the table's planned releases in one ledger entry (command `schema-release`) and
    run them on `table.raw` (bounded per unit already), or the schema entries' release with
    `run` (an engine's passes): the schema with the released entries (and weights), and the
    release's record for config.json."""
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
            if run is None:
                applied = release_in_memory(raw, schema, columns, plan, generator, source)
            else:
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
        record["one_ways"] = one_way_record(applied)
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
