"""The privacy ledger's file: the hash chain's lines read, locked and appended safely.

`LedgerFile` reads lines into a `dpsynth.ledger.chain.Chain` (which checks each one) and
appends new ones when several processes share the file; the line format and what makes a line
valid in the chain is `dpsynth.ledger.chain`, what the lines mean (spends, budgets, totals)
`dpsynth.ledger.state`.

Appends hold an exclusive flock on the sidecar `PATH.lock`, re-read what others appended, write
the line with one `write` and fsync it; a failed write is cut back, so no half line is left. A
last line that is not valid JSON and lacks its newline is a torn write, reported as such.
"""

from __future__ import annotations

import errno
import fcntl
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from dpsynth import __version__
from dpsynth.errors import DataError, DpsynthError, LedgerIntegrityError, UsageError
from dpsynth.ledger.chain import Chain, canonical_json, entry_hash, is_json

DEFAULT_LEDGER_NAME = "dpsynth-ledger.jsonl"
TORN_REASON = (
    "incomplete last line (not valid JSON, no trailing newline: a write was interrupted); what "
    "it would have "
    "recorded never took effect, so removing that partial line is safe"
)


def _utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


class LedgerFile:
    """The ledger file at `path`: shared reads, locked appends, and where the last read ended
    (so that a refresh parses only what was appended since)."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.lock_path = self.path.with_name(self.path.name + ".lock")
        self._offset = 0
        self._file_id: tuple[int, int] | None = None
        # The file's last line is complete JSON without its newline: the next append adds it.
        self._unterminated = False

    def check_path(self) -> None:
        """UsageError (exit 2) when the ledger path names a folder rather than a file."""
        if self.path.is_dir():
            raise UsageError(
                f"ledger {self.path} is a folder; give the ledger file's path "
                f"(e.g. {self.path / DEFAULT_LEDGER_NAME})"
            )

    @contextmanager
    def file_errors(self, *, writing: bool) -> Iterator[None]:
        """Turn the OS's errors on the ledger file into one-line errors with an exit code:
        unreadable is exit 4; unwritable (read-only file or folder) is exit 2."""
        self.check_path()
        try:
            yield
        except OSError as exc:
            reason = exc.strerror or exc.__class__.__name__
            if writing:
                raise UsageError(
                    f"ledger {self.path}: cannot write to it ({reason}); give a writable --ledger"
                ) from None
            raise DataError(f"ledger {self.path}: cannot read it ({reason})") from None

    def read_chain(self, chain: Chain) -> Chain:
        """Bring `chain` up to date with the file (reads only new bytes)."""
        with self.file_errors(writing=False):
            if not self.path.exists() and not chain.entries:
                return chain  # an empty ledger; no lock file is created just to read
            with self.locked(exclusive=False):
                self.refresh(chain)
        return chain

    def read_lines(self, chain: Chain) -> list[bytes]:
        """Every complete line of the whole file, read afresh under the shared lock (a torn
        last line is an error, reported on `chain`); for `verify`."""
        raw = b""
        with self.file_errors(writing=False):
            if self.path.exists():
                with self.locked(exclusive=False):
                    raw = self._read_bytes()
        lines = raw.split(b"\n")
        if lines and lines[-1] == b"":
            lines.pop()
        elif lines and not is_json(lines[-1]):
            raise chain.fail(len(lines), TORN_REASON)
        return lines

    def refresh(self, chain: Chain) -> None:
        """Parse lines appended since the last read into `chain`; call with the lock held."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            if chain.entries:
                raise LedgerIntegrityError(f"ledger {self.path} has disappeared") from None
            return
        try:
            stat = os.fstat(fd)
            file_id = (stat.st_dev, stat.st_ino)
            if file_id != self._file_id and self._file_id is not None:
                raise LedgerIntegrityError(f"ledger {self.path} was replaced while in use")
            if stat.st_size < self._offset:
                raise LedgerIntegrityError(
                    f"ledger {self.path} shrank from {self._offset} to {stat.st_size} bytes "
                    "(lines were removed)"
                )
            self._file_id = file_id
            os.lseek(fd, self._offset, os.SEEK_SET)
            new = _read_all(fd)
        finally:
            os.close(fd)
        if not new:
            return
        first_line = len(chain.entries) + 1
        # After a last line without its newline, the next writer's first byte is that newline.
        body = new[1:] if self._unterminated and new.startswith(b"\n") else new
        complete, separator, torn = body.rpartition(b"\n")
        lines = complete.split(b"\n") if separator else []
        if torn:
            # Only a line that is not valid JSON is a torn write; a complete entry that lacks
            # just its newline (an editor, a copy) is an entry, checked like any other.
            if not is_json(torn):
                raise chain.fail(first_line + len(lines), TORN_REASON)
            lines.append(torn)
        for number, line in enumerate(lines, start=first_line):
            chain.add_line(line, number)
        self._unterminated = bool(torn)
        self._offset += len(new)

    def append(self, chain: Chain, build: Callable[[Any], dict[str, Any]]) -> dict[str, Any]:
        """Under the exclusive lock: re-read into `chain`, build the line from it, write the
        line in one call, fsync, and add it to `chain`; return the written entry."""
        with self.file_errors(writing=True):
            self.path.parent.mkdir(parents=True, exist_ok=True)
            return self._append_locked(chain, build)

    def _append_locked(
        self, chain: Chain, build: Callable[[Any], dict[str, Any]]
    ) -> dict[str, Any]:
        with self.locked(exclusive=True):
            self.refresh(chain)
            body = build(chain)
            entry = {
                "seq": len(chain.entries),
                "time": _utc_now(),
                **body,
                "dpsynth_version": __version__,
                "prev_hash": chain.head_hash,
            }
            entry["hash"] = entry_hash(entry)
            line = canonical_json(entry).encode("ascii")
            data = (b"\n" if self._unterminated else b"") + line + b"\n"
            created = not self.path.exists()
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                _write_line(fd, data, self._offset)
            finally:
                os.close(fd)
            self._unterminated = False
            if created:
                _fsync_dir(self.path.parent)
            if self._file_id is None:
                stat = os.stat(self.path)
                self._file_id = (stat.st_dev, stat.st_ino)
            chain.add_line(line, entry["seq"] + 1)
            self._offset += len(data)
        return entry

    def _read_bytes(self) -> bytes:
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return b""
        try:
            return _read_all(fd)
        finally:
            os.close(fd)

    @contextmanager
    def locked(self, *, exclusive: bool) -> Iterator[None]:
        """Hold flock on the sidecar `PATH.lock` (shared for reads, exclusive for appends)."""
        try:
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        except IsADirectoryError:
            raise UsageError(
                f"ledger {self.path}: its lock file {self.lock_path} is a folder; move it away "
                "(the lock must be a file, which the ledger creates)"
            ) from None
        except OSError as exc:
            if exclusive or exc.errno not in (errno.EACCES, errno.EROFS, errno.ENOENT):
                raise
            yield  # reading a ledger in a read-only place: nobody can be appending there
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            yield
        finally:
            os.close(fd)  # closing releases the lock


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)


def _write_line(fd: int, data: bytes, size_before: int) -> None:
    """Write `data` with one os.write and fsync; on failure cut the file back to its old size
    so that no half line is left behind."""
    try:
        written = os.write(fd, data)
        if written != len(data):
            raise OSError(errno.ENOSPC, f"short write ({written} of {len(data)} bytes)")
        os.fsync(fd)
    except OSError as exc:
        os.ftruncate(fd, size_before)
        raise DpsynthError(f"could not append to the ledger: {exc}") from exc


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
