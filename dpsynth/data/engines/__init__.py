"""Counting engines: where a table's marginals are counted (`--engine`).

- `memory`: the table read whole and encoded in memory (today's path; the default for what
  fits);
- `duckdb`: out of core on this machine: DuckDB reads a CSV in record batches, and a Parquet
  source's parts are counted in one process per CPU (`duckdb_engine.py`, `parts.py`);
- `dask://host:port`: a Dask cluster's workers count their parts (`dask_engine.py`);
  `dask+tls://host:port` the same over TLS, with the client's credentials (`DaskTLS`);
- `auto` (the default): memory when the table's estimated in-memory size fits the memory
  budget (`dpsynth.data.limits`), else DuckDB.
Every engine encodes with `dpsynth.data.discrete.codes_from_raw`: the counts, hence the
release for one secret seed, are the same whichever counted them. `choice.py` parses the
flag, resolves `auto` and opens an out-of-core engine's counter.
"""

from __future__ import annotations

from dpsynth.data.engines.base import PassCallback, PassProgress, TableCounter
from dpsynth.data.engines.choice import (
    ENGINES,
    EngineChoice,
    check_workers,
    choose_engine,
    memory_estimate,
    open_counter,
    parse_engine,
    with_tls,
)
from dpsynth.data.engines.chunks import TableFiles, parquet_rows, table_files
from dpsynth.data.engines.dask_tls import DaskTLS

__all__ = [
    "ENGINES",
    "DaskTLS",
    "EngineChoice",
    "PassCallback",
    "PassProgress",
    "TableCounter",
    "TableFiles",
    "check_workers",
    "choose_engine",
    "memory_estimate",
    "open_counter",
    "parquet_rows",
    "parse_engine",
    "table_files",
    "with_tls",
]
