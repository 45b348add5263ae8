"""The file a table's `sample` writes: CSV text, or Parquet when `--out` ends in `.parquet`.

`RowsFile` writes decoded batches (`TableCodec.decode` frames) into the staging file, hashes
what it wrote (SHA-256 of the file's bytes, for the manifest and the ledger's release) and
fsyncs it before `sample_table` renames it into place.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import TYPE_CHECKING

from dpsynth.errors import UsageError

if TYPE_CHECKING:
    import pandas as pd

    from dpsynth.data.table_codec import TableCodec
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
    """A context manager writing decoded frames to `path` as CSV or Parquet; `sha256` holds
    the file's digest once it is closed without an error."""

    def __init__(self, path: Path, codec: TableCodec, fmt: str) -> None:
        self.path = path
        self.codec = codec
        self.fmt = fmt
        self.sha256 = ""
        self._digest = hashlib.sha256()
        self._header = True
        self._handle = path.open("wb")
        self._parquet: ParquetRows | None = None
        if fmt == "parquet":
            from dpsynth.sampling.parquet_out import ParquetRows  # pyarrow: imported on use

            try:
                self._parquet = ParquetRows(self._handle, codec.schema)
            except BaseException:
                self._handle.close()
                raise

    def write(self, frame: pd.DataFrame) -> None:
        """Append a decoded batch (the CSV header before the first)."""
        if self._parquet is not None:
            self._parquet.write(frame)
            return
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
