"""The rows `dpsynth data schema` drafts from: the whole table when it is one file that fits
the memory budget (or a budget too small for DuckDB), else a uniform sample of about
`SAMPLE_ROWS` rows read out of core through DuckDB (each row kept with the same probability,
a fixed public seed). The draft's entries are marked read off the data
either way: a sample's bounds and lists are as private as the whole table's.
"""

from __future__ import annotations

import pyarrow.parquet as pq

from dpsynth.data.csvtable import RawTable
from dpsynth.data.engines.choice import memory_estimate
from dpsynth.data.engines.chunks import footer_rows, parquet_rows, raw_from_batch, table_files
from dpsynth.data.engines.duckdb_engine import MIN_MEMORY_LIMIT
from dpsynth.data.limits import memory_budget
from dpsynth.data.sources import parse_spec, read_table
from dpsynth.errors import DataError

SAMPLE_ROWS = 200_000
_SEED = 20261128  # public: the sample only shapes a draft the owner reviews


def draft_rows(spec: str, budget: int | None = None) -> tuple[RawTable, str | None]:
    """The rows to draft a schema from, and a remark when they are a sample (else None)."""
    if parse_spec(spec).kind == "builtin":
        return read_table(spec)[0], None
    files = table_files(spec)
    budget = budget or memory_budget()
    if files.kind == "parquet" and len(files.paths) == 1:
        rows = footer_rows(files.paths[0])
        if rows is None:  # unreadable: the in-memory reader says why, naming the spec
            return read_table(spec)[0], None
        width = len(pq.read_schema(files.paths[0]).names)
        fits = memory_estimate(files, rows, width) <= budget
    elif files.kind == "parquet":
        rows = parquet_rows(files)[1]  # every footer checked
        fits = False
    else:
        rows, fits = None, memory_estimate(files, None, 1) <= budget
    # below DuckDB's own floor the sample would not fit either: the reader refuses, naming
    # the budget
    if (fits or budget < 2 * MIN_MEMORY_LIMIT) and len(files.paths) == 1:
        return read_table(spec)[0], None
    raw = _sample(files.paths, files.kind, spec, budget)
    total = f" of {rows:,}" if rows is not None else ""
    return raw, f"drafted from a uniform sample of {raw.n:,}{total} rows"


def _sample(paths: tuple[str, ...], kind: str, spec: str, budget: int) -> RawTable:
    """About SAMPLE_ROWS rows, each kept with probability SAMPLE_ROWS / N (a public seed), from
    DuckDB's record batches: memory is one batch and the sample."""
    import duckdb
    import numpy as np
    import pyarrow as pa

    connection = duckdb.connect(":memory:")
    try:
        connection.execute(f"SET memory_limit = '{max(budget // 2, MIN_MEMORY_LIMIT) >> 20}MB'")
        connection.execute("SET threads = 1")
        connection.execute("SET enable_progress_bar = false")  # stdout is the CLI's
        if kind == "parquet":
            source, parameters = "read_parquet(?)", [list(paths)]
        else:
            options = "all_varchar = true, header = true, delim = ',', quote = '\"', escape = '\"'"
            source, parameters = f"read_csv(?, {options})", [paths[0]]
        counted = connection.execute(f"SELECT count(*) FROM {source}", parameters).fetchall()
        share = min(1.0, SAMPLE_ROWS / max(int(counted[0][0]) if counted else 0, 1))
        rng = np.random.default_rng(_SEED)
        kept = []
        relation = connection.sql(f"SELECT * FROM {source}", params=parameters)
        batches = getattr(relation, "to_arrow_reader", None) or relation.record_batch
        for batch in batches(65_536):
            kept.append(batch.filter(pa.array(rng.random(batch.num_rows) < share)))
    except duckdb.Error as exc:
        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
        raise DataError(f"{spec}: DuckDB could not sample it ({first})") from None
    finally:
        connection.close()
    table = pa.Table.from_batches(kept).combine_chunks() if kept else None
    if table is None or table.num_rows < 1:
        raise DataError(f"{spec}: the table has no rows")
    raw = raw_from_batch(table.to_batches()[0], spec, None)
    # the draft reads the columns themselves: text columns expanded from their dictionaries
    return RawTable(raw.header, tuple(raw.column(name) for name in raw.header), spec)
