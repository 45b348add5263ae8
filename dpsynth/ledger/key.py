"""The ledger's fingerprint key: data fingerprints that link spends but test no membership.

The ledger links spends on the same records (the same file under another `--dataset-id`
never gets a fresh budget) by a fingerprint of the data. A plain SHA-256 of the records
would be an exact membership test: in DP's threat model the adversary knows every other
record, so they could hash the data set with and without a candidate and compare. So the
fingerprint written to the ledger, `config.json`, sample manifests and reports is an
HMAC-SHA256 of the content digest under a secret key kept beside the ledger
(`LEDGER.key`, mode 0600, created on first use, never published): without the key it says
nothing about the records; with it, the same records give the same fingerprint.

The fingerprint names its key by a short key id (`hmac-sha256:<key id>:<mac>`), so a ledger
whose key was lost or swapped is refused (`ledger_key`) instead of silently failing to link
its spends.
Ledgers written before the key existed hold plain SHA-256 digests ("legacy" fingerprints);
they keep verifying, and a new spend on the same records links to them (see
`dpsynth.ledger`).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import re
import secrets
from collections.abc import Callable
from pathlib import Path

from dpsynth.errors import DataError, UsageError

KEY_SUFFIX = ".key"
KEYED_PREFIX = "hmac-sha256:"
_KEY_BYTES = 32
_KEY_FORMAT = "dpsynth-ledger-key-v1"
_KEYED = re.compile(r"^hmac-sha256:([0-9a-f]{8}):([0-9a-f]{64})$")
_LEGACY = re.compile(r"^[0-9a-f]{64}$")


def key_path_for(ledger_path: Path) -> Path:
    """Where the key of the ledger at `ledger_path` lives: `LEDGER.key` beside it."""
    return ledger_path.with_name(ledger_path.name + KEY_SUFFIX)


def is_keyed(fingerprint: str) -> bool:
    """True for a keyed fingerprint (`hmac-sha256:<key id>:<mac>`)."""
    return bool(_KEYED.match(fingerprint))


def is_legacy(fingerprint: str) -> bool:
    """True for a plain SHA-256 digest, as ledgers before the key recorded them."""
    return bool(_LEGACY.match(fingerprint))


def key_id_of(fingerprint: str) -> str | None:
    """The key id a keyed fingerprint was made with (None for any other string)."""
    match = _KEYED.match(fingerprint)
    return match.group(1) if match else None


class FingerprintKey:
    """A ledger's secret HMAC key and the fingerprints it makes."""

    def __init__(self, key: bytes) -> None:
        if len(key) != _KEY_BYTES:
            raise ValueError(f"a fingerprint key has {_KEY_BYTES} bytes")
        self._key = key
        # Names the key without revealing it (an HMAC of a fixed label).
        self.key_id = hmac.new(key, b"dpsynth-key-id", hashlib.sha256).hexdigest()[:8]

    def fingerprint(self, content_digest: str) -> str:
        """The publishable fingerprint of data whose content digest is `content_digest`."""
        mac = hmac.new(self._key, content_digest.encode("ascii"), hashlib.sha256).hexdigest()
        return f"{KEYED_PREFIX}{self.key_id}:{mac}"

    @classmethod
    def fresh(cls) -> FingerprintKey:
        """A new key from the OS's secure randomness."""
        return cls(secrets.token_bytes(_KEY_BYTES))

    def to_text(self) -> str:
        """The key file's content."""
        return f"{_KEY_FORMAT}\n{self._key.hex()}\n"

    @classmethod
    def from_text(cls, text: str, path: Path) -> FingerprintKey:
        """Parse a key file's content; DataError naming `path` when it is not one."""
        lines = text.split()
        try:
            if len(lines) != 2 or lines[0] != _KEY_FORMAT:
                raise ValueError
            return cls(bytes.fromhex(lines[1]))
        except ValueError:
            raise DataError(f"{path}: not a dpsynth ledger key file") from None


def read_key(path: Path) -> FingerprintKey | None:
    """The key stored at `path`, or None when there is no such file."""
    try:
        text = path.read_text(encoding="ascii")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"{path}: unreadable ledger key ({exc})") from None
    return FingerprintKey.from_text(text, path)


def create_key(path: Path) -> FingerprintKey:
    """Create the key at `path` (mode 0600) unless another process just did; return the key
    that is on disk. The file appears whole (hard link of a finished temporary file), and
    only once: two processes creating it at the same time end up with the same key."""
    key = FingerprintKey.fresh()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="ascii") as handle:
            handle.write(key.to_text())
            handle.flush()
            os.fsync(handle.fileno())
        with contextlib.suppress(FileExistsError):  # another process won: use its key
            os.link(tmp, path)
    except OSError as exc:
        raise UsageError(f"cannot create the ledger key {path} ({exc})") from None
    finally:
        tmp.unlink(missing_ok=True)
    found = read_key(path)
    assert found is not None
    return found


def ledger_key(
    ledger_path: Path, used_key_ids: Callable[[], set[str]], *, create: bool
) -> FingerprintKey | None:
    """The key of the ledger at `ledger_path` (`LEDGER.key` beside it), created on first use
    when `create` is True (else None while there is none). A UsageError when `used_key_ids()`,
    the ids of the keys the ledger's spend fingerprints were made with, name a key that is
    missing or not this one: new spends could no longer be linked to earlier ones by data."""
    # a ledger path under a file (notes.txt/l.jsonl) is the user's mistake: exit 2, not 4
    if ledger_path.parent.exists() and not ledger_path.parent.is_dir():
        raise UsageError(
            f"ledger {ledger_path}: cannot write to it ({ledger_path.parent} is a file, not a "
            "folder); give a writable --ledger"
        )
    key_path = key_path_for(ledger_path)
    key = read_key(key_path)
    # The ledger is read only after its key: an unreadable key is reported first.
    used = used_key_ids()
    if key is None and used:
        raise UsageError(
            f"the ledger {ledger_path} links its spends by fingerprints made with the key "
            f"{key_path}, which is missing: restore that file from your backup (it "
            "belongs with the ledger and must never be published); without it new spends "
            "cannot be linked to this ledger's earlier spends on the same data"
        )
    if key is None:
        if not create:
            return None
        key = create_key(key_path)
    if used - {key.key_id}:
        raise UsageError(
            f"{key_path} is not the key this ledger's fingerprints were made with "
            f"(key id {key.key_id}, the ledger uses {', '.join(sorted(used))}): restore the "
            "ledger's own key file"
        )
    return key
