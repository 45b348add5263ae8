"""The training loop every backend shares: plan, reserve, Poisson steps, checkpoints, resume.

Order of events for a new run, which is the privacy contract:
1. load the data set's public description (N, shape, classes, fingerprint);
2. compute the privacy plan (σ from the target ε, δ, q, T and the dataset's earlier spends);
3. reserve the spend in the ledger (fsynced; refused with exit 3 over a budget cap);
4. only then read records, one Poisson batch per step, through the backend's private step;
5. complete the ledger entry with the steps actually taken.
A crash after 3 leaves the reservation counted in full; `--resume` continues the same plan
and ledger entry from the last checkpoint, with the same random streams, so the total number of
steps (and so the ε spent) is exactly the plan's.

The random streams of the mechanisms (Poisson batches, noise) come from a secret drawn from
the OS for each run and written only to the run's `private/` folder before the first read of
a record (`dpsynth.privacy.randomness`); `seed` drives public randomness only (initialisation,
the preview). The publishable `train-log.jsonl` holds the step, ε so far and the stats the
backend declares released; losses on private batches go to `private/` only on request.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib.metadata import version
from pathlib import Path
from typing import Any

import torch

from dpsynth import __version__
from dpsynth.data.images import DataInfo, ImageData
from dpsynth.data.schema import parse_schema
from dpsynth.data.sources import is_table_spec, load_data, load_table
from dpsynth.data.tabular import TableData
from dpsynth.distributed import Launch, PeerFailed, broadcast, launch_from_env, process_group
from dpsynth.errors import DataError, DpsynthError, UsageError
from dpsynth.methods.base import Method, Trainer
from dpsynth.methods.registry import get_method, method_names
from dpsynth.privacy.accounting import default_delta, epsilon_for
from dpsynth.privacy.anchors import (
    AnchorError,
    SpendAnchor,
    check_plan_parameters,
    not_dp_label,
    run_config_digest,
    verified_spend,
)
from dpsynth.privacy.central import central_plan_in, release_central_images
from dpsynth.privacy.dpsgd import PoissonSampler
from dpsynth.privacy.ledger import Ledger
from dpsynth.privacy.plan import PrivacyPlan, PrivacyTarget
from dpsynth.privacy.randomness import PrivateRandomness
from dpsynth.runs import RunDir
from dpsynth.visuals import save_grid

# ε shown while training is a valid upper bound computed on a coarser accountant mesh (cheap).
_PROGRESS_REL_ERROR = 0.05
_PROGRESS_EPSILON_POINTS = 20


@dataclass(frozen=True)
class TrainProgress:
    """One progress report from the loop to whoever renders it."""

    step: int
    total_steps: int
    # The mean loss of the step's private batch, computed without noise: None unless the
    # data owner asked for it (--log-private-loss), so that no default display shows it.
    loss: float | None
    epsilon: float


ProgressCallback = Callable[[TrainProgress], None]


def resolve_device(device: str) -> torch.device:
    """`auto` → CUDA when present, else CPU; `cuda` without a GPU is a UsageError."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        chosen = torch.device(device)
    except RuntimeError:
        raise UsageError(f"--device must be auto, cpu or cuda[:N], got {device!r}") from None
    if chosen.type == "cuda":
        if not torch.cuda.is_available():
            raise UsageError("--device cuda was asked for, but no CUDA device is available")
        if chosen.index is not None and chosen.index >= torch.cuda.device_count():
            raise UsageError(f"--device {device}: only {torch.cuda.device_count()} CUDA devices")
    elif chosen.type != "cpu":
        raise UsageError(f"--device must be auto, cpu or cuda[:N], got {device!r}")
    return chosen


def parse_epsilon(value: str | float) -> float:
    """`inf` (the non-private baseline) or a positive finite number."""
    try:
        epsilon = float(value)
    except ValueError:
        raise UsageError(f"--epsilon must be a number or 'inf', got {value!r}") from None
    if math.isnan(epsilon) or epsilon <= 0:
        raise UsageError(f"--epsilon must be positive (or 'inf' for no privacy), got {value!r}")
    return epsilon


def _package_versions() -> dict[str, str]:
    names = ("torch", "prv-accountant", "numpy", "safetensors")
    return {"dpsynth": __version__, **{name: version(name) for name in names}}


