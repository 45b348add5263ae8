"""Generated rows before their cells are written: `CodedRows`, and the one decoding of them
into a typed frame that every table output shares.

A batch of generated rows reaches the writers as `CodedRows`: per feature column either the
index of its level (a categorical or boolean column, into `Column.levels`) or its number on the
encoding's scale [-1, 1] with the rows where it is missing, and the labels (indices into the
classes). `TableCodec.coded` makes them from encoded rows (each one-hot block sampled as a
distribution); a generator that draws discrete codes (aim, mst: `CodedSampler`) makes them
itself, with no one-hot rows in between. `coded_frame` turns them into the frame
`TableCodec.decode` returns (the CSV's columns, typed), and `sampling.arrow_rows` into Arrow
record batches; both take a number's value from `decoded_numbers`, so a cell is the same
whichever output writes it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np
import pandas as pd

from dpsynth.data.clock import minutes_to_hhmm
from dpsynth.data.schema import Column, Schema
from dpsynth.data.timecols import time_series


@dataclass(frozen=True)
class CodedRows:
    """A batch of generated rows, column by column (see the module docstring).

    `levels`: a categorical or boolean column's level indices [b] (ints); `scaled`: a numeric or
    time column's numbers [b] on the encoding's scale (floats, as the encoded row holds them;
    a missing cell's value is ignored); `absent`: [b] bools for the numeric and time columns with
    missing cells; `labels`: [b] class indices. `start` is the release's row number of the
    first row (surrogate keys count on from it) and `keys` the cells of `id` columns given
    instead of surrogate keys (a privacy unit's synthetic people, `sampling.units`).
    """

    labels: np.ndarray
    levels: Mapping[str, np.ndarray]
    scaled: Mapping[str, np.ndarray]
    absent: Mapping[str, np.ndarray]
    start: int = 0
    keys: Mapping[str, np.ndarray] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.labels)


@runtime_checkable
class CodedSampler(Protocol):
    """A table generator that draws `CodedRows` itself (no encoded rows in between)."""

    def sample_coded(self, labels: np.ndarray, rng: np.random.Generator, start: int) -> CodedRows:
        """The rows of `labels` (class indices [b]), drawn with the public `rng`; surrogate
        keys numbered from `start`."""
        ...


def unscale(values: np.ndarray, column: Column) -> np.ndarray:
    """Numbers on the encoding's scale [-1, 1] back into the column's [min, max]: integers
    rounded (and kept inside the bounds' integers), dates to whole days."""
    low, high = float(column.min), float(column.max)  # type: ignore[arg-type]
    out = low + (np.clip(values, -1.0, 1.0) + 1.0) / 2.0 * (high - low)
    if column.type == "integer":
        return np.clip(np.rint(out), np.ceil(low), np.floor(high))
    if column.type == "date":
        return np.clip(np.rint(out / 86400.0) * 86400.0, low, high)
    return out


def decoded_numbers(column: Column, coded: CodedRows) -> np.ndarray:
    """A numeric or time column's cells as float64 (NaN: missing), as every output writes them:
    unscaled (`unscale`), an HHMM clock's minutes back to HHMM, a number rounded to its
    `decimals`; a time column's are seconds since 1970-01-01 UTC."""
    numbers = unscale(np.asarray(coded.scaled[column.name], dtype=np.float64), column)
    absent = coded.absent.get(column.name)
    if absent is not None:
        numbers = np.where(absent, np.nan, numbers)
    if column.type == "integer" and column.clock is not None:
        numbers = minutes_to_hhmm(numbers)  # minutes since midnight back to HHMM
    elif column.type == "numeric" and column.decimals is not None:
        numbers = np.round(numbers, column.decimals)
    return numbers


def surrogate_keys(column: Column, start: int, count: int) -> np.ndarray:
    """An `id` column's fresh keys `<prefix><n>` for rows start+1 … start+count (object)."""
    return np.asarray([f"{column.prefix}{i}" for i in range(start + 1, start + count + 1)], object)


def coded_frame(schema: Schema, coded: CodedRows) -> pd.DataFrame:
    """The rows as a typed frame in the file's header and order: categories as their strings,
    booleans as pandas booleans (missing: <NA>), integers as nullable `Int64`, numbers as
    floats (NaN), dates and times as datetimes in the column's zone, `id` columns as surrogate
    keys (or `coded.keys`), the target from the labels, ignored columns empty."""
    b = len(coded)
    data: dict[str, object] = {}
    for column in schema.columns:
        name = column.name
        if name == schema.target:
            classes = np.asarray(schema.classes, dtype=object)
            data[name] = classes[np.asarray(coded.labels, dtype=np.int64)]
        elif column.type == "ignored":
            data[name] = np.full(b, "", dtype=object)
        elif column.type == "id":
            given = coded.keys.get(name)
            data[name] = given if given is not None else surrogate_keys(column, coded.start, b)
        elif column.is_categorical:
            data[name] = _level_cells(column, coded.levels[name])
        else:
            data[name] = _number_cells(column, decoded_numbers(column, coded))
    return pd.DataFrame(data, columns=[c.name for c in schema.columns])


def _level_cells(column: Column, indices: np.ndarray) -> object:
    levels = np.asarray(column.levels, dtype=object)[np.asarray(indices, dtype=np.int64)]
    if column.type != "boolean":
        return levels
    truth = pd.array(levels == column.categories[1], dtype="boolean")
    truth[levels == ""] = pd.NA
    return truth


def _number_cells(column: Column, numbers: np.ndarray) -> object:
    if column.is_time:
        return time_series(numbers, column)
    if column.type == "integer":
        # NaN becomes <NA> in the nullable float, which then casts to nullable integers
        return pd.array(numbers, dtype="Float64").astype("Int64")
    return numbers
