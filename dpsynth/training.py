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
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib.metadata import version
from pathlib import Path
from typing import Any

import torch

from dpsynth import __version__
from dpsynth.data.images import DataInfo, ImageData
from dpsynth.data.sources import load_data
from dpsynth.errors import DataError, UsageError
from dpsynth.methods.base import Method, PrivacyPlan, PrivacyTarget, Trainer
from dpsynth.methods.registry import get_method
from dpsynth.privacy.accounting import default_delta, epsilon_for
from dpsynth.privacy.dpsgd import PoissonSampler
from dpsynth.privacy.ledger import Ledger
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
    loss: float
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


def train_run(
    *,
    method: str,
    data: str,
    epsilon: float | str,
    delta: float | None = None,
    preset: str = "small",
    out: Path | str,
    ledger_path: Path | str,
    device: str = "auto",
    seed: int = 0,
    resume: bool = False,
    overrides: Mapping[str, Any] | None = None,
    image_size: int | None = None,
    dataset_id: str | None = None,
    checkpoint_every_s: float = 120.0,
    progress: ProgressCallback | None = None,
    stop_after_steps: int | None = None,
) -> dict[str, Any]:
    """Train a backend on a data set under a DP guarantee and return a JSON-ready summary.

    `epsilon` is the data set's total budget after this run: earlier spends recorded in the
    ledger for the same dataset are composed in when σ is calibrated. `stop_after_steps` ends
    the loop early as an interruption would (checkpoint written, ledger entry left reserved);
    tests use it to exercise `resume`.
    """
    run = RunDir(out)
    ledger = Ledger(ledger_path)
    torch_device = resolve_device(device)
    if not (checkpoint_every_s >= 0 and math.isfinite(checkpoint_every_s)):
        raise UsageError(
            f"--checkpoint-every must be a number of seconds ≥ 0, got {checkpoint_every_s}"
        )
    if not -(2**63) <= seed < 2**63:
        raise UsageError(f"--seed must fit in 64 bits, got {seed}")
    if resume:
        return _resume(run, ledger, torch_device, checkpoint_every_s, progress, stop_after_steps)
    target_epsilon = parse_epsilon(epsilon)
    backend = get_method(method)
    run.check_new()
    records = load_data(data, image_size=image_size, dataset_id=dataset_id)
    info = records.info()
    warnings: list[str] = []
    if delta is None:
        delta = default_delta(info.n)
    elif delta >= 1.0 / info.n:
        warnings.append(
            f"δ={delta:g} is not below 1/N = {1.0 / info.n:.3g}: a mechanism could release a "
            "whole record with that probability; use a smaller --delta"
        )
    config = backend.config(preset, overrides or {}, info)
    # Everything that can fail for a reason known before the first private read fails here,
    # before the spend is reserved: the config's values, then the plan, then building the
    # trainer and the batch sampler (weights from the seed, never from the data).
    backend.validate_config(config, info)
    target = PrivacyTarget(target_epsilon, float(delta))
    plan = backend.plan(info, target, config, ledger.events_for(info.dataset_id))
    try:
        trainer = backend.trainer(info, config, plan, torch_device, seed)
        sampler = PoissonSampler(info.n, plan.sampling_rate, _loop_generator(seed))
    except (ValueError, TypeError, OverflowError, RuntimeError, MemoryError) as exc:
        # e.g. an optimizer refusing a value, a seed out of range, a network too large to build
        raise UsageError(
            f"--method {backend.name} cannot start with these settings: {exc}"
        ) from None
    run_id = uuid.uuid4().hex[:12]
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
    )
    run_config = {
        "run_id": run_id,
        "method": backend.name,
        "preset": preset,
        "config": config,
        "data": {**info.to_json(), "image_size": image_size},
        "privacy": plan.to_json(),
        "private": plan.private,
        "ledger": {
            "path": str(Path(ledger_path).resolve()),
            "spend_seq": entry["seq"],
            "spend_hash": entry["hash"],
        },
        "seed": seed,
        "device": str(torch_device),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "versions": _package_versions(),
        "warnings": warnings,
    }
    try:
        run.write_config(run_config)
    except BaseException:
        # Nothing was read yet: the reservation is closed at zero cost.
        ledger.abort(entry["seq"], events=[])
        raise
    return _loop(
        run,
        ledger,
        backend,
        records,
        info,
        config,
        plan,
        trainer,
        sampler,
        run_config,
        start_step=0,
        device=torch_device,
        checkpoint_every_s=checkpoint_every_s,
        progress=progress,
        stop_after_steps=stop_after_steps,
        warnings=warnings,
    )


def _loop_generator(seed: int) -> torch.Generator:
    # The batch sampler has its own stream, separate from the backend's noise stream.
    return torch.Generator().manual_seed(seed * 7919 + 17)


