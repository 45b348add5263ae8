"""The file a table's `sample` writes: CSV text, or Parquet when `--out` ends in `.parquet`.

`RowsFile` writes generated batches (`CodedRows`) into the staging file: as CSV text of their
decoded frame (`coded_rows.coded_frame`, `TableCodec.csv_text`), or as Arrow record batches
(`sampling.arrow_rows`) into Parquet. It hashes what it wrote (SHA-256 of the file's bytes,
for the manifest and the ledger's release) and fsyncs it before `sample_table` renames it
into place.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import TYPE_CHECKING

from dpsynth.errors import UsageError

if TYPE_CHECKING:
    from dpsynth.data.coded_rows import CodedRows
    from dpsynth.data.table_codec import TableCodec
    from dpsynth.sampling.arrow_rows import ArrowRows
    from dpsynth.sampling.parquet_out import ParquetRows

TABLE_FORMATS = ("csv", "parquet")


def table_format(out: Path, fmt: str | None) -> str:
    """The format of a table's output: `fmt` when given (csv or parquet; it must agree with the
    name), else parquet for a name ending in `.parquet` and csv for any other name."""
    by_name = "parquet" if out.suffix.lower() == ".parquet" else "csv"
    if fmt is None:
        return by_name
    if fmt not in TABLE_FORMATS:
        raise UsageError(
            f"--format {fmt}: a table's run writes csv or parquet (chosen by the --out name)"
        )
    if fmt != by_name:
        wanted = (
            "a name ending in .parquet" if fmt == "parquet" else "a name not ending in .parquet"
        )
        raise UsageError(f"--format {fmt} with --out {out}: give {wanted}")
    return fmt


class RowsFile:
    """A context manager writing generated batches to `path` as CSV or Parquet; `sha256`
    holds the file's digest once it is closed without an error."""

    def __init__(self, path: Path, codec: TableCodec, fmt: str) -> None:
        self.path = path
        self.codec = codec
        self.fmt = fmt
        self.sha256 = ""
        self._digest = hashlib.sha256()
        self._header = True
        self._handle = path.open("wb")
        self._parquet: ParquetRows | None = None
        self._arrow: ArrowRows | None = None
        if fmt == "parquet":
            from dpsynth.sampling.arrow_rows import ArrowRows  # pyarrow: imported on use
            from dpsynth.sampling.parquet_out import ParquetRows

            try:
                arrow = self._arrow = ArrowRows(codec.schema)
                self._parquet = ParquetRows(
                    self._handle, arrow.arrow, arrow.public, **arrow.writer_options
                )
            except BaseException:
                self._handle.close()
                raise

    def write(self, coded: CodedRows) -> None:
        """Append a batch of generated rows (the CSV header before the first)."""
        if self._parquet is not None and self._arrow is not None:
            self._parquet.write(self._arrow.batch(coded))
            return
        from dpsynth.data.coded_rows import coded_frame

        frame = coded_frame(self.codec.schema, coded)
        text = self.codec.csv_text(frame, header=self._header).encode("utf-8")
        self._header = False
        self._handle.write(text)
        self._digest.update(text)

    def __enter__(self) -> RowsFile:
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if self._parquet is not None:
                self._parquet.__exit__(*exc)
            if exc[0] is None:
                self._handle.flush()
                os.fsync(self._handle.fileno())
        finally:
            self._handle.close()
        if exc[0] is None:
            self.sha256 = (
                self._file_sha256() if self._parquet is not None else self._digest.hexdigest()
            )

    def _file_sha256(self) -> str:
        digest = hashlib.sha256()
        with self.path.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        return digest.hexdigest()