@dataclass(frozen=True)
class TrainRequest:
    """Everything one `train` needs: built by the CLI from its flags (or by Python code) and
    checked by `validate` before anything is read or written.

    A new run needs `method`, `data`, `epsilon` and `ledger_path`; `resume=True` needs only
    `out` (the run's recorded settings are used, and its recorded ledger when `ledger_path` is
    None). `epsilon` is the data set's total budget after this run ("inf": not private).
    `stop_after_steps` and `privacy_seed` are for tests only (see `train`).
    """

    out: Path | str
    method: str | None = None
    data: str | None = None
    epsilon: float | str | None = None
    delta: float | None = None
    preset: str = "auto"
    ledger_path: Path | str | None = None
    device: str = "auto"
    seed: int = 0
    resume: bool = False
    overrides: Mapping[str, Any] = field(default_factory=dict)
    image_size: int | None = None
    dataset_id: str | None = None
    classes: tuple[str, ...] | None = None
    channels: int | None = None
    checkpoint_every_s: float = 120.0
    stop_after_steps: int | None = None
    log_private_loss: bool = False
    privacy_seed: int | None = None
    # Tables: the schema file (default: a built-in table's bundled schema), and what to do with
    # its entries read off the data (declare them public, or release them with DP).
    schema: Path | str | None = None
    schema_public: bool = False
    schema_epsilon: float | None = None
    # Tables: release the target's class proportions with DP (this ε, part of the total).
    class_weights_epsilon: float | None = None

    @staticmethod
    def check_complete(
        *, resume: bool, method: str | None, data: str | None, epsilon: float | str | None
    ) -> None:
        """UsageError naming what a new run lacks (--method, --data, --epsilon); a resumed run
        takes them from its directory."""
        if resume:
            return
        given = (("--method", method), ("--data", data), ("--epsilon", epsilon))
        missing = [flag for flag, value in given if value is None]
        if missing:
            raise UsageError(f"missing {', '.join(missing)} (or use --resume)")

    def validate(self) -> None:
        """UsageError (exit 2) for a request that cannot start, before anything is read."""
        self.check_complete(
            resume=self.resume, method=self.method, data=self.data, epsilon=self.epsilon
        )
        resolve_device(self.device)
        if not (self.checkpoint_every_s >= 0 and math.isfinite(self.checkpoint_every_s)):
            raise UsageError(
                f"--checkpoint-every must be a number of seconds ≥ 0, got {self.checkpoint_every_s}"
            )
        if not -(2**63) <= self.seed < 2**63:
            raise UsageError(f"--seed must fit in 64 bits, got {self.seed}")
        if not self.resume:
            if self.ledger_path is None:
                raise UsageError("a new run needs a ledger path")
            parse_epsilon(self.epsilon if self.epsilon is not None else "inf")
            table_flags = self.schema is not None or self.schema_public
            released = self.schema_epsilon is not None or self.class_weights_epsilon is not None
            if (table_flags or released) and self.data is not None:
                from dpsynth.data.sources import is_table_spec

                if not is_table_spec(self.data):
                    raise UsageError(
                        "--schema, --schema-public, --schema-epsilon and "
                        "--class-weights-epsilon are for tables"
                    )
            for flag, value in (
                ("--schema-epsilon", self.schema_epsilon),
                ("--class-weights-epsilon", self.class_weights_epsilon),
            ):
                if value is not None and not (math.isfinite(value) and value > 0):
                    raise UsageError(f"{flag} must be a positive number, got {value}")


def train_run(
    *,
    method: str,
    data: str,
    epsilon: float | str,
    delta: float | None = None,
    preset: str = "auto",
    out: Path | str,
    ledger_path: Path | str | None,
    device: str = "auto",
    seed: int = 0,
    resume: bool = False,
    overrides: Mapping[str, Any] | None = None,
    image_size: int | None = None,
    dataset_id: str | None = None,
    classes: tuple[str, ...] | None = None,
    channels: int | None = None,
    checkpoint_every_s: float = 120.0,
    progress: ProgressCallback | None = None,
    stop_after_steps: int | None = None,
    log_private_loss: bool = False,
    privacy_seed: int | None = None,
    schema: Path | str | None = None,
    schema_public: bool = False,
    schema_epsilon: float | None = None,
    class_weights_epsilon: float | None = None,
) -> dict[str, Any]:
    """`train` with the request's fields as keyword arguments (see `TrainRequest`)."""
    request = TrainRequest(
        out=out,
        method=method,
        data=data,
        epsilon=epsilon,
        delta=delta,
        preset=preset,
        ledger_path=ledger_path,
        device=device,
        seed=seed,
        resume=resume,
        overrides=dict(overrides or {}),
        image_size=image_size,
        dataset_id=dataset_id,
        classes=classes,
        channels=channels,
        checkpoint_every_s=checkpoint_every_s,
        stop_after_steps=stop_after_steps,
        log_private_loss=log_private_loss,
        privacy_seed=privacy_seed,
        schema=schema,
        schema_public=schema_public,
        schema_epsilon=schema_epsilon,
        class_weights_epsilon=class_weights_epsilon,
    )
    return train(request, progress)


