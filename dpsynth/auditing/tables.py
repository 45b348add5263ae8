"""The public description of a table for `dpsynth audit`: its schema and N, never its rows.

A built-in table gives its bundled schema (or `--schema`) and its documented size; a `csv:`
file needs `--schema FILE` and gives N, the number of its records, counted without keeping any
value (N is public in dpsynth's model, as `train` and the ledger treat it).
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

from dpsynth.data.builtin_tables import TABLE_BUILTINS
from dpsynth.data.csvfile import CheckedText
from dpsynth.data.images import DataInfo
from dpsynth.data.schema import Schema
from dpsynth.data.schema_file import read_schema
from dpsynth.data.sources import parse_spec
from dpsynth.data.table_codec import TableCodec
from dpsynth.errors import UsageError

__all__ = ["is_table_data", "table_info"]


def is_table_data(data: str) -> bool:
    """True for a built-in table or a `csv:` spec."""
    return data in TABLE_BUILTINS or data.startswith("csv:")


def _record_count(path: Path, name: str) -> int:
    """The number of records of a CSV file after its header (blank lines do not count)."""
    with CheckedText(path, name) as raw:
        text = io.TextIOWrapper(io.BufferedReader(raw), encoding="utf-8", newline="")
        rows = sum(1 for row in csv.reader(text) if row)
    return max(rows - 1, 0)


def table_info(data: str, schema_path: str | None = None) -> DataInfo:
    """The public description (N, the encoded width, classes, schema) of a table to audit."""
    schema: Schema | None = read_schema(schema_path) if schema_path else None
    if data in TABLE_BUILTINS:
        table = TABLE_BUILTINS[data]
        schema = schema or table.schema()
        n = table.n_train
    elif data.startswith("csv:"):
        if schema is None:
            raise UsageError(f"--data {data}: a csv: table needs --schema FILE.json")
        parsed = parse_spec(data)
        path = Path(parsed.target)
        if not path.is_file():
            raise UsageError(f"--data {data}: no such file")
        n = _record_count(path, parsed.given)
    else:
        raise UsageError(f"--data {data}: not a table (a built-in table or csv:PATH)")
    codec = TableCodec(schema)
    return DataInfo(
        spec=data,
        kind="builtin" if data in TABLE_BUILTINS else "csv",
        n=n,
        shape=(codec.dim,),
        classes=tuple(schema.classes),
        fingerprint="audit:public-description",
        dataset_id=f"audit:{data}",
        modality="table",
        schema=schema.to_json(),
    )
