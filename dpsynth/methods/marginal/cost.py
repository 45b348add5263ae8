"""AIM's training time on the project's 2-core CPU, estimated from public facts only.

`--method auto` must not pick a backend that will not finish in reasonable time, and AIM's
time grows with the table: reading it (N × d values), the exact counts of every candidate
pair (N rows each), the selections (every open candidate scored against the model), and the
estimation, whose every step passes messages over every cell of the junction tree. The
model's size is capped by the preset (`max_model_mb`, reached linearly over the rounds), so the
estimation is bounded by steps × cap whatever the columns; the rest grows with N and d².

The constants were measured on census at ε = 10 (199,523 rows, 41 attributes, 820 candidate
pairs, the `small` preset; 2026-11-28, bench/results/2026-11-23-tuning-logs/tuning-tables.md),
rounded up: it trained in 92–103 s at a load of 1–2 (earlier runs and
bench/results/2026-11-28-tables-speed/tables-speed-2026-11-28.json) and this rule gives it
129 s. The estimate is an upper bound on the estimation (the cap is rarely reached on small
tables: german-credit at ε = 1 trains in seconds where this says about 2 minutes), never a
measurement.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

# Seconds per unit of work, with their census measurement.
READ_S_PER_VALUE = 2.5e-6  # reading and encoding the CSV: 8.2M values in about 20 s
COUNT_S_PER_ROW_PAIR = 3e-8  # the exact counts of a candidate pair: 820 pairs in about 5 s
SELECT_S_PER_CANDIDATE = 1e-5  # one selection: one candidate's score and tree growth
SCORE_S_PER_CELL = 1e-8  # a round's estimates: per model cell, attribute and value
STEP_S_PER_CELL = 8e-8  # one estimation step over one cell: 54–84 ns measured (load 1–5)


def aim_seconds(
    sizes: Sequence[int],
    n: int,
    pairs: int,
    selections: int,
    rounds: int,
    model_cells: float,
    iters: int,
    final_iters: int,
) -> float:
    """The estimated training seconds of an AIM run on this public schedule: `sizes` the
    attributes' domain sizes, `n` the records, `pairs` the candidate pairs, `selections` and
    `rounds` the plan's, `model_cells` the cap on the junction tree's cells (reached linearly
    over the rounds, and never above the cells of the full table), and the preset's
    estimation steps per round and at the end."""
    d = len(sizes)
    seconds = n * d * READ_S_PER_VALUE + n * pairs * COUNT_S_PER_ROW_PAIR
    seconds += selections * pairs * SELECT_S_PER_CANDIDATE
    one_ways = float(sum(sizes))
    seconds += (iters if rounds else final_iters) * one_ways * STEP_S_PER_CELL
    mean_size = one_ways / max(d, 1)
    joint = float(math.prod(sizes))  # no junction tree is larger than the full table
    previous = one_ways
    for r in range(1, rounds + 1):
        cells = max(min(model_cells * r / rounds, joint), one_ways)
        seconds += previous * d * mean_size * SCORE_S_PER_CELL  # scored on the last model
        seconds += (final_iters if r == rounds else iters) * cells * STEP_S_PER_CELL
        previous = cells
    return seconds