def train(request: TrainRequest, progress: ProgressCallback | None = None) -> dict[str, Any]:
    """Train a backend on a data set under a DP guarantee and return a JSON-ready summary.

    `request.epsilon` is the data set's total budget after this run: earlier spends recorded in
    the ledger for the same dataset are composed in when σ is calibrated. `stop_after_steps`
    ends the loop early as an interruption would (checkpoint written, ledger entry left
    reserved); tests use it to exercise `resume`. With `resume` and no `ledger_path`, the
    ledger the run recorded is used. `log_private_loss` writes the noise-free losses of the
    private batches to `RUN/private/train-loss.jsonl` (and shows them in progress reports).
    `privacy_seed` fixes the secret of the DP randomness for tests only: a known secret
    voids the guarantee, so the CLI never passes it (a fresh OS secret is drawn instead).
    `progress` receives a `TrainProgress` now and then.

    Under `torchrun` (see `dpsynth.distributed`) every rank calls `train` with the same
    request: rank 0 plans, reserves, writes the run dir and the ledger, and sends the others
    the run's settings, its secret and (on resume) the checkpoint; every rank then reads the
    data and trains on its share of each global Poisson batch. Only rank 0's summary is the
    run's; the other ranks return a short one.
    """
    request.validate()
    launch = launch_from_env()
    if launch is None:
        return _train(request, progress, resolve_device(request.device), None)
    with process_group(launch, request.device) as device:
        return _train(request, progress, device, launch)


@dataclass
class _Session:
    """What the loop needs to run: built by rank 0 (or one process) from the request or the
    run dir, by another rank from rank 0's start message."""

    run: RunDir | None  # None on ranks other than 0: they write nothing
    ledger: Ledger | None
    backend: Method
    records: ImageData
    info: DataInfo
    config: Mapping[str, Any]
    plan: PrivacyPlan
    trainer: Trainer
    sampler: PoissonSampler
    randomness: PrivateRandomness
    run_config: dict[str, Any]
    start_step: int
    warnings: list[str]
    # The restored trainer tensors of a resumed run (None for a new one), for the other ranks.
    restored: dict[str, torch.Tensor] | None = None
    # The secret stream of the plan's central-images release (None when it has none).
    central_rng: torch.Generator | None = None

    def start_message(self) -> dict[str, Any]:
        """What the other ranks need to join: settings, the secret, the streams' states."""
        return {
            "run_config": self.run_config,
            "secret": self.randomness.to_json(),
            "generators": self.randomness.state(),
            "tensors": self.restored,
            "start_step": self.start_step,
            "warnings": self.warnings,
        }


def _train(
    request: TrainRequest,
    progress: ProgressCallback | None,
    device: torch.device,
    launch: Launch | None,
) -> dict[str, Any]:
    loop_args = {
        "device": device,
        "checkpoint_every_s": request.checkpoint_every_s,
        "stop_after_steps": request.stop_after_steps,
        "launch": launch,
    }
    if launch is not None and not launch.is_main:
        message = broadcast(None, device)
        if "error" in message:
            raise PeerFailed(int(message["error"]))
        if "finished" in message:
            return message["finished"]
        return _loop(_join(message["start"], device), progress=None, **loop_args)
    try:
        session = _start(request, device, launch)
    except BaseException as exc:
        if launch is not None:  # the other ranks wait for the start message: end them too
            code = 130 if isinstance(exc, KeyboardInterrupt) else getattr(exc, "exit_code", 1)
            _tell_quietly({"error": code}, device)
        raise
    if isinstance(session, dict):  # a resumed run that had already finished
        if launch is not None:
            broadcast({"finished": session}, device)
        return session
    if launch is not None:
        broadcast({"start": session.start_message()}, device)
    return _loop(session, progress=progress, **loop_args)


def _tell_quietly(message: dict[str, Any], device: torch.device) -> None:
    """Broadcast `message` if the other ranks can still hear it (they may be gone)."""
    with contextlib.suppress(Exception):  # the original error is the one to report
        broadcast(message, device)


def _join(start: Mapping[str, Any], device: torch.device) -> _Session:
    """A rank other than 0 joins the run rank 0 started: it reads the same data (checked by
    fingerprint), builds the same trainer and streams, and restores the same state."""
    run_config = dict(start["run_config"])
    data_cfg = run_config["data"]
    records = _load_recorded(data_cfg, "rank 0's run")
    info = records.info()
    if info.fingerprint != data_cfg["fingerprint"]:
        raise DataError(
            f"{data_cfg['spec']}: this rank reads different records than rank 0 (fingerprint "
            "differs); every node must see the same data"
        )
    backend = get_method(run_config["method"])
    plan = PrivacyPlan.from_json(run_config["privacy"])
    randomness = PrivateRandomness.from_json(start["secret"])
    trainer = backend.trainer(
        info, run_config["config"], plan, device, run_config["seed"], randomness
    )
    sampler = PoissonSampler(info.n, plan.sampling_rate, randomness.generator("loop/batches"))
    central_rng = _central_generator(plan, randomness)
    if start["tensors"] is not None:
        trainer.load_state_tensors(start["tensors"])
    randomness.load_state(start["generators"])
    return _Session(
        run=None,
        ledger=None,
        backend=backend,
        records=records,
        info=info,
        config=run_config["config"],
        plan=plan,
        trainer=trainer,
        sampler=sampler,
        randomness=randomness,
        central_rng=central_rng,
        run_config=run_config,
        start_step=int(start["start_step"]),
        warnings=list(start["warnings"]),
        restored=start["tensors"],
    )


