"""The run directory: config, checkpoints (safetensors), training log, atomic writes.

Everything at the top level of a run may be published (see docs/privacy.md);
`private/` holds what must never leave the data owner: the run's secret privacy seed, the
states of the generators derived from it, and the opt-in log of losses on private batches.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from dpsynth.errors import DataError, UsageError

CONFIG_FILE = "config.json"
STATE_FILE = "state.json"
WEIGHTS_FILE = "checkpoint.safetensors"
LOG_FILE = "train-log.jsonl"
PREVIEW_FILE = "preview.png"
PRIVATE_DIR = "private"
SECRET_FILE = "secret.json"
RANDOM_STATE_FILE = "random-state.json"
PRIVATE_LOSS_FILE = "train-loss.jsonl"


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Write `data` to a temporary file beside `path`, fsync it, then rename it into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write `obj` as indented JSON, atomically."""
    write_bytes_atomic(path, (json.dumps(obj, indent=2, sort_keys=False) + "\n").encode())


def write_private_json_atomic(path: Path, obj: Any) -> None:
    """Write `obj` as JSON atomically into a folder only the owner can read (0700, file 0600)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    # mkstemp creates the temporary file with mode 0600, so the secret is never world-readable.
    write_bytes_atomic(path, (json.dumps(obj, indent=2) + "\n").encode())
    os.chmod(path, 0o600)


def read_json(path: Path) -> Any:
    """Read a JSON file; a malformed one is a DataError naming it."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise UsageError(f"no such file: {path}") from None
    except RecursionError:
        raise DataError(f"{path}: unreadable JSON (nested too deeply)") from None
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DataError(f"{path}: unreadable JSON ({exc})") from None