def _resume(
    run: RunDir,
    ledger: Ledger,
    device: torch.device,
    checkpoint_every_s: float,
    progress: ProgressCallback | None,
    stop_after_steps: int | None,
) -> dict[str, Any]:
    run_config = run.read_config()
    backend = get_method(run_config["method"])
    data_cfg = run_config["data"]
    records = load_data(
        data_cfg["spec"], image_size=data_cfg.get("image_size"), dataset_id=data_cfg["dataset_id"]
    )
    info = records.info()
    if info.fingerprint != data_cfg["fingerprint"]:
        raise DataError(
            f"{data_cfg['spec']}: the data changed since this run started "
            "(fingerprint differs); a resumed run must see the same records"
        )
    plan = PrivacyPlan.from_json(run_config["privacy"])
    seq = int(run_config["ledger"]["spend_seq"])
    spend = ledger.spend(seq)
    if spend.get("status") == "completed":
        return {**_summary(run, run_config, ledger, plan, plan.steps), "already_finished": True}
    if spend.get("status") == "aborted":
        raise UsageError(f"the ledger entry of this run (seq {seq}) was aborted; start a new run")
    trainer = backend.trainer(info, run_config["config"], plan, device, run_config["seed"])
    sampler = PoissonSampler(info.n, plan.sampling_rate, _loop_generator(run_config["seed"]))
    start = 0
    if run.has_checkpoint():
        tensors, state = run.load_checkpoint()
        trainer.load_state_tensors(
            {k.removeprefix("trainer/"): v for k, v in tensors.items() if k.startswith("trainer/")}
        )
        sampler.load_state(tensors["loop/sampler_rng"])
        start = int(state["step"])
    run.truncate_log(start)
    return _loop(
        run,
        ledger,
        backend,
        records,
        info,
        run_config["config"],
        plan,
        trainer,
        sampler,
        run_config,
        start_step=start,
        device=device,
        checkpoint_every_s=checkpoint_every_s,
        progress=progress,
        stop_after_steps=stop_after_steps,
        warnings=run_config.get("warnings", []),
    )


class _EpsilonCurve:
    """ε upper bounds of this run after t steps, computed at a few points and reused."""

    def __init__(self, plan: PrivacyPlan) -> None:
        self.plan = plan
        points = max(1, min(_PROGRESS_EPSILON_POINTS, plan.steps))
        self.marks = sorted({max(1, round(plan.steps * (k + 1) / points)) for k in range(points)})
        self.cache: dict[int, float] = {}

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
            self.cache[mark] = min(
                self.plan.epsilon_bound,
                epsilon_for(
                    self.plan.noise_multiplier,
                    self.plan.sampling_rate,
                    mark,
                    self.plan.delta,
                    rel_error=_PROGRESS_REL_ERROR,
                ).epsilon,
            )
        return self.cache[mark]


def _loop(
    run: RunDir,
    ledger: Ledger,
    backend: Method,
    records: ImageData,
    info: DataInfo,
    config: Mapping[str, Any],
    plan: PrivacyPlan,
    trainer: Trainer,
    sampler: PoissonSampler,
    run_config: dict[str, Any],
    *,
    start_step: int,
    device: torch.device,
    checkpoint_every_s: float,
    progress: ProgressCallback | None,
    stop_after_steps: int | None,
    warnings: list[str],
) -> dict[str, Any]:
    pixels = records.as_float().to(device)
    labels = records.y.to(device)
    curve = _EpsilonCurve(plan)
    log_every = max(1, plan.steps // 200)
    last_checkpoint = time.monotonic()
    step = start_step
    seq = int(run_config["ledger"]["spend_seq"])

    def checkpoint() -> None:
        tensors = {f"trainer/{k}": v for k, v in trainer.state_tensors().items()}
        tensors["loop/sampler_rng"] = sampler.state()
        run.save_checkpoint(tensors, {"step": step, "run_id": run_config["run_id"]})

    try:
        while step < plan.steps:
            if stop_after_steps is not None and step - start_step >= stop_after_steps:
                checkpoint()
                return {
                    **_summary(run, run_config, ledger, plan, step),
                    "interrupted": True,
                    "warnings": warnings,
                }
            index = sampler.next().to(device)
            stats = trainer.step(pixels[index], labels[index])
            step += 1
            if step % log_every == 0 or step == plan.steps:
                loss = float(stats.get("loss", math.nan))
                eps = curve.at(step)
                # The loss is computed on the private batch without noise: the log is for the
                # data owner, never part of a release (see the README's privacy model).
                logged = loss if math.isfinite(loss) else None
                run.append_log({"step": step, "loss": logged, "epsilon": _json_eps(eps)})
                if progress is not None:
                    progress(TrainProgress(step, plan.steps, loss, eps))
            if time.monotonic() - last_checkpoint > checkpoint_every_s:
                checkpoint()
                last_checkpoint = time.monotonic()
    except KeyboardInterrupt:
        checkpoint()
        raise
    checkpoint()
    _write_preview(run, backend, info, config, trainer, run_config["seed"], device)
    ledger.complete(seq, [_with_steps(e, step) for e in plan.events])
    return {**_summary(run, run_config, ledger, plan, step), "warnings": warnings}


def _with_steps(event: Mapping[str, Any], steps: int) -> dict[str, Any]:
    out = dict(event)
    if "steps" in out:
        out["steps"] = steps
    return out


def _json_eps(value: float) -> float | str:
    return value if math.isfinite(value) else "inf"


def _write_preview(
    run: RunDir,
    backend: Method,
    info: DataInfo,
    config: Mapping[str, Any],
    trainer: Trainer,
    seed: int,
    device: torch.device,
) -> None:
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
        "ledger_seq": seq,
        "ledger_status": spend.get("status"),
        "preview": str(run.preview_path) if run.preview_path.exists() else None,
    }