def _start(
    request: TrainRequest, torch_device: torch.device, launch: Launch | None
) -> _Session | dict[str, Any]:
    """Plan, reserve and write a new run, or check and load a run to resume (rank 0)."""
    out, ledger_path, preset, seed = request.out, request.ledger_path, request.preset, request.seed
    log_private_loss, privacy_seed = request.log_private_loss, request.privacy_seed
    image_size, channels = request.image_size, request.channels
    delta = request.delta
    run = RunDir(out)
    if request.resume:
        # Without a ledger given, the run's own (recorded) ledger; the anchor is checked anyway.
        ledger = Ledger(ledger_path or _recorded_ledger(run))
        return _resume(run, ledger, torch_device, log_private_loss)
    assert ledger_path is not None and request.method is not None and request.data is not None
    ledger = Ledger(ledger_path)
    target_epsilon = parse_epsilon(request.epsilon if request.epsilon is not None else "inf")
    backend = get_method(request.method)
    run.check_new()
    run_id = uuid.uuid4().hex[:12]
    # Drawn before anything is read; it reaches the disk only in the run's private folder.
    randomness = (
        PrivateRandomness(privacy_seed) if privacy_seed is not None else PrivateRandomness.fresh()
    )
    schema_release = None
    if is_table_spec(request.data):
        records, schema_release = _load_table(
            request, backend, ledger, target_epsilon, run_id, randomness
        )
    else:
        _check_modality(backend, "image")
        records = load_data(
            request.data,
            image_size=image_size,
            dataset_id=request.dataset_id,
            classes=request.classes,
            channels=channels,
        )
    info = records.info()
    warnings: list[str] = list((schema_release or {}).get("warnings", []))
    if delta is None:
        delta = default_delta(info.n)
    elif delta >= 1.0 / info.n:
        warnings.append(
            f"δ={delta:g} is not below 1/N = {1.0 / info.n:.3g}: a mechanism could release a "
            "whole record with that probability; use a smaller --delta"
        )
    preset = resolve_preset(backend, preset, info, target_epsilon)
    config = backend.config(preset, dict(request.overrides), info)
    # Everything that can fail for a reason known before the first private read fails here,
    # before the spend is reserved: the config's values, then the plan, then building the
    # trainer and the batch sampler (weights from the seed, never from the data).
    backend.validate_config(config, info)
    target = PrivacyTarget(target_epsilon, float(delta))
    # Budgets follow the data: spends linked by dataset id or fingerprint are composed in.
    prior = ledger.events_for(info.dataset_id, info.fingerprint)
    plan = backend.plan(info, target, config, prior)
    try:
        trainer = backend.trainer(info, config, plan, torch_device, seed, randomness)
        sampler = PoissonSampler(info.n, plan.sampling_rate, randomness.generator("loop/batches"))
        central_rng = _central_generator(plan, randomness)
    except (ValueError, TypeError, OverflowError, RuntimeError, MemoryError) as exc:
        # e.g. an optimizer refusing a value, a seed out of range, a network too large to build
        raise UsageError(
            f"--method {backend.name} cannot start with these settings: {exc}"
        ) from None
    # `classes` (in info) and `channels` let --resume read the data the same way
    data_json = {**info.to_json(), "image_size": image_size, "channels": channels}
    # The spend binds what config.json will say about method, settings, data and plan.
    bound = {"method": backend.name, "config": config, "data": data_json, "privacy": plan.to_json()}
    entry = ledger.reserve(
        dataset_id=info.dataset_id,
        fingerprint=info.fingerprint,
        command="train",
        method=backend.name,
        run_id=run_id,
        events=list(plan.events),
        delta=plan.delta,
        private=plan.private,
        # Another process may have spent on this dataset since the plan was made.
        max_total_epsilon=plan.target_epsilon if plan.private else None,
        config_sha256=run_config_digest(bound),
    )
    run_config = {
        "run_id": run_id,
        "method": backend.name,
        "preset": preset,
        "config": config,
        "data": data_json,
        "privacy": plan.to_json(),
        "private": plan.private,
        "ledger": {
            "path": str(Path(ledger_path).resolve()),
            "spend_seq": entry["seq"],
            "spend_hash": entry["hash"],
        },
        "seed": seed,
        "seed_scope": (
            "public randomness only (initialisation, preview); the DP mechanisms draw from a "
            "secret seed kept in private/"
        ),
        "log_private_loss": bool(log_private_loss),
        "device": str(torch_device),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "versions": _package_versions(),
        "warnings": warnings,
    }
    if schema_release is not None:
        run_config["schema_release"] = schema_release
    if launch is not None:  # informational: the mechanism is the same for any world size
        run_config["launch"] = {"world_size": launch.world_size}
    try:
        run.write_config(run_config)
        # On disk before the first record is read, so that a crash can still be resumed.
        run.write_secret(randomness.to_json())
    except BaseException:
        # Nothing was read yet: the reservation is closed at zero cost.
        ledger.abort(entry["seq"], events=[], run_id=run_id, fingerprint=info.fingerprint)
        raise
    return _Session(
        run=run,
        ledger=ledger,
        backend=backend,
        records=records,
        info=info,
        config=config,
        plan=plan,
        trainer=trainer,
        sampler=sampler,
        randomness=randomness,
        central_rng=central_rng,
        run_config=run_config,
        start_step=0,
        warnings=warnings,
    )