class RunDir:
    """A run directory as DESIGN.md section 6 lays it out."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)

    @property
    def config_path(self) -> Path:
        """`config.json`: method, preset, hyper-parameters, data info, privacy plan, ledger ids."""
        return self.path / CONFIG_FILE

    @property
    def log_path(self) -> Path:
        """`train-log.jsonl`: one line per logged step (step, ε spent, released stats); public."""
        return self.path / LOG_FILE

    @property
    def preview_path(self) -> Path:
        """`preview.png`: a grid of samples written at the end of training."""
        return self.path / PREVIEW_FILE

    @property
    def private_path(self) -> Path:
        """`private/`: the secret privacy seed, its generator states, private-batch losses."""
        return self.path / PRIVATE_DIR

    @property
    def private_log_path(self) -> Path:
        """`private/train-loss.jsonl`: losses on private batches (only with --log-private-loss)."""
        return self.private_path / PRIVATE_LOSS_FILE

    def write_secret(self, secret: Mapping[str, Any]) -> None:
        """Write the run's privacy seed to `private/secret.json` (0600), atomically."""
        write_private_json_atomic(self.private_path / SECRET_FILE, dict(secret))

    def read_secret(self) -> dict[str, Any]:
        """The run's privacy seed; a run without one (made before 0.2) cannot be resumed."""
        path = self.private_path / SECRET_FILE
        if not path.is_file():
            raise UsageError(
                f"{self.path} has no {PRIVATE_DIR}/{SECRET_FILE}: it was started by an earlier "
                "dpsynth whose DP randomness was not secret; start a new run"
            )
        return read_json(path)

    def exists(self) -> bool:
        """True when the directory holds a run (has a config)."""
        return self.config_path.is_file()

    def check_new(self) -> None:
        """Refuse to start a new run in a file, a folder that already has content, or a place
        where the folder cannot be created (checked before any budget is reserved)."""
        if self.path.exists() and not self.path.is_dir():
            raise UsageError(f"{self.path} is a file, not a run directory; choose another --out")
        if self.path.exists() and any(self.path.iterdir()):
            hint = "use --resume to continue it" if self.exists() else "choose another --out"
            raise UsageError(f"{self.path} exists and is not empty; {hint}")
        parent = self.path.absolute().parent
        while not parent.exists():
            parent = parent.parent
        if not parent.is_dir():
            raise UsageError(f"--out {self.path}: {parent} is a file, not a folder")
        if not os.access(parent if not self.path.exists() else self.path, os.W_OK | os.X_OK):
            raise UsageError(f"--out {self.path}: no permission to write there")

    def read_config(self) -> dict[str, Any]:
        """The run's config; UsageError if this is not a run directory."""
        if not self.exists():
            raise UsageError(f"{self.path} is not a dpsynth run directory (no {CONFIG_FILE})")
        return read_json(self.config_path)

    def write_config(self, config: Mapping[str, Any]) -> None:
        """Write `config.json` atomically."""
        self.path.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.config_path, dict(config))

    def append_log(self, record: Mapping[str, Any]) -> None:
        """Append one JSON line to the training log."""
        with self.log_path.open("a") as handle:
            handle.write(json.dumps(dict(record)) + "\n")

    def append_private_log(self, record: Mapping[str, Any]) -> None:
        """Append one JSON line to `private/train-loss.jsonl`."""
        self.private_path.mkdir(mode=0o700, parents=True, exist_ok=True)
        with self.private_log_path.open("a") as handle:
            handle.write(json.dumps(dict(record)) + "\n")

    def truncate_log(self, after_step: int) -> None:
        """Drop log lines past `after_step` (steps redone after resuming from a checkpoint)."""
        for path in (self.log_path, self.private_log_path):
            if not path.exists():
                continue
            kept = [
                line
                for line in path.read_text().splitlines()
                if line.strip() and json.loads(line).get("step", 0) <= after_step
            ]
            write_bytes_atomic(path, "".join(line + "\n" for line in kept).encode())

    def save_checkpoint(
        self,
        tensors: Mapping[str, torch.Tensor],
        state: Mapping[str, Any],
        private_state: Mapping[str, Any] | None = None,
    ) -> None:
        """Write weights and resume state atomically; the step lives in both, and must agree.

        `private_state` (the secret generator states) goes to `private/random-state.json`,
        written first and keyed by step, keeping the previous step's entry too: a crash
        between the two writes leaves the weights at a step the private file still holds.
        """
        if private_state is not None:
            self._save_private_state(int(state["step"]), private_state)
        payload = {k: v.detach().contiguous().cpu() for k, v in tensors.items()}
        metadata = {"state": json.dumps(dict(state))}
        fd, tmp = tempfile.mkstemp(prefix=f".{WEIGHTS_FILE}.", suffix=".tmp", dir=self.path)
        os.close(fd)
        try:
            save_file(payload, tmp, metadata=metadata)
            with open(tmp, "rb") as handle:
                os.fsync(handle.fileno())
            os.replace(tmp, self.path / WEIGHTS_FILE)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        write_json_atomic(self.path / STATE_FILE, dict(state))

    def _save_private_state(self, step: int, private_state: Mapping[str, Any]) -> None:
        path = self.private_path / RANDOM_STATE_FILE
        by_step = read_json(path).get("by_step", {}) if path.is_file() else {}
        # Keep the entry of the checkpoint now on disk, in case the weights write fails.
        state_path = self.path / STATE_FILE
        on_disk = str(read_json(state_path)["step"]) if state_path.is_file() else None
        entries = {on_disk: by_step[on_disk]} if on_disk in by_step else {}
        entries[str(step)] = dict(private_state)
        write_private_json_atomic(path, {"by_step": entries})

    def load_private_state(self, step: int) -> dict[str, Any]:
        """The private generator states saved with the checkpoint of `step`."""
        path = self.private_path / RANDOM_STATE_FILE
        by_step = read_json(path).get("by_step", {}) if path.is_file() else {}
        if str(step) not in by_step:
            raise DataError(
                f"{path}: no saved random state for step {step}; the private folder does not "
                "belong to this checkpoint"
            )
        return dict(by_step[str(step)])

    def has_checkpoint(self) -> bool:
        """True when a checkpoint has been written."""
        return (self.path / WEIGHTS_FILE).is_file()

    def load_checkpoint(
        self, device: torch.device | str = "cpu"
    ) -> tuple[dict[str, torch.Tensor], dict]:
        """Tensors and state of the last checkpoint (the state is read from the weights file)."""
        path = self.path / WEIGHTS_FILE
        try:
            from safetensors import safe_open

            with safe_open(str(path), framework="pt") as handle:
                state = json.loads((handle.metadata() or {})["state"])
            tensors = load_file(str(path), device=str(device))
        except FileNotFoundError:
            raise UsageError(f"{self.path} has no checkpoint yet") from None
        except Exception as exc:
            raise DataError(f"{path}: unreadable checkpoint ({exc})") from None
        return tensors, state
