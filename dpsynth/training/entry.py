"""`train(request)`: start, resume or join a run, then run its loop (one process or torchrun).

The random streams of the mechanisms (Poisson batches, noise) come from a secret drawn from the
OS for each run and written only to the run's `private/` folder before the first read of a
record (`dpsynth.privacy.mechanisms.randomness`); `seed` drives public randomness only
(initialisation, the preview).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from dpsynth.data.engines import PassCallback
from dpsynth.distributed import Launch, PeerFailed, broadcast, launch_from_env, process_group
from dpsynth.ledger import Ledger
from dpsynth.rundir import RunDir
from dpsynth.training.loop import run_loop
from dpsynth.training.progress import ProgressCallback, pass_callback
from dpsynth.training.request import TrainRequest
from dpsynth.training.resume import join_run, recorded_ledger, resume_run
from dpsynth.training.session import Session
from dpsynth.training.start import start_run

# Older spellings `train_run` still takes, for the tests and the audit's black box that use it.
_OLD_NAMES = {"ledger_path": "ledger"}


def train_run(*, progress: ProgressCallback | None = None, **keywords: Any) -> dict[str, Any]:
    """`train` with the request's fields by name (`TrainRequest.build`, test-only fields
    included): the training layer's own keyword entry, returning the JSON-ready summary."""
    for old, new in _OLD_NAMES.items():
        if old in keywords:
            keywords[new] = keywords.pop(old)
    return train(TrainRequest.build(**keywords), progress)


def train(request: TrainRequest, progress: ProgressCallback | None = None) -> dict[str, Any]:
    """Train a backend on a data set under a DP guarantee and return a JSON-ready summary.

    `request.privacy.epsilon` is the data set's total budget after this run: earlier spends
    recorded in the ledger for the same dataset are composed in when σ is calibrated.
    `stop_after_steps` ends the loop early as an interruption would (checkpoint written, ledger
    entry left reserved); tests use it to exercise `resume`. With `resume` and no `ledger`, the
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
    launch = launch_from_env()
    if launch is None:
        return _run(request, progress, request.run.torch_device, None)
    # each rank takes cuda:LOCAL_RANK (or the CPU) for the device the request names
    with process_group(launch, request.run.device) as device:
        return _run(request, progress, device, launch)


def _run(
    request: TrainRequest,
    progress: ProgressCallback | None,
    device: torch.device,
    launch: Launch | None,
) -> dict[str, Any]:
    loop_args = {
        "device": device,
        "checkpoint_every_s": request.run.checkpoint_every_s,
        "stop_after_steps": request.run.stop_after_steps,
        "launch": launch,
    }
    if launch is not None and not launch.is_main:
        message = broadcast(None, device)
        if "error" in message:
            raise PeerFailed(int(message["error"]))
        if "finished" in message:
            return message["finished"]
        return run_loop(join_run(message["start"], device), progress=None, **loop_args)
    try:
        session = _open(request, device, launch, pass_callback(progress))
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
    try:
        return run_loop(session, progress=progress, **loop_args)
    finally:
        session.records.close()  # an engine's connection or client


def _open(
    request: TrainRequest,
    device: torch.device,
    launch: Launch | None,
    on_pass: PassCallback | None = None,
) -> Session | dict[str, Any]:
    """Start a new run, or check and load the run to resume (its summary if it had finished)."""
    if not request.run.resume:
        return start_run(request, device, launch, on_pass)
    run = RunDir(request.run.out)
    # Without a ledger given, the run's own (recorded) ledger; the anchor is checked anyway.
    ledger = Ledger(request.run.ledger or recorded_ledger(run))
    log_private_loss, public = request.run.log_private_loss, request.images.public
    return resume_run(run, ledger, device, log_private_loss, public, on_pass, request.table)


def _tell_quietly(message: dict[str, Any], device: torch.device) -> None:
    """Broadcast `message` if the other ranks can still hear it (they may be gone)."""
    with contextlib.suppress(Exception):  # the original error is the one to report
        broadcast(message, device)