def _load_recorded(data_cfg: Mapping[str, Any], name: str) -> ImageData | TableData:
    """The data a run recorded in config.json, read the same way (resume, other ranks)."""
    if data_cfg.get("modality") == "table":
        # The run's schema is public (declared or released when the run began): no new release.
        return load_table(
            data_cfg["spec"],
            parse_schema(data_cfg["schema"], f"{name} schema"),
            dataset_id=data_cfg["dataset_id"],
        )
    return load_data(
        data_cfg["spec"],
        image_size=data_cfg.get("image_size"),
        dataset_id=data_cfg["dataset_id"],
        classes=data_cfg.get("classes"),
        channels=data_cfg.get("channels"),
    )


def resolve_preset(backend: Method, preset: str, info: DataInfo, epsilon: float) -> str:
    """`preset`, or for `auto` the backend's recommendation for this data's public shape and
    size at the target ε (no data is read: the choice spends no budget)."""
    return backend.recommended_preset(info, epsilon) if preset == "auto" else preset


def _check_modality(backend: Method, modality: str) -> None:
    """UsageError (exit 2) when the backend cannot train on this kind of data."""
    if modality not in backend.modalities:
        others = [n for n in method_names() if modality in get_method(n).modalities]
        kind = "image-only" if backend.modalities == ("image",) else "not for " + modality + "s"
        raise UsageError(
            f"--method {backend.name} is {kind}; for {modality}s use --method "
            f"{' or '.join(others) or '(none)'}"
        )


def _load_table(
    request: TrainRequest,
    backend: Method,
    ledger: Ledger,
    target_epsilon: float,
    run_id: str,
    randomness: PrivateRandomness,
) -> tuple[TableData, dict[str, Any] | None]:
    """The table under a public schema; with --schema-epsilon its release is spent first."""
    from dpsynth.tables import prepare_table

    _check_modality(backend, "table")
    if request.image_size is not None or request.channels is not None:
        raise UsageError("--image-size and --channels are for images, not tables")
    if request.classes is not None:
        raise UsageError("a table's classes are its schema's target categories; drop --classes")

    def delta_for(n: int) -> float:
        return float(request.delta) if request.delta is not None else default_delta(n)

    def plan_check(info: DataInfo, events: tuple[dict[str, Any], ...]) -> None:
        preset = resolve_preset(backend, request.preset, info, target_epsilon)
        config = backend.config(preset, dict(request.overrides), info)
        backend.validate_config(config, info)
        prior = (*ledger.events_for(info.dataset_id, info.fingerprint or None), *events)
        backend.plan(info, PrivacyTarget(target_epsilon, delta_for(info.n)), config, prior)

    assert request.data is not None
    return prepare_table(
        spec=request.data,
        schema_path=request.schema,
        schema_public=request.schema_public,
        schema_epsilon=request.schema_epsilon,
        class_weights_epsilon=request.class_weights_epsilon,
        dataset_id=request.dataset_id,
        ledger=ledger,
        delta_for=delta_for,
        target_epsilon=target_epsilon,
        method=backend.name,
        run_id=run_id,
        randomness=randomness,
        plan_check=plan_check,
    )


def _recorded_ledger(run: RunDir) -> Path:
    recorded = run.read_config().get("ledger")
    path = recorded.get("path") if isinstance(recorded, dict) else None
    if not isinstance(path, str) or not path:
        raise DataError(f"{run.path}: config.json records no ledger path; pass --ledger")
    return Path(path)


