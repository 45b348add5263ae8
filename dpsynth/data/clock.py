"""Times of day written as HHMM integers (flight schedules, shift logs: 517 is 05:17).

Such a column is an `integer` column with `"clock": "hhmm"` in its schema. Inside dpsynth its
values are minutes since midnight (0–1440; 2400, the end of the day, is 1440), so its bins,
ranges and generated values lie on a real clock: a value decoded from the model is written
back as a valid HHMM (never 1275 for 12:75). A cell that is not a time of day in HHMM is a
data error naming its row, as any cell that does not fit its schema.
"""

from __future__ import annotations

import re

import numpy as np

from dpsynth.data.schema import MINUTES_PER_DAY, Column
from dpsynth.errors import DataError

# A column name that says it holds a time of day (the draft also needs every value to be an
# HHMM time, and some past 01:00, before it types a column as a clock).
_CLOCK_NAME = re.compile(r"(^|[_\W])(time|hhmm|clock)($|[_\W])|time$|^time", re.IGNORECASE)
# Durations are minutes, not times of day (nycflights13's `air_time`).
_DURATION_NAME = re.compile(r"air|duration|elapsed|spent|length", re.IGNORECASE)


def _valid_hhmm(values: np.ndarray) -> np.ndarray:
    """True where a float is a whole HHMM time of day from 0 (00:00) to 2400 (24:00)."""
    whole = np.isfinite(values) & (values == np.round(values))
    hours, minutes = np.divmod(np.where(whole, values, 0.0), 100.0)
    in_day = (values >= 0) & (hours <= 24) & (minutes < 60) & ((hours < 24) | (minutes == 0))
    return whole & in_day


def hhmm_to_minutes(values: np.ndarray, column: Column, source: str) -> np.ndarray:
    """Minutes since midnight of HHMM floats (NaN, a missing cell, stays NaN); DataError
    (exit 4) naming the first cell that is not a time of day."""
    present = ~np.isnan(values)
    bad = np.flatnonzero(present & ~_valid_hhmm(values))
    if len(bad):
        row = int(bad[0])
        raise DataError(
            f"{source}: column {column.name!r} is a clock (HHMM) but row {row + 2} holds "
            f'{values[row]:g}, which is not a time of day; fix the cell, or remove "clock" '
            "from the column's schema"
        )
    return minutes_or_nan(values)


def minutes_or_nan(values: np.ndarray) -> np.ndarray:
    """Minutes since midnight of HHMM floats, NaN where a value is not a time of day (the
    evaluation's lenient reading of any table, synthetic or real)."""
    hours, minutes = np.divmod(values, 100.0)
    return np.where(_valid_hhmm(values), hours * 60.0 + minutes, np.nan)


def minutes_to_hhmm(minutes: np.ndarray) -> np.ndarray:
    """HHMM floats of whole minutes since midnight in [0, 1440] (NaN stays NaN)."""
    clipped = np.clip(np.rint(minutes), 0, MINUTES_PER_DAY)
    hours, rest = np.divmod(clipped, 60.0)
    return hours * 100.0 + rest


def looks_like_clock(name: str, values: np.ndarray) -> bool:
    """True when a whole-number column reads as HHMM times of day: its name says time
    (`dep_time`, `sched_arr_time`, `hhmm`; not a duration such as `air_time`), every value is
    a time of day in HHMM, and some lie past 01:00 (so small counts are not taken for times)."""
    if not _CLOCK_NAME.search(name) or _DURATION_NAME.search(name):
        return False
    present = values[~np.isnan(values)]
    return bool(len(present)) and bool(_valid_hhmm(present).all()) and present.max() >= 100
