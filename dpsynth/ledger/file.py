"""The privacy ledger's file format: a hash chain of JSON lines, read, locked and appended safely.

Each line is one JSON object in canonical form (sorted keys, no spaces, ASCII) with `seq`
(0, 1, 2, ...), `time` (UTC), `kind`, `prev_hash` (the previous line's `hash`, 64 zeros for the
first line) and `hash` (SHA-256 of the line's canonical JSON without `hash`). This module knows
what makes a line valid in the chain and how to read and append lines when several processes
share the file; what the lines mean (spends, budgets, totals) is `dpsynth.ledger`.

Appends hold an exclusive flock on the sidecar `PATH.lock`, re-read what others appended, write
the line with one `write` and fsync it; a failed write is cut back, so no half line is left. A
last line that is not valid JSON and lacks its newline is a torn write, reported as such.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import math
import numbers
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from dpsynth import __version__
from dpsynth.errors import DataError, DpsynthError, LedgerIntegrityError, UsageError

DEFAULT_LEDGER_NAME = "dpsynth-ledger.jsonl"
GENESIS_HASH = "0" * 64
KINDS = ("spend", "status", "release", "budget")
REQUIRED_FIELDS: dict[str, tuple[str, ...]] = {
    "spend": ("dataset_id", "fingerprint", "run_id", "events", "delta", "epsilon", "total_epsilon"),
    "status": ("ref", "status", "dataset_id", "events", "delta", "epsilon", "total_epsilon"),
    "release": ("dataset_id", "fingerprint", "run_id", "output_sha256", "events"),
    "budget": ("dataset_id", "epsilon", "delta"),
}
TORN_REASON = (
    "incomplete last line (not valid JSON, no trailing newline: a write was interrupted); what "
    "it would have "
    "recorded never took effect, so removing that partial line is safe"
)


def json_safe(obj: Any) -> Any:
    """A copy of `obj` that JSON can hold: non-finite floats become "inf"/"-inf"/"nan" strings,
    tuples become lists and numpy scalars plain numbers."""
    if isinstance(obj, Mapping):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    if isinstance(obj, (bool, str)) or obj is None:
        return obj
    if isinstance(obj, numbers.Integral):
        return int(obj)
    if isinstance(obj, numbers.Real):
        value = float(obj)
        return value if math.isfinite(value) else str(value)
    if hasattr(obj, "item"):  # zero-dimensional arrays and tensors
        return json_safe(obj.item())
    raise UsageError(f"cannot record a value of type {type(obj).__name__} in the ledger")


def as_float(value: float | str) -> float:
    """Read an ε as the ledger stores it (a number, or "inf")."""
    return float(value)


def canonical_json(obj: Any) -> str:
    """The canonical text that hashes are taken over (sorted keys, no spaces, ASCII)."""
    return json.dumps(
        obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
    )


def entry_hash(entry: Mapping[str, Any]) -> str:
    """SHA-256 hex of the entry's canonical JSON without its `hash` key."""
    body = {k: v for k, v in entry.items() if k != "hash"}
    return hashlib.sha256(canonical_json(body).encode("ascii")).hexdigest()


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not allowed in the ledger")


_TEXT_FIELDS = frozenset(
    ("dataset_id", "fingerprint", "run_id", "output_sha256", "status", "command", "method", "kind")
)
_NUMBER_FIELDS = frozenset(("delta", "epsilon", "total_epsilon"))


def _field_problem(name: str, value: Any) -> str | None:
    """Why a known field's value has the wrong JSON type (None when it is fine): a line
    re-hashed by hand may hold anything, and the ledger's state keys and sums these fields."""
    if name in _TEXT_FIELDS and not isinstance(value, str):
        return f"must be a string, not {type(value).__name__}"
    if name in _NUMBER_FIELDS:
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            return f"must be a number, not {type(value).__name__}"
        try:
            float(value)
        except ValueError:
            return f"must be a number, not {value[:40]!r}"
    well_formed = isinstance(value, list) and all(isinstance(e, dict) for e in value)
    if name == "events" and value is not None and not well_formed:
        return "must be a list of objects"
    return None


def _utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