def _resume(
    run: RunDir, ledger: Ledger, device: torch.device, log_private_loss: bool
) -> _Session | dict[str, Any]:
    run_config = run.read_config()
    name = str(run.path)
    try:
        backend = get_method(run_config["method"])
        data_cfg = run_config["data"]
        plan = PrivacyPlan.from_json(run_config["privacy"])
        run_id = str(run_config["run_id"])
        dataset_id, fingerprint = str(data_cfg["dataset_id"]), str(data_cfg["fingerprint"])
        anchor = SpendAnchor.from_run_config(run_config, name)
    except UsageError as exc:
        if isinstance(exc, AnchorError):
            raise
        raise DataError(f"{name}: config.json is not valid for resuming ({exc})") from None
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise DataError(f"{name}: config.json is not valid for resuming ({exc!r})") from None
    # The spend this run may close is the one its anchor points at, checked before any data
    # is read: same hash, this run id and data, and events equal to the plan the loop will use.
    check_plan_parameters(
        plan.events,
        private=plan.private,
        noise_multiplier=plan.noise_multiplier,
        sampling_rate=plan.sampling_rate,
        steps=plan.steps,
        run_name=name,
    )
    spend = verified_spend(
        ledger,
        anchor,
        run_id=run_id,
        dataset_id=dataset_id,
        fingerprint=fingerprint,
        events=plan.events,
        run_name=name,
        run_config=run_config,
    )
    seq = anchor.seq
    if spend.get("status") == "completed":
        return {**_summary(run, run_config, ledger, plan, plan.steps), "already_finished": True}
    if spend.get("status") == "aborted":
        raise UsageError(f"the ledger entry of this run (seq {seq}) was aborted; start a new run")
    records = _load_recorded(data_cfg, name)
    info = records.info()
    if info.fingerprint != data_cfg["fingerprint"]:
        raise DataError(
            f"{data_cfg['spec']}: the data changed since this run started "
            "(fingerprint differs); a resumed run must see the same records"
        )
    if log_private_loss:  # asked for at resume time: log the remaining steps' losses too
        run_config = {**run_config, "log_private_loss": True}
    randomness = PrivateRandomness.from_json(run.read_secret())
    trainer = backend.trainer(
        info, run_config["config"], plan, device, run_config["seed"], randomness
    )
    sampler = PoissonSampler(info.n, plan.sampling_rate, randomness.generator("loop/batches"))
    central_rng = _central_generator(plan, randomness)
    start = 0
    restored = None
    if run.has_checkpoint():
        tensors, state = run.load_checkpoint()
        restored = {
            k.removeprefix("trainer/"): v for k, v in tensors.items() if k.startswith("trainer/")
        }
        trainer.load_state_tensors(restored)
        start = int(state["step"])
        randomness.load_state(run.load_private_state(start)["generators"])
    run.truncate_log(start)
    return _Session(
        run=run,
        ledger=ledger,
        backend=backend,
        records=records,
        info=info,
        config=run_config["config"],
        plan=plan,
        trainer=trainer,
        sampler=sampler,
        randomness=randomness,
        central_rng=central_rng,
        run_config=run_config,
        start_step=start,
        warnings=run_config.get("warnings", []),
        restored=restored,
    )


def _central_generator(plan: PrivacyPlan, randomness: PrivateRandomness) -> torch.Generator | None:
    """The secret stream of the plan's central-images release, handed out with the loop's
    other streams (so that a checkpoint saves and restores it with them)."""
    if central_plan_in(plan.events) is None:
        return None
    return randomness.generator("loop/central-images")


def _warm_start(session: _Session, pixels: torch.Tensor, labels: torch.Tensor) -> None:
    """Release the plan's central images and hand them to the trainer, once per run.

    Only a run that starts from scratch does it: a resumed run's checkpoint already holds the
    warm-started weights (and the stream's state after the release). A run resumed before its
    first checkpoint redoes it from the fresh secret stream, which draws the same noise, so
    the release is the same one the plan accounted for.
    """
    release_plan = central_plan_in(session.plan.events)
    if release_plan is None or session.start_step > 0 or session.restored is not None:
        return
    assert session.central_rng is not None
    release = release_central_images(
        pixels.cpu(), labels.cpu(), len(session.info.classes), release_plan, session.central_rng
    )
    session.trainer.warm_start(release)


