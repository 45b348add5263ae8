"""The opt-in cache of the real reference set's Inception features (`evaluate
--cache-real-features`), and what `dpsynth cache show|clear` lists and removes.

Per-record features of the real images are derived from records: for a user's own held-out
data they are private. So nothing is cached unless asked for (`caching(True)`, or
`compute_fid(cache_real_features=True)`); the folder is `$DPSYNTH_CACHE_DIR/fid`, else
`~/.cache/dpsynth/fid`, made 0700 with files 0600; and `clear` removes every file the cache
wrote there. A file's name is a hash of the data's plain content digest (with n, the weights'
hash and the pipeline version): it stays in this folder and never reaches a report or the
commands' output.

Torch-free: the CLI lists and clears the cache without loading the network.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import tempfile
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

CACHE_ENV = "DPSYNTH_CACHE_DIR"
FEATURES_FOLDER = "fid"
# What the cache writes: `<32 hex>.npz`, and `.<32 hex>.<random>.npz` while a write is in
# progress (left behind only by a killed process). Nothing else in the folder is ever touched.
_CACHE_FILE = re.compile(r"^\.?[0-9a-f]{32}(\.[A-Za-z0-9_]+)?\.npz$")

# Off unless a caller turns it on: the API's `evaluate(cache_real_features=True)` and the CLI's
# `--cache-real-features` run the evaluation inside `caching(True)`.
_ENABLED: ContextVar[bool] = ContextVar("dpsynth_real_feature_cache", default=False)


def cache_dir() -> Path:
    """Where real-set features are cached: `$DPSYNTH_CACHE_DIR/fid` or `~/.cache/dpsynth/fid`."""
    root = os.environ.get(CACHE_ENV)
    base = Path(root).expanduser() if root else Path.home() / ".cache" / "dpsynth"
    return base / FEATURES_FOLDER


def caching_enabled() -> bool:
    """Whether the enclosing `caching` block turned the cache on (False outside one)."""
    return _ENABLED.get()


@contextlib.contextmanager
def caching(enabled: bool = True) -> Iterator[None]:
    """Run the block with the real-feature cache on (or explicitly off)."""
    token = _ENABLED.set(bool(enabled))
    try:
        yield
    finally:
        _ENABLED.reset(token)


def cache_key(pipeline: str, content_digest: str, n: int, weights_sha256: str) -> str:
    """The file name's stem for a real set: its content digest, n, the weights and pipeline."""
    text = f"{pipeline}|{content_digest}|{int(n)}|{weights_sha256}"
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def load_features(key: str, shape: tuple[int, int]) -> np.ndarray | None:
    """The cached features under `key` when present, readable and of `shape`; else None (a
    damaged file is then recomputed and overwritten by the caller)."""
    path = cache_dir() / f"{key}.npz"
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as cached:
            features = cached["features"]
    except (OSError, ValueError, KeyError):
        return None
    return features if features.shape == shape else None


def store_features(key: str, features: np.ndarray) -> Path:
    """Write features under `key` atomically: mode 0600 in a 0700 folder. Returns the file."""
    folder = _private_folder(cache_dir())
    path = folder / f"{key}.npz"
    # mkstemp creates the file 0600, so the features are never readable by others, even while
    # being written; the chmod keeps it so if the folder's ACLs said otherwise.
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{key}.", suffix=".npz")
    try:
        with os.fdopen(fd, "wb") as handle:
            np.savez(handle, features=features)
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _private_folder(folder: Path) -> Path:
    """`folder` created (with its parents) and set to 0700: a cache made by an earlier dpsynth
    with the umask's mode is tightened too."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(folder, 0o700)
    return folder


@dataclass(frozen=True)
class CachedFile:
    """One file of the cache and its size in bytes."""

    path: Path
    bytes: int


@dataclass(frozen=True)
class CacheContents:
    """The cache's folder and files (`removed`: the files a `clear_cache` removed)."""

    folder: Path
    files: tuple[CachedFile, ...]
    removed: bool = False

    @property
    def count(self) -> int:
        """How many files: cached features, or staging files of a killed write."""
        return len(self.files)

    @property
    def bytes(self) -> int:
        """Their total size."""
        return sum(f.bytes for f in self.files)

    @property
    def set_by(self) -> str:
        """What chose the folder: `DPSYNTH_CACHE_DIR`, or `default` (`~/.cache/dpsynth`)."""
        return CACHE_ENV if os.environ.get(CACHE_ENV) else "default"

    def to_json(self) -> dict[str, Any]:
        """The `--json` document of `cache show` and `cache clear`: the folder, how many files
        and bytes. Not the files' names: each is a hash of a data set's plain digest, a
        membership test that should not reach a log."""
        return {
            "folder": str(self.folder),
            "set_by": self.set_by,
            "exists": self.folder.is_dir(),
            "count": self.count,
            "bytes": self.bytes,
            "removed": self.removed,
        }


def show_cache() -> CacheContents:
    """The cache's files in `cache_dir()` with their sizes (none when it does not exist)."""
    folder = cache_dir()
    return CacheContents(folder, tuple(CachedFile(p, _size(p)) for p in _cache_files(folder)))


def clear_cache() -> CacheContents:
    """Remove every file the cache wrote in `cache_dir()` (and the folder, when that leaves
    it empty); returns what was removed. Files it did not write are left where they are."""
    folder = cache_dir()
    removed: list[CachedFile] = []
    for path in _cache_files(folder):
        size = _size(path)
        try:
            path.unlink()
        except FileNotFoundError:
            continue  # removed meanwhile by another process
        removed.append(CachedFile(path, size))
    with contextlib.suppress(OSError):  # not empty (a file that is not the cache's) or absent
        folder.rmdir()
    return CacheContents(folder, tuple(removed), removed=True)


def _cache_files(folder: Path) -> tuple[Path, ...]:
    if not folder.is_dir():
        return ()
    return tuple(sorted(p for p in folder.iterdir() if _CACHE_FILE.match(p.name) and p.is_file()))


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