@dataclass
class Chain:
    """The lines read so far, each checked against the chain before it is kept.

    `record` is the hook where a subclass learns what a line means (it may reject it); the
    chain itself checks only the format: JSON object, hash, seq, prev_hash, kind and fields.
    """

    path: Path
    entries: list[dict[str, Any]] = field(default_factory=list)

    @property
    def head_hash(self) -> str:
        """The last line's hash (the genesis hash when there is none)."""
        return self.entries[-1]["hash"] if self.entries else GENESIS_HASH

    def fail(self, line: int, reason: str) -> LedgerIntegrityError:
        """The one-line error for a bad line (1-based `line`)."""
        return LedgerIntegrityError(f"ledger {self.path}: line {line}: {reason}")

    def add_line(self, raw: bytes, line: int) -> dict[str, Any]:
        """Parse, check against the chain so far, and record one line (1-based `line`)."""
        try:
            entry = json.loads(raw.decode("ascii"), parse_constant=_reject_constant)
        except (UnicodeDecodeError, ValueError):
            raise self.fail(line, "not valid JSON (edited or corrupted)") from None
        except RecursionError:
            raise self.fail(line, "JSON nested too deeply (edited or corrupted)") from None
        if not isinstance(entry, dict):
            raise self.fail(line, "not a JSON object (edited or corrupted)")
        if entry.get("hash") != entry_hash(entry):
            raise self.fail(line, "hash mismatch (the line was edited)")
        expected_seq = len(self.entries)
        seq = entry.get("seq")
        if seq != expected_seq:
            raise self.fail(
                line,
                f"seq {seq} where {expected_seq} was expected (a line was removed or reordered)",
            )
        if entry.get("prev_hash") != self.head_hash:
            raise self.fail(
                line, "prev_hash does not match the previous line (a line was removed or reordered)"
            )
        kind = entry.get("kind")
        if kind not in KINDS:
            raise self.fail(line, f"unknown kind {kind!r}")
        missing = [name for name in REQUIRED_FIELDS[kind] if name not in entry]
        if missing:
            raise self.fail(line, f"{kind} line lacks {', '.join(missing)}")
        for name, value in entry.items():
            problem = _field_problem(name, value)
            if problem:
                raise self.fail(line, f"{name} {problem} (edited or corrupted)")
        self.record(entry, line)
        self.entries.append(entry)
        return entry

    def record(self, entry: dict[str, Any], line: int) -> None:
        """What a valid line means; the plain chain keeps nothing beyond the entries."""

    def check_anchors(
        self,
        anchors: Mapping[int, str] | None = None,
        runs: Mapping[str, tuple[int, str]] | None = None,
        heads: Sequence[str] = (),
    ) -> None:
        """LedgerIntegrityError unless every anchor (seq → hash), every run's spend (name →
        (seq, hash)) and every published head hash is a line of the chain; this catches
        lines cut off the end and a file rewritten and re-hashed."""
        for seq, expected in (anchors or {}).items():
            seq = int(seq)
            if seq >= len(self.entries) or self.entries[seq]["hash"] != expected:
                raise LedgerIntegrityError(
                    f"ledger {self.path}: entry seq {seq} known from a run is missing or differs "
                    "(lines were cut off or the file was rewritten)"
                )
        for name, (seq, expected) in (runs or {}).items():
            if seq >= len(self.entries):
                raise LedgerIntegrityError(
                    f"ledger {self.path}: run {name}: its spend (seq {seq}) is missing from the "
                    f"chain of {len(self.entries)} entries (lines were cut off or the file was "
                    "rewritten, or this is another ledger)"
                )
            if self.entries[seq]["hash"] != expected:
                raise LedgerIntegrityError(
                    f"ledger {self.path}: run {name}: its spend (seq {seq}) differs in the chain "
                    "(the file was rewritten, or this is another ledger)"
                )
        known = {entry["hash"] for entry in self.entries}
        for head in heads:
            if head != GENESIS_HASH and head not in known:
                raise LedgerIntegrityError(
                    f"ledger {self.path}: the published head {head} is not in the chain "
                    "(lines were cut off or the file was rewritten since it was published)"
                )


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
        elif lines and not _is_json(lines[-1]):
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
            if not _is_json(torn):
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


def _is_json(raw: bytes) -> bool:
    """True when `raw` parses as one JSON value (a complete line, whatever it says)."""
    try:
        json.loads(raw.decode("ascii"), parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError):
        return False
    except RecursionError:
        return True  # complete, but nested too deeply: `add_line` says so
    return True


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