class _EpsilonCurve:
    """ε upper bounds of this run after t steps, computed at a few points and reused."""

    def __init__(self, plan: PrivacyPlan) -> None:
        self.plan = plan
        points = max(1, min(_PROGRESS_EPSILON_POINTS, plan.steps))
        self.marks = sorted({max(1, round(plan.steps * (k + 1) / points)) for k in range(points)})
        self.cache: dict[int, float] = {}
        self.one_off_events = tuple(
            e
            for e in plan.events
            if e.get("type") not in ("poisson_gaussian", "non_private")
            or e.get("mechanism") == "dp_classifier"  # a DP teacher's steps: not the loop's
        )

    def at(self, step: int) -> float:
        """Upper bound on ε after `step` steps, taken at the next mark (never an under-count)."""
        if not self.plan.private:
            return math.inf
        if step <= 0:
            return 0.0
        mark = next((m for m in self.marks if m >= step), self.plan.steps)
        if mark >= self.plan.steps:
            # The plan's certified (fine-mesh) bound for the whole run.
            return self.plan.epsilon_bound
        if mark not in self.cache:
            # ε grows with the number of steps, so the whole run's bound caps every prefix.
            # The plan's one-off releases (a warm start's central images, DPAF's once
            # release) are counted from the first step on, wherever the loop makes them.
            self.cache[mark] = min(
                self.plan.epsilon_bound,
                epsilon_for(
                    self.plan.noise_multiplier,
                    self.plan.sampling_rate,
                    mark,
                    self.plan.delta,
                    self.one_off_events,
                    rel_error=_PROGRESS_REL_ERROR,
                ).epsilon,
            )
        return self.cache[mark]


