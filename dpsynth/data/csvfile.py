"""A CSV file's text, read whole and checked before it is parsed: decompression by suffix, UTF-8,
no NUL byte, every line and the whole text within the caps of `dpsynth.data.limits`.

Every problem is a `DataError` (exit 4) with one line naming the file and the line and byte
offset where it was found (offsets count bytes of the decompressed text). A truncated or
corrupt `.gz`, `.bz2`, `.xz` or `.zip` is found here rather than by the parser, which let some
of them through silently (a truncated `.bz2` read as a shorter table) and raised bare
`EOFError` or `zlib.error` for others.
"""

from __future__ import annotations

import bz2
import codecs
import gzip
import io
import lzma
import zipfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import numpy as np

from dpsynth.data.limits import MAX_CSV_LINE_BYTES, fmt_bytes
from dpsynth.errors import DataError

COMPRESSIONS = (".gz", ".bz2", ".xz", ".zip")
_CHUNK = 1 << 16
_MAGIC = {b"\x1f\x8b": "gzip", b"BZh": "bzip2", b"\xfd7zXZ": "xz", b"PK\x03\x04": "zip"}
# What a broken compressed stream raises: gzip.BadGzipFile is an OSError, zipfile's CRC check
# a BadZipFile, a truncated stream an EOFError.
_STREAM_ERRORS = (EOFError, OSError, zlib.error, lzma.LZMAError, zipfile.BadZipFile, ValueError)


def _short(error: BaseException) -> str:
    text = " ".join(str(error).split()) or type(error).__name__
    return text[:160]


def _open(path: Path, name: str) -> BinaryIO:
    """The decompressed byte stream of `path`, by its suffix (plain when none matches)."""
    suffix = path.suffix.lower()
    try:
        if suffix == ".gz":
            return gzip.open(path, "rb")
        if suffix == ".bz2":
            return bz2.open(path, "rb")
        if suffix == ".xz":
            return lzma.open(path, "rb")
        if suffix == ".zip":
            return _open_zip(path, name)
        return path.open("rb")
    except FileNotFoundError:
        raise DataError(f"{name}: no such file") from None
    except DataError:
        raise
    except _STREAM_ERRORS as error:
        raise DataError(f"{name}: cannot open it ({_short(error)})") from None


def _open_zip(path: Path, name: str) -> BinaryIO:
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, EOFError, ValueError) as error:
        raise DataError(f"{name}: not a readable zip archive ({_short(error)})") from None
    members = [m for m in archive.infolist() if not m.is_dir()]
    if len(members) != 1:
        archive.close()
        raise DataError(f"{name}: a .zip must hold exactly one CSV file, it holds {len(members)}")
    return archive.open(members[0])  # type: ignore[return-value]


class _Checker:
    """Running checks over consecutive chunks of the text: line lengths, NUL bytes, UTF-8."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.offset = 0  # bytes seen before the current chunk
        self.lines = 0  # newlines seen before the current chunk
        self.open_line = 0  # bytes of the current (unfinished) line
        self.decoder = codecs.getincrementaldecoder("utf-8")("strict")

    def where(self, chunk: bytes, at: int) -> str:
        """`line L (byte B)` for position `at` of `chunk`."""
        line = self.lines + chunk.count(b"\n", 0, max(at, 0)) + 1
        return f"line {line} (byte {self.offset + at})"

    def check(self, chunk: bytes, final: bool) -> None:
        nul = chunk.find(b"\0")
        if nul >= 0:
            raise DataError(
                f"{self.name}: a NUL byte at {self.where(chunk, nul)}; not a CSV text file"
                f"{_compressed_hint(chunk, self.offset)}"
            )
        self._check_lines(chunk, final)
        pending = len(self.decoder.getstate()[0])
        try:
            self.decoder.decode(chunk, final)
        except UnicodeDecodeError as error:
            at = error.start - pending
            raise DataError(
                f"{self.name}: not UTF-8 text at {self.where(chunk, at)} ({error.reason}); "
                f"save the CSV as UTF-8{_compressed_hint(chunk, self.offset)}"
            ) from None
        self.offset += len(chunk)
        self.lines += chunk.count(b"\n")

    def _check_lines(self, chunk: bytes, final: bool) -> None:
        ends = np.flatnonzero(np.frombuffer(chunk, dtype=np.uint8) == 10)
        if ends.size:
            starts = np.concatenate(([0], ends[:-1] + 1))
            lengths = ends - starts
            lengths[0] += self.open_line
            longest = int(np.argmax(lengths))
            if lengths[longest] > MAX_CSV_LINE_BYTES:
                self._too_long(chunk, int(starts[longest]) if longest else -self.open_line)
            self.open_line = len(chunk) - int(ends[-1]) - 1
        else:
            self.open_line += len(chunk)
        if self.open_line > MAX_CSV_LINE_BYTES:
            self._too_long(chunk, len(chunk) - self.open_line)

    def _too_long(self, chunk: bytes, start: int) -> None:
        raise DataError(
            f"{self.name}: {self.where(chunk, start)} starts a line longer than the "
            f"{fmt_bytes(MAX_CSV_LINE_BYTES)} cap of a CSV line (a binary file, or a missing "
            "newline?)"
        )


def _compressed_hint(chunk: bytes, offset: int) -> str:
    if offset:
        return ""
    for magic, kind in _MAGIC.items():
        if chunk.startswith(magic):
            return (
                f" (it starts like a {kind} file: a compressed CSV is read by its suffix, "
                f"{', '.join(COMPRESSIONS)})"
            )
    return ""


def _chunks(stream: BinaryIO, checker: _Checker) -> Iterator[bytes]:
    while True:
        try:
            chunk = stream.read1(_CHUNK)
        except _STREAM_ERRORS as error:
            raise DataError(
                f"{checker.name}: the compressed data is truncated or corrupt after byte "
                f"{checker.offset} of the text (line {checker.lines + 1}): {_short(error)}"
            ) from None
        if not chunk:
            return
        yield chunk


class CheckedText(io.RawIOBase):
    """The decompressed text of a CSV file as a binary stream, checked chunk by chunk as it is
    read (see the module docstring), so that a parser can consume a file of any size without
    the whole text in memory. A `DataError` surfaces from `read` at the first bad chunk; the
    final check (an unfinished UTF-8 sequence at the end) runs when the text is exhausted."""

    def __init__(self, path: Path | str, name: str | None = None) -> None:
        super().__init__()
        path = Path(path)
        self.name = name or str(path)
        self._stream = _open(path, self.name)
        self._checker = _Checker(self.name)
        self._chunks = _chunks(self._stream, self._checker)
        self._pending = memoryview(b"")
        self._finished = False

    def readable(self) -> bool:
        """Always: a read-only stream."""
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        """Fill `buffer` from the checked text; 0 at its end."""
        if not self._pending:
            if self._finished:
                return 0
            chunk = next(self._chunks, b"")
            self._checker.check(chunk, final=not chunk)
            if not chunk:
                self._finished = True
                return 0
            self._pending = memoryview(chunk)
        count = min(len(buffer), len(self._pending))
        buffer[:count] = self._pending[:count]
        self._pending = self._pending[count:]
        return count

    def close(self) -> None:
        """Close the underlying file."""
        if not self.closed:
            self._stream.close()
        super().close()
