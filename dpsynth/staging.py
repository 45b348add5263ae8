"""Output folders that commands write whole: what may be replaced, staging beside the target,
and clean-up of staging folders that a killed process left behind.

A command writes its output into a hidden staging folder (or, for one file such as a table's
CSV, a staging file) beside the target (`.NAME.dpsynth-PID-RANDOM.tmp`) and renames it into
place at the end. The PID in the name lets
a later run tell a live writer's staging folder from a dead one's and remove only the latter.
`--force` may only replace a folder that the same command wrote itself, never the current
directory, one of its parents, a run directory, the ledger's folder or a folder holding other
files: a mistyped `--out` must never delete anything it did not create.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

from dpsynth.errors import UsageError

_STAGING = re.compile(r"^\.(?P<name>.+)\.dpsynth-(?P<pid>\d+)-[A-Za-z0-9_]+\.(?P<kind>tmp|old)$")


def staging_dir(out: Path) -> Path:
    """A new, empty staging folder beside `out` whose name carries this process's PID."""
    return _sibling(out, ".tmp")


def staging_file(out: Path) -> Path:
    """A new, empty staging file beside the file `out` whose name carries this process's PID
    (`.NAME.dpsynth-PID-RANDOM.tmp`): a later run removes it if this process dies first."""
    while True:
        path = out.parent / f".{out.name}.dpsynth-{os.getpid()}-{secrets.token_hex(4)}.tmp"
        try:  # mode 0666 less the umask, as the final file would have (mkstemp makes 0600)
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
        except FileExistsError:
            continue
        return path


def _sibling(out: Path, suffix: str) -> Path:
    prefix = f".{out.name}.dpsynth-{os.getpid()}-"
    return Path(tempfile.mkdtemp(prefix=prefix, suffix=suffix, dir=out.parent))


def pid_alive(pid: int) -> bool:
    """True when a process with this PID exists (or may exist: we cannot signal it)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # e.g. EPERM: it exists but belongs to someone else
    return True


def remove_stale_staging(parent: Path) -> list[Path]:
    """Remove the staging folders and files in `parent` whose writing process is gone; return
    them.

    A replaced output that was moved aside (`.old`) by a process killed before the new one took
    its place is moved back instead, so that a kill at that moment loses nothing.
    """
    removed: list[Path] = []
    try:
        names = os.listdir(parent)
    except OSError:
        return removed
    for name in names:
        match = _STAGING.match(name)
        if match is None or pid_alive(int(match["pid"])):
            continue
        path = parent / name
        target = parent / match["name"]
        if match["kind"] == "old" and not target.exists() and not target.is_symlink():
            os.replace(path, target)
            continue
        if path.is_symlink():
            continue
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
        elif match["kind"] == "tmp" and path.is_file():
            path.unlink(missing_ok=True)  # a CSV that `sample` was writing when it was killed
            removed.append(path)
    return removed


def replace_dir(staging: Path, out: Path) -> None:
    """Move `staging` to `out`; an existing `out` (already checked replaceable) is moved aside
    first and removed only once the new folder is in place."""
    if not out.exists():
        os.replace(staging, out)
        return
    old = _sibling(out, ".old")
    os.rmdir(old)  # only its unique name is wanted
    os.replace(out, old)
    try:
        os.replace(staging, out)
    except BaseException:
        os.replace(old, out)
        raise
    shutil.rmtree(old, ignore_errors=True)


def check_target(
    out: Path,
    *,
    flag: str,
    force: bool,
    protected: Iterable[tuple[Path, str]] = (),
    written_by_us: Callable[[Path], bool] | None = None,
) -> None:
    """Refuse (UsageError, exit 2) an output folder whose replacement could lose data.

    A missing or empty folder is fine. A file, the current directory or one of its parents, or
    a folder that contains one of the `protected` paths (each with a name for the message) is
    always refused. A non-empty folder needs `force`, and then `written_by_us(out)` must confirm
    that it holds nothing but an earlier output of the same command.
    """
    if not out.exists() and not out.is_symlink():
        _check_creatable(out, flag)
        return
    if out.is_symlink():
        raise UsageError(f"{flag} {out} is a symbolic link; give the folder itself")
    if not out.is_dir():
        raise UsageError(f"{flag} {out} is a file, not a folder; choose a folder path")
    resolved = out.resolve()
    cwd = Path.cwd().resolve()
    if cwd == resolved or resolved in cwd.parents:
        raise UsageError(
            f"{flag} {out} is the current directory or contains it; choose a new folder"
        )
    for path, what in protected:
        target = Path(path).resolve()
        if target == resolved or resolved in target.parents:
            raise UsageError(f"{flag} {out} holds {what} ({path}); choose another folder")
    if not any(out.iterdir()):
        return
    if not force:
        raise UsageError(f"{flag} {out} exists and is not empty; use --force to replace it")
    if written_by_us is None or not written_by_us(out):
        raise UsageError(
            f"{flag} {out} holds files this command did not write, which it will not "
            "replace; choose a new or empty folder"
        )


def _check_creatable(out: Path, flag: str) -> None:
    """The nearest existing ancestor of `out` must be a writable folder."""
    parent = out.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise UsageError(f"{flag} {out}: {parent} is a file, not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"{flag} {out}: cannot create it, {parent} is not writable")
