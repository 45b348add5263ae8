"""The secret randomness of a run's DP mechanisms: one OS-drawn privacy seed, named streams.

A DP guarantee holds only if the mechanism's coin flips are unknown to the adversary. If the
Poisson batches and the Gaussian noise came from a seed that is published (say `--seed` in
`config.json`), anyone who knows the seed and the other records could replay training on
both neighbouring data sets and tell which one produced the release. So every run draws a
fresh 128-bit secret from the operating system, and every random draw a mechanism makes
(batch membership, noise, the per-record randomness of a loss) comes from a generator seeded
from it. Each purpose gets its own stream: its seed material is SHA-256 of the secret and
the purpose's name, so streams never overlap and knowing one says nothing about another.

The secret, and the generator states derived from it, go only to the run's private folder
(`dpsynth.rundir`); `--seed` keeps controlling public randomness (initialisation, sampling).

Seeding: a CPU `torch.Generator` (MT19937) keeps only the low 32 bits of `manual_seed`, so
its whole 624-word state is filled from the secret instead (19937 bits of state, keyed by
the 128-bit secret). A CUDA generator (Philox) takes the full 64-bit seed. MT19937 and Philox
are not cryptographic generators: an adversary who saw raw draws could predict later ones.
The draws are never released directly (only as noise inside sums), which is the model of
the standard DP-SGD implementations as well.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Mapping
from typing import Any

import torch

from dpsynth.errors import DataError, DpsynthError

SECRET_BITS = 128
_FORMAT = "dpsynth-privacy-seed-v1"
_MT_WORDS = 624  # MT19937's state size in 32-bit words


def _digest(secret: int, purpose: str, counter: int) -> bytes:
    """SHA-256 of the secret, the purpose and a block counter (the key derivation)."""
    material = b"\0".join(
        (
            _FORMAT.encode(),
            secret.to_bytes(SECRET_BITS // 8, "big"),
            purpose.encode(),
            counter.to_bytes(8, "big"),
        )
    )
    return hashlib.sha256(material).digest()


def derive_seed(secret: int, purpose: str) -> int:
    """The 64-bit seed of stream `purpose`: the first 8 bytes of its SHA-256 key material."""
    return int.from_bytes(_digest(secret, purpose, 0)[:8], "big")


def _derive_words(secret: int, purpose: str, count: int) -> list[int]:
    """`count` 32-bit words of stream key material (SHA-256 in counter mode)."""
    words: list[int] = []
    counter = 1
    while len(words) < count:
        block = _digest(secret, purpose, counter)
        words.extend(int.from_bytes(block[i : i + 4], "little") for i in range(0, 32, 4))
        counter += 1
    return words[:count]


def _mt_init_words(seed: int) -> list[int]:
    """MT19937's state words right after `init_genrand(seed)` (what `manual_seed` writes)."""
    words = [seed & 0xFFFFFFFF]
    for i in range(1, _MT_WORDS):
        prev = words[-1]
        words.append((1812433253 * (prev ^ (prev >> 30)) + i) & 0xFFFFFFFF)
    return words


def _mt_state_offset(state: torch.Tensor, seed: int) -> int:
    """Byte offset of the 624 state words (stored as uint64) inside a CPU generator state.

    Found by matching the known initial words of `seed` rather than assumed, so a change in
    torch's layout fails loudly instead of silently leaving the generator on a 32-bit seed.
    """
    raw = state.numpy().tobytes()
    expected = b"".join(w.to_bytes(8, "little") for w in _mt_init_words(seed))
    offset = raw.find(expected)
    if offset < 0 or raw.find(expected, offset + 1) >= 0:
        raise DpsynthError(
            "cannot key the CPU random generator from the privacy seed: unknown torch "
            "generator state layout"
        )
    return offset