def _loop(
    session: _Session,
    *,
    device: torch.device,
    checkpoint_every_s: float,
    progress: ProgressCallback | None,
    stop_after_steps: int | None,
    launch: Launch | None,
) -> dict[str, Any]:
    """Steps from `session.start_step` to the plan's end (or `stop_after_steps` more).

    Under torchrun every rank runs the same steps on the same global batches; only rank 0
    logs, checkpoints, shows progress and completes the ledger entry.
    """
    if session.run is None or session.ledger is None:
        return _follower_loop(session, device, stop_after_steps, launch)
    run, ledger, backend, records = session.run, session.ledger, session.backend, session.records
    info, config, plan, trainer = session.info, session.config, session.plan, session.trainer
    sampler, randomness, run_config = session.sampler, session.randomness, session.run_config
    start_step, warnings = session.start_step, session.warnings
    pixels = records.as_float().to(device)
    labels = records.y.to(device)
    curve = _EpsilonCurve(plan)
    log_every = max(1, plan.steps // 200)
    last_checkpoint = time.monotonic()
    step = start_step
    seq = int(run_config["ledger"]["spend_seq"])

    log_private = bool(run_config.get("log_private_loss"))
    released = tuple(type(trainer).released_stats)
    if start_step == 0 and not run.has_checkpoint():
        _warm_start(session, pixels, labels)

    def checkpoint() -> None:
        tensors = {f"trainer/{k}": v for k, v in trainer.state_tensors().items()}
        for name, tensor in tensors.items():
            if randomness.is_generator_state(tensor):
                raise DpsynthError(
                    f"{name} is the state of a secret random stream; backends must leave "
                    "those to the training loop, which keeps them private"
                )
        run.save_checkpoint(
            tensors,
            {"step": step, "run_id": run_config["run_id"]},
            private_state={"generators": randomness.state()},
        )

    try:
        while step < plan.steps:
            if stop_after_steps is not None and step - start_step >= stop_after_steps:
                checkpoint()
                return {
                    **_summary(run, run_config, ledger, plan, step),
                    "interrupted": True,
                    "warnings": warnings,
                }
            stats = trainer.step(*_loop_batch(trainer, step, sampler, pixels, labels, device))
            step += 1
            if launch is not None and step == start_step + 1:
                _check_ranks_agree(trainer, device)
            if step % log_every == 0 or step == plan.steps:
                eps = curve.at(step)
                public = {k: _json_stat(v) for k, v in stats.items() if k in released}
                run.append_log({"step": step, "epsilon": _json_eps(eps), **public})
                loss = None
                if log_private:
                    # Computed on the private batch without noise: the data owner's eyes only.
                    private = {k: _json_stat(v) for k, v in stats.items() if k not in released}
                    run.append_private_log({"step": step, **private})
                    loss = float(stats.get("loss", math.nan))
                if progress is not None:
                    progress(TrainProgress(step, plan.steps, loss, eps))
            if time.monotonic() - last_checkpoint > checkpoint_every_s:
                checkpoint()
                last_checkpoint = time.monotonic()
    except KeyboardInterrupt:
        checkpoint()
        raise
    checkpoint()
    if launch is not None:  # after the checkpoint: a mismatch can then be resumed from it
        _check_ranks_agree(trainer, device)
    _write_preview(run, backend, info, config, trainer, run_config["seed"], device)
    # The loop ends only after all plan.steps steps: the run spent exactly its plan (whose
    # events may split the loop into phases, as DPAF's do).
    ledger.complete(
        seq,
        list(plan.events),
        run_id=run_config["run_id"],
        fingerprint=info.fingerprint,
    )
    summary = {**_summary(run, run_config, ledger, plan, step), "warnings": warnings}
    if run_config.get("schema_release"):
        summary["schema_release"] = run_config["schema_release"]
    return summary


def _loop_batch(
    trainer: Trainer,
    step: int,
    sampler: PoissonSampler,
    pixels: torch.Tensor,
    labels: torch.Tensor,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor]:
    """What loop step `step` hands the trainer: first any whole-data release the trainer's
    plan accounts at this step, then the step's Poisson batch (empty where it reads none)."""
    trainer.release_whole_data(step, pixels, labels)
    if not trainer.reads_batch(step):
        return pixels[:0], labels[:0]
    index = sampler.next().to(device)
    return pixels[index], labels[index]


def _follower_loop(
    session: _Session,
    device: torch.device,
    stop_after_steps: int | None,
    launch: Launch | None,
) -> dict[str, Any]:
    """The loop of a rank other than 0: the same steps, and nothing written or shown."""
    pixels = session.records.as_float().to(device)
    labels = session.records.y.to(device)
    step = start = session.start_step
    _warm_start(session, pixels, labels)
    while step < session.plan.steps:
        if stop_after_steps is not None and step - start >= stop_after_steps:
            return {"rank": launch.rank if launch else 0, "steps": step, "interrupted": True}
        session.trainer.step(
            *_loop_batch(session.trainer, step, session.sampler, pixels, labels, device)
        )
        step += 1
        if step == start + 1:
            _check_ranks_agree(session.trainer, device)
    _check_ranks_agree(session.trainer, device)
    return {"rank": launch.rank if launch else 0, "steps": step}


def _check_ranks_agree(trainer: Trainer, device: torch.device) -> None:
    """Every rank must hold the same model (same start, same released updates): compare a
    digest of the trainer's state across ranks; a mismatch stops every rank."""
    digest = hashlib.sha256()
    for name, tensor in sorted(trainer.state_tensors().items()):
        digest.update(name.encode())
        flat = tensor.detach().cpu().contiguous().reshape(-1)
        digest.update(flat.view(torch.uint8).numpy().tobytes())
    digests: list[Any] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(digests, digest.hexdigest())
    if len(set(digests)) != 1:
        raise DpsynthError(
            "the ranks' models differ (each rank must start from the same weights and apply "
            "the same released updates; use identical devices); the spend stays counted and "
            "--resume restarts every rank from rank 0's last checkpoint"
        )


def _json_eps(value: float) -> float | str:
    return value if math.isfinite(value) else "inf"


def _json_stat(value: float) -> float | None:
    """A logged stat; non-finite (an empty batch's mean) is written as null."""
    value = float(value)
    return value if math.isfinite(value) else None


def _write_preview(
    run: RunDir,
    backend: Method,
    info: DataInfo,
    config: Mapping[str, Any],
    trainer: Trainer,
    seed: int,
    device: torch.device,
) -> None:
    if info.modality != "image":
        return  # a table's preview is a `sample` away; there is no grid to draw
    per_class = 8
    labels = torch.arange(len(info.classes), device=device).repeat_interleave(per_class)
    rng = torch.Generator(device=device).manual_seed(seed + 99)
    batches = list(trainer.generator().sample(labels, 256, rng))
    save_grid(torch.cat(batches).cpu(), run.preview_path, nrow=per_class)


def _summary(
    run: RunDir, run_config: Mapping[str, Any], ledger: Ledger, plan: PrivacyPlan, step: int
) -> dict[str, Any]:
    seq = int(run_config["ledger"]["spend_seq"])
    spend = ledger.spend(seq)
    return {
        "run": str(run.path),
        "run_id": run_config["run_id"],
        "method": run_config["method"],
        "preset": run_config["preset"],
        "dataset_id": run_config["data"]["dataset_id"],
        "private": plan.private,
        "steps": step,
        "total_steps": plan.steps,
        "noise_multiplier": plan.noise_multiplier,
        "sampling_rate": plan.sampling_rate,
        "max_grad_norm": _json_eps(plan.max_grad_norm),
        "delta": plan.delta,
        "epsilon": _json_eps(plan.epsilon_bound),
        "dataset_total_epsilon": spend.get("total_epsilon"),
        "accountant": plan.accountant,
        # A run that added noise under a claimed ε that is not a proven bound says so.
        "privacy_label": not_dp_label(plan.events),
        "ledger_seq": seq,
        "ledger_status": spend.get("status"),
        "preview": str(run.preview_path) if run.preview_path.exists() else None,
    }
