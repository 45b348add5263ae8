"""The step loop every backend shares: Poisson batches, all-or-nothing steps, checkpoints.

A step is all or nothing: signals only ask for a stop, honoured at the next step boundary
(`dpsynth.training.interrupts`), and nothing raised inside a step writes a checkpoint, so the
checkpoint on disk is always a finished step's and a resume replays lost steps from the saved
secret streams. The publishable `train-log.jsonl` holds the step, ε so far and the stats the
backend declares released; losses on private batches go to `private/` only on request. Under
torchrun every rank runs the same steps on the same global batches; only rank 0 logs,
checkpoints, shows progress and completes the ledger entry.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import signal
import time
import warnings as python_warnings
from collections.abc import Iterator
from typing import Any

import torch

from dpsynth.distributed import Launch
from dpsynth.errors import DpsynthError, MechanismFailure
from dpsynth.methods.base import Trainer
from dpsynth.privacy.mechanisms.ghost_check import GhostFallbackWarning
from dpsynth.privacy.mechanisms.poisson import PoissonSampler
from dpsynth.training.interrupts import InterruptRequest, TrainingInterrupted, deferred_interrupts
from dpsynth.training.progress import (
    EpsilonCurve,
    ProgressCallback,
    StopNotice,
    TrainProgress,
    stop_callback,
)
from dpsynth.training.public import pretrain_public
from dpsynth.training.release_notes import release_lines
from dpsynth.training.session import Session, warm_start
from dpsynth.training.summary import json_eps, json_stat, run_summary, write_preview


def run_loop(
    session: Session,
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
    curve = EpsilonCurve(plan)
    log_every = max(1, plan.steps // 200)
    last_checkpoint = time.monotonic()
    step = start_step
    seq = int(run_config["ledger"]["spend_seq"])

    log_private = bool(run_config.get("log_private_loss"))
    released = tuple(type(trainer).released_stats)

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

    notify = stop_callback(progress)

    def on_request(signum: int) -> None:
        if notify is not None:  # `step`: the steps finished when the signal came
            notify(StopNotice(_signal_name(signum), step, plan.steps))

    # A step is all or nothing: signals only ask for a stop, honoured at the next boundary,
    # and nothing that raises inside a step (a second signal included) writes a checkpoint,
    # so the checkpoint on disk is always a finished step's (see dpsynth.training.interrupts).
    with (
        deferred_interrupts(on_request) as interrupts,
        collected_warnings(GhostFallbackWarning, warnings),
        aborted_on_failure(session, seq),
    ):
        if start_step == 0 and not run.has_checkpoint():
            pretrain_public(session, device)  # declared-public images first: no data read
            warm_start(session, pixels, labels)
        while step < plan.steps:
            if stop_requested(interrupts, launch, device):
                checkpoint()
                raise TrainingInterrupted(
                    f"stopped after step {step} of {plan.steps} with a checkpoint; continue "
                    f"with `dpsynth train --resume --out {run.path}`"
                )
            if stop_after_steps is not None and step - start_step >= stop_after_steps:
                checkpoint()
                return {
                    **run_summary(run, run_config, ledger, plan, step),
                    "interrupted": True,
                    "warnings": warnings,
                }
            stats = trainer.step(*_loop_batch(trainer, step, sampler, pixels, labels, device))
            step += 1
            if launch is not None and step == start_step + 1:
                check_ranks_agree(trainer, device)
            if step % log_every == 0 or step == plan.steps:
                eps = curve.at(step)
                public = {k: json_stat(v) for k, v in stats.items() if k in released}
                run.append_log({"step": step, "epsilon": json_eps(eps), **public})
                loss = None
                if log_private:
                    # Computed on the private batch without noise: the data owner's eyes only.
                    private = {k: json_stat(v) for k, v in stats.items() if k not in released}
                    run.append_private_log({"step": step, **private})
                    loss = float(stats.get("loss", math.nan))
                if progress is not None:
                    progress(TrainProgress(step, plan.steps, loss, eps))
            if time.monotonic() - last_checkpoint > checkpoint_every_s:
                checkpoint()
                last_checkpoint = time.monotonic()
        checkpoint()
    if launch is not None:  # after the checkpoint: a mismatch can then be resumed from it
        check_ranks_agree(trainer, device)
    write_preview(run, backend, info, config, trainer, run_config["seed"], device)
    # The loop ends only after all plan.steps steps: the run spent exactly its plan (whose
    # events may split the loop into phases, as DPAF's do).
    ledger.complete(
        seq,
        list(plan.events),
        run_id=run_config["run_id"],
        fingerprint=info.fingerprint,
    )
    summary = {**run_summary(run, run_config, ledger, plan, step), "warnings": warnings}
    if info.modality == "table" and hasattr(trainer, "passes"):
        # the passes over the data (the trainer's counting passes in memory; all those an
        # engine made, its check pass included), and the engine that made them
        summary["engine"] = run_config["data"].get("engine", "memory")
        summary["passes"] = int(getattr(records, "passes", trainer.passes))
        if hasattr(records, "pass_names"):
            summary["pass_names"] = list(records.pass_names)
    if run_config.get("schema_release"):
        release = run_config["schema_release"]
        schema = run_config["data"].get("schema") or {}
        lines = release_lines(
            schema,
            release.get("warnings", ()),
            release.get("clipped"),
            release.get("clipped_deviation"),
        )
        summary["schema_release"] = {**release, "columns": lines}
    return summary


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


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
    session: Session,
    device: torch.device,
    stop_after_steps: int | None,
    launch: Launch | None,
) -> dict[str, Any]:
    """The loop of a rank other than 0: the same steps, and nothing written or shown."""
    pixels = session.records.as_float().to(device)
    labels = session.records.y.to(device)
    step = start = session.start_step
    with deferred_interrupts() as interrupts:
        pretrain_public(session, device)
        warm_start(session, pixels, labels)
        while step < session.plan.steps:
            if stop_requested(interrupts, launch, device):
                raise TrainingInterrupted(f"stopped after step {step} with rank 0's checkpoint")
            if stop_after_steps is not None and step - start >= stop_after_steps:
                return {"rank": launch.rank if launch else 0, "steps": step, "interrupted": True}
            session.trainer.step(
                *_loop_batch(session.trainer, step, session.sampler, pixels, labels, device)
            )
            step += 1
            if step == start + 1:
                check_ranks_agree(session.trainer, device)
    check_ranks_agree(session.trainer, device)
    return {"rank": launch.rank if launch else 0, "steps": step}


@contextlib.contextmanager
def aborted_on_failure(session: Session, seq: int) -> Iterator[None]:
    """A mechanism that cannot go on (`MechanismFailure`, deterministic: a resume would fail
    the same way) closes the run's spend as aborted. The data was read, so the abort counts
    the reserved events in full: an honest upper bound on what the steps taken spent."""
    try:
        yield
    except MechanismFailure as exc:
        assert session.ledger is not None
        session.ledger.abort(
            seq, run_id=session.run_config["run_id"], fingerprint=session.info.fingerprint
        )
        raise MechanismFailure(
            f"{exc}; the run's ledger entry (seq {seq}) is closed as aborted and counts its "
            "planned ε in full (the data was read)"
        ) from None


@contextlib.contextmanager
def collected_warnings(kind: type[Warning], into: list[str]) -> Iterator[None]:
    """Python warnings of `kind` raised inside the block become the run's warnings (shown by
    the CLI and in the summary); any other warning is passed on as it was."""
    try:
        with python_warnings.catch_warnings(record=True) as caught:
            python_warnings.simplefilter("always", kind)
            yield
    finally:
        # outside the recording block: a warning passed on must not be recorded again
        for found in caught:
            if issubclass(found.category, kind):
                into.append(str(found.message))
            else:
                python_warnings.warn_explicit(
                    found.message, found.category, found.filename, found.lineno
                )


def stop_requested(
    interrupts: InterruptRequest, launch: Launch | None, device: torch.device
) -> bool:
    """Whether the loop stops at this step boundary. Under torchrun every rank must stop at
    the same one (the others would wait in the next step's all-reduce), so the ranks agree:
    one stops when any was signalled."""
    if launch is None:
        return interrupts.requested
    flag = torch.tensor([1.0 if interrupts.requested else 0.0], device=device)
    torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
    return bool(flag.item() > 0)


def check_ranks_agree(trainer: Trainer, device: torch.device) -> None:
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