def _keyed_generator(secret: int, purpose: str, device: torch.device) -> torch.Generator:
    """A generator on `device` whose whole state is derived from the secret and `purpose`."""
    seed = derive_seed(secret, purpose)
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    if device.type != "cpu":
        return generator  # Philox keys on the full 64-bit seed
    state = generator.get_state().clone()
    offset = _mt_state_offset(state, seed)
    words = _derive_words(secret, purpose, _MT_WORDS)
    packed = b"".join(w.to_bytes(8, "little") for w in words)
    state[offset : offset + len(packed)] = torch.frombuffer(bytearray(packed), dtype=torch.uint8)
    generator.set_state(state)
    return generator


class PrivateRandomness:
    """A run's secret privacy seed and the named generators derived from it.

    `generator(purpose, device)` hands out one generator per purpose (asking twice for the
    same purpose is an error: two identical noise streams would cancel in a difference).
    `state()`/`load_state()` save and restore every handed-out generator for an exact resume;
    both, like `to_json()`, hold secrets and belong only in the run's private folder.
    """

    def __init__(self, secret: int) -> None:
        if not 0 <= int(secret) < 2**SECRET_BITS:
            raise DpsynthError(f"a privacy seed must be a {SECRET_BITS}-bit integer")
        self._secret = int(secret)
        self._generators: dict[str, torch.Generator] = {}

    @classmethod
    def fresh(cls) -> PrivateRandomness:
        """A new secret from the operating system's cryptographic random source."""
        return cls(secrets.randbits(SECRET_BITS))

    def __repr__(self) -> str:  # never print the secret by accident (logs, tracebacks)
        return f"PrivateRandomness(<secret>, streams={sorted(self._generators)})"

    def generator(self, purpose: str, device: torch.device | str = "cpu") -> torch.Generator:
        """A fresh generator on `device` for `purpose` (e.g. "loop/batches", "pge/noise")."""
        if purpose in self._generators:
            raise DpsynthError(f"the random stream {purpose!r} was already handed out")
        generator = _keyed_generator(self._secret, purpose, torch.device(device))
        self._generators[purpose] = generator
        return generator

    def replayable(self, purpose: str) -> torch.Generator:
        """A fresh CPU generator for `purpose` that every process of the run derives again
        (a resume, another rank): for a choice that must come out the same each time the data
        is read, such as which rows of a person are kept. Not handed out, so not saved; its
        purposes live under "replay/" apart from the handed-out streams."""
        return _keyed_generator(self._secret, f"replay/{purpose}", torch.device("cpu"))

    def state(self) -> dict[str, str]:
        """Every handed-out generator's state, hex-encoded, by purpose (secret)."""
        return {
            purpose: bytes(g.get_state().numpy().tobytes()).hex()
            for purpose, g in sorted(self._generators.items())
        }

    def load_state(self, states: Mapping[str, str]) -> None:
        """Restore `state()`; the streams must be exactly the ones handed out so far."""
        if set(states) != set(self._generators):
            raise DataError(
                "the saved random streams do not match this run's "
                f"({sorted(states)} vs {sorted(self._generators)})"
            )
        for purpose, hex_state in states.items():
            raw = torch.frombuffer(bytearray.fromhex(hex_state), dtype=torch.uint8)
            self._generators[purpose].set_state(raw.clone())

    def is_generator_state(self, tensor: torch.Tensor) -> bool:
        """True when `tensor` equals the current state of a handed-out generator.

        The training loop refuses to publish such a tensor, so that a backend cannot put a
        secret stream into its public checkpoint by mistake.
        """
        if tensor.dtype != torch.uint8:
            return False
        flat = tensor.detach().cpu().flatten()
        return any(torch.equal(flat, g.get_state().flatten()) for g in self._generators.values())

    def to_json(self) -> dict[str, Any]:
        """The secret for the run's private folder (never for a release)."""
        return {"format": _FORMAT, "bits": SECRET_BITS, "secret": f"{self._secret:032x}"}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> PrivateRandomness:
        """Inverse of `to_json`; a malformed file is a DataError."""
        try:
            if obj["format"] != _FORMAT:
                raise ValueError(f"unknown format {obj['format']!r}")
            return cls(int(obj["secret"], 16))
        except (KeyError, TypeError, ValueError) as exc:
            raise DataError(f"unreadable privacy seed ({exc})") from None
