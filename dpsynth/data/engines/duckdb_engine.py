"""The DuckDB engine: a CSV or Parquet source read out of core in Arrow record batches.

DuckDB (embedded, no server) scans the files with a memory limit and a thread count of its
own (`SET memory_limit`, `SET threads`), and hands this process record batches of
`batch_rows` rows; each batch is encoded with the one encoding and its bincounts added, so a
pass holds one batch and the counts, never the table. A CSV is read with every column as text
(the package's own parser's view: a comma, double quotes, a header line); a Parquet source is
a file, a partitioned folder or a glob, its footers checked first (`chunks.parquet_rows`).

A Parquet source's passes do not go through DuckDB's scan: they are cut into parts of whole
row groups (`parts.py`) that `workers` processes (default: this machine's CPUs) read with
pyarrow, keeping the text columns' Parquet dictionaries, and count; the parts' exact sums add
up to the same counts and digest as one process reading every batch would. Measured on the
10M-row table (50 columns, one process): pyarrow with its dictionaries reads a row in a quarter
of DuckDB's time, and DuckDB's text then has to be dictionary-encoded again, which cost as much
as the whole read. DuckDB reads a CSV (one process).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from dpsynth.data.csvtable import RawTable
from dpsynth.data.discrete import ChunkEncoder
from dpsynth.data.engines.base import TableCounter
from dpsynth.data.engines.chunks import TableFiles, raw_from_batch
from dpsynth.data.engines.counting import Clique, CountSums
from dpsynth.data.engines.parts import count_parts, default_workers, fold_parts, parquet_parts
from dpsynth.errors import DataError

BATCH_ROWS = 65_536
# DuckDB's own floor: below this its scans fail rather than spill.
MIN_MEMORY_LIMIT = 64 * 2**20


class DuckDBCounter(TableCounter):
    """Marginal counts of a file source through DuckDB, in bounded memory."""

    engine = "duckdb"

    def __init__(
        self,
        files: TableFiles,
        encoder: ChunkEncoder,
        record_count: int | None,
        memory_limit: int,
        threads: int = 1,
        batch_rows: int = BATCH_ROWS,
        workers: int | None = None,
    ) -> None:
        super().__init__(encoder, record_count)
        self.files = files
        self.memory_limit = max(int(memory_limit), MIN_MEMORY_LIMIT)
        self.threads = max(1, int(threads))
        self.batch_rows = int(batch_rows)
        self.workers = default_workers() if workers is None else max(1, int(workers))

    def count(
        self,
        cliques: Sequence[Clique],
        report: Callable[[int], None],
        digest: bool,
        fold: Callable[[RawTable], Any] | None = None,
    ) -> CountSums:
        """One pass: a Parquet source's parts in `workers` processes (see the module), a
        CSV's DuckDB batches in this one."""
        if self.files.kind != "parquet":
            return super().count(cliques, report, digest, fold)
        parts, name, encoder = parquet_parts(self.files), self.files.name, self.encoder
        return count_parts(parts, encoder, cliques, digest, name, self.workers, report, fold)

    def fold_chunks(
        self, count: Callable[[RawTable], Any], text: tuple[str, ...], report: Callable[[int], None]
    ) -> tuple[Any, int]:
        """One fold pass: a Parquet source's parts in `workers` processes, as `count`'s."""
        if self.files.kind != "parquet":
            return super().fold_chunks(count, text, report)
        parts = parquet_parts(self.files)
        schema, name = self.encoder.schema, self.files.name
        return fold_parts(parts, count, schema, text, name, self.workers, report)

    def _query(self) -> tuple[str, list[object]]:
        paths = list(self.files.paths)
        if self.files.kind == "parquet":
            return "SELECT * FROM read_parquet(?)", [paths]
        options = "all_varchar = true, header = true, delim = ',', quote = '\"', escape = '\"'"
        return f"SELECT * FROM read_csv(?, {options})", [paths[0]]

    def chunks(self, text: Sequence[str] = ()) -> Iterator[RawTable]:
        """The source's rows in record batches (DataError, one line, when DuckDB cannot)."""
        import duckdb

        connection = duckdb.connect(":memory:")
        try:
            connection.execute(f"SET memory_limit = '{self.memory_limit // 2**20}MB'")
            connection.execute(f"SET threads = {self.threads}")
            connection.execute("SET TimeZone = 'UTC'")
            connection.execute("SET enable_progress_bar = false")  # stdout is the CLI's
            sql, parameters = self._query()
            try:
                relation = connection.sql(sql, params=parameters)
                # duckdb ≥ 1.4 names it `to_arrow_reader`; earlier versions `record_batch`
                batches = getattr(relation, "to_arrow_reader", None) or relation.record_batch
                for batch in batches(self.batch_rows):
                    yield raw_from_batch(batch, self.files.name, self.encoder.schema, text)
            except duckdb.Error as exc:
                first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
                raise DataError(f"{self.files.name}: DuckDB could not read it ({first})") from None
        finally:
            connection.close()
