"""Date and time columns: their format guessed from text, parsed to seconds, written back.

Inside dpsynth a time value is a float: seconds since 1970-01-01 UTC (a date: midnight UTC of
its day). A column's `format` is the strftime format of its file and `timezone` the UTC offset
its values carry ("+01:00"), or None for wall times without an offset (kept as they are: read
and written as if UTC, so they come back unchanged). The format may hold `%:z`, an offset
written with a colon ("+01:00"), which Python's strftime before 3.12 lacks.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Sequence

import numpy as np
import pandas as pd
from pandas.tseries.api import guess_datetime_format

from dpsynth.data.schema import MISSING_TOKENS, Column
from dpsynth.errors import DataError

_EPOCH = pd.Timestamp(0, tz="UTC")
_ONE_SECOND = pd.Timedelta(seconds=1)
_TIME_OF_DAY = ("%H", "%I", "%M", "%S", "%f", "%p", "%X", "%T")
_COLON_OFFSET = re.compile(r"[+-]\d\d:\d\d$")
_OFFSET = re.compile(r"([+-])(\d\d):?(\d\d)$")


def is_date_format(fmt: str) -> bool:
    """True when a format has no time of day (the column is a `date`)."""
    return not any(token in fmt for token in _TIME_OF_DAY)


def _parse(values: Sequence[str], fmt: str) -> pd.Series:
    """Parsed values (UTC), NaT where a value does not fit the format."""
    aware = "%z" in fmt or "%:z" in fmt
    series = pd.Series(np.asarray(values, dtype=object))
    parsed = pd.to_datetime(series, format=fmt.replace("%:z", "%z"), errors="coerce", utc=aware)
    if not aware:
        parsed = parsed.dt.tz_localize("UTC")
    return parsed


def guess_time_format(values: Sequence[str]) -> tuple[str, str | None] | None:
    """The (format, timezone) every one of `values` parses with, or None when they are not
    all dates or times of one format. `values` are non-missing stripped strings."""
    if len(values) == 0:
        return None
    sample = str(values[0])
    if not re.search(r"\d", sample) or len(sample) > 40:
        return None
    for dayfirst in (False, True):
        with warnings.catch_warnings():  # pandas warns when a guess is day-first: we try both
            warnings.simplefilter("ignore", UserWarning)
            fmt = guess_datetime_format(sample, dayfirst=dayfirst)
        if fmt is None:
            continue
        if sample.endswith("Z") and fmt.endswith("%z"):
            fmt = fmt[:-2] + "Z"  # a literal Z: UTC, written back as Z
        elif fmt.endswith("%z") and _COLON_OFFSET.search(sample):
            fmt = fmt[:-2] + "%:z"
        if _parse(values, fmt).isna().any():
            continue
        zone = None
        if fmt.endswith("z"):
            match = _OFFSET.search(sample)
            zone = f"{match.group(1)}{match.group(2)}:{match.group(3)}" if match else None
        return fmt, zone
    return None


def time_seconds(values: np.ndarray, column: Column, source: str) -> np.ndarray:
    """A time column's values as seconds (NaN for missing cells); DataError (exit 4) naming
    the first value that does not fit the column's format."""
    strings = np.asarray(values, dtype=object)
    missing = np.isin(strings, list(MISSING_TOKENS))
    fmt = column.format or ("%Y-%m-%d" if column.type == "date" else "ISO8601")
    present = strings[~missing]
    parsed = (
        _parse(present, fmt)
        if fmt != "ISO8601"
        else pd.to_datetime(pd.Series(present), format="ISO8601", errors="coerce", utc=True)
    )
    bad = np.flatnonzero(parsed.isna().to_numpy())
    if len(bad):
        row = int(np.flatnonzero(~missing)[bad[0]])
        raise DataError(
            f"{source}: column {column.name!r} row {row + 2} holds {str(strings[row])[:40]!r}, "
            f"which is not a {column.type} in the format {fmt!r} (fix the cell, or set the "
            "column's 'format')"
        )
    seconds = np.full(len(strings), np.nan)
    seconds[~missing] = ((parsed - _EPOCH) / _ONE_SECOND).to_numpy(dtype=np.float64)
    if column.type == "date":
        seconds = np.floor(seconds / 86400.0) * 86400.0
    return seconds


def time_series(seconds: np.ndarray, column: Column) -> pd.Series:
    """Seconds (NaN: missing) → pandas datetimes: in the column's zone when it has one, else
    naive wall times; a date column's at midnight."""
    values = np.asarray(seconds, dtype=np.float64)
    micros = np.where(np.isfinite(values), np.round(values * 1e6), 0).astype(np.int64)
    stamps = pd.Series(pd.to_datetime(micros, unit="us", utc=True))
    stamps[~np.isfinite(values)] = pd.NaT
    if column.timezone:
        return stamps.dt.tz_convert(column.timezone)
    return stamps.dt.tz_localize(None)


def format_time_series(stamps: pd.Series, column: Column) -> np.ndarray:
    """Datetimes (NaT: missing) → the column's text in its format ("" for missing)."""
    fmt = column.format or ("%Y-%m-%d" if column.type == "date" else "%Y-%m-%dT%H:%M:%S")
    if column.timezone:
        fmt = fmt.replace("%:z", column.timezone).replace("%z", column.timezone.replace(":", ""))
    series = pd.Series(stamps)
    texts = series.dt.strftime(fmt)
    return np.where(series.isna().to_numpy(), "", texts.fillna("").to_numpy(object))
