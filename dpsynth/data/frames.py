"""A pandas DataFrame in memory as a table: read as its Arrow table, the way a Parquet file is.

`Synthesizer.fit(frame)` and `dpsynth.train(data=frame)` train on the frame itself: nothing is
written to disk. The frame becomes the same `RawTable` of stripped strings that a Parquet file
holding it would give (`dpsynth.data.parquetfile.read_arrow_batches`: null and NaN are missing
cells, floats their shortest exact text, booleans "true"/"false", timestamps ISO text), so a
schema drafted from the frame, its encoding and its content digest are those of
`frame.to_parquet(FILE)` read as `parquet:FILE`. The index is not a column (reset it first to
keep it).

A frame has no path: its spec is `FRAME` ("dataframe"), its default dataset id in the ledger,
and a run trained on one cannot be resumed from a spec (the rows are nowhere to read again).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dpsynth.errors import DataError, UsageError

if TYPE_CHECKING:
    import pandas as pd

    from dpsynth.data.csvtable import RawTable
    from dpsynth.data.schema import Schema

FRAME = "dataframe"
"""The canonical spec and default dataset id of a table given as a pandas DataFrame."""
FRAME_NAME = "the DataFrame"  # how errors name it


def is_frame(data: Any) -> bool:
    """True for a pandas DataFrame (without importing pandas for a spec string)."""
    if isinstance(data, str | bytes) or data is None:
        return False
    import pandas as pd

    return isinstance(data, pd.DataFrame)


def refuse_frame_spec(text: str) -> None:
    """UsageError for the spec a frame's run recorded, read back as if it were a path."""
    if text == FRAME:
        raise UsageError(
            f"{text!r}: this run was trained on a pandas DataFrame in memory; its rows are "
            "not on disk to read again (train again from the frame, or from a csv: or "
            "parquet: file)"
        )


def read_frame(frame: pd.DataFrame, schema: Schema | None = None) -> RawTable:
    """The frame's rows as stripped strings, as a Parquet file of it would read (DataError for
    a column Arrow cannot type, naming it). `schema` gives time columns their formats."""
    import pyarrow as pa

    from dpsynth.data.parquetfile import ROWS_PER_BATCH, read_arrow_batches

    try:
        table = pa.Table.from_pandas(frame, preserve_index=False)
    except (pa.ArrowException, TypeError, ValueError) as exc:
        raise DataError(f"{FRAME_NAME}: {_column_problem(frame) or exc}") from None
    batches = table.to_batches(max_chunksize=ROWS_PER_BATCH)
    return read_arrow_batches(table.schema, batches, table.num_rows, FRAME_NAME, schema)


def _column_problem(frame: pd.DataFrame) -> str | None:
    """What keeps the first unconvertible column from one Arrow type (mixed values)."""
    import pyarrow as pa

    for name in frame.columns:
        try:
            pa.array(frame[name], from_pandas=True)
        except (pa.ArrowException, TypeError, ValueError) as exc:
            detail = str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__
            return (
                f"column {str(name)[:60]!r} mixes values of several types ({detail}); cast it "
                "to one type (e.g. frame[col].astype(str)) first"
            )
    return None
