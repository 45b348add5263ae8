"""Before any spend, which columns `train`'s default DP schema release would lose, and what
would keep them (`dpsynth data schema`, on the owner's terminal only).

The release's noise and thresholds are public (N, the columns, ε, δ); which values clear them
depends on the rows. `data schema` reads the rows anyway (it drafts from them), so it can tell
the owner, before anything is spent, that at `--epsilon E` a category list would keep none of
its values (every cell '(other)'), a target would keep fewer than two labels (the run would
stop), or a number's range would not clear (written empty, or over a crude range guessed
from the noise where its present count clears), and the smallest `--schema-epsilon`
at which the column's commonest value or fullest range bin would clear. These are counts of the
private rows: they go to the terminal, never into the schema or any file.
"""

from __future__ import annotations

import math

import numpy as np

from dpsynth.data.column_values import column_numbers, missing_mask
from dpsynth.data.csvtable import RawTable
from dpsynth.data.schema import Schema
from dpsynth.privacy.accounting.calibration import default_delta
from dpsynth.privacy.mechanisms.histograms import category_counts, numeric_counts
from dpsynth.privacy.releases.schema_grids import range_grid
from dpsynth.privacy.releases.schema_ranges import LAST_RESORT_SHARE, last_resort_rows
from dpsynth.privacy.releases.schema_reach import epsilon_for_reach
from dpsynth.privacy.releases.schema_spans import FALSE_ALARM, coarse_span
from dpsynth.training.schema_entries import number_spec, plan_release, release_columns
from dpsynth.training.table_schema import REUSED_SCHEMA_SHARE


def losses_at(raw: RawTable, schema: Schema, epsilon: float) -> list[str]:
    """One line per column the default release at `--epsilon epsilon` would lose (empty when
    none, or nothing is released): what is lost and the `--schema-epsilon` that keeps it."""
    columns = release_columns(schema)
    if not columns.names:
        return []
    rows, delta = raw.n, default_delta(raw.n)
    _, plan = plan_release(schema, rows, REUSED_SCHEMA_SHARE * epsilon, delta)
    lines: list[str] = []
    for column in columns.categorical:
        values = np.asarray(raw.column(column.name), dtype=object)
        _, counts = category_counts(values)
        target = column.name == schema.target
        cut = plan.target_threshold if target and plan.target_threshold else plan.category_threshold
        kept = int((counts > cut).sum())
        if target and kept < 2:
            lost = f"the target keeps {kept} label(s) of {len(counts)}: the run would stop"
        elif not target and kept == 0:
            lost = f"none of its {len(counts):,} values: every cell '(other)'"
        else:
            continue
        need = np.sort(counts)[-2] if target and len(counts) > 1 else counts.max()
        lines.append(_line(column.name, lost, _keeps(columns, schema, rows, delta, need)))
    for column in columns.numbers:
        numbers = column_numbers(raw, column, lenient=True)
        present = numbers[np.isfinite(numbers)]
        counts = numeric_counts(present, range_grid(column.type))
        fullest = counts.max() if len(present) else 0.0
        # the release's own rules, read on the exact counts (an estimate, not the release):
        # a bin over the cut, or the windows its last resort reads at the false-alarm rate,
        # at the noise of round 2's second look (round 1's and its readings combined)
        std = plan.second_look_noise_std
        cut = plan.range_cut(column.type, std=std)
        weak = len(present) > LAST_RESORT_SHARE * rows  # what the weak spans need
        if fullest > cut or (weak and coarse_span(counts, std, FALSE_ALARM)):
            continue
        share = 1.0 - float(missing_mask(raw.column(column.name)).mean())
        # the last resort: a range guessed from the noise where the present count clears
        guessed = len(present) > last_resort_rows(rows, std)
        fate = "its values drawn over a crude range guessed from the noise"
        fate = fate if guessed else "written empty"
        lost = f"its range may not clear (values in {share:.0%} of rows): {fate}"
        lines.append(_line(column.name, lost, _keeps(columns, schema, rows, delta, fullest)))
    return lines


def _keeps(columns, schema: Schema, rows: int, delta: float, count: float) -> float:
    """The schema ε at which a value or bin held by `count` rows clears (inf: none does)."""
    if count <= 0:
        return math.inf
    return epsilon_for_reach(
        float(count),
        delta,
        rows,
        len(columns.categorical),
        {c.name: number_spec(c) for c in columns.numbers},
        len(columns.booleans),
        target=any(c.name == schema.target for c in columns.categorical),
    )


def _line(name: str, lost: str, needed: float) -> str:
    keep = (
        f"--schema-epsilon {needed:.2g} keeps it"
        if math.isfinite(needed)
        else "no schema ε keeps it at this size"
    )
    return f"{name}: {lost}; {keep}, or declare its list or bounds public"
