"""Resuming a run from its directory (rank 0), and joining a run as another torchrun rank.

A resumed run continues the same plan and ledger entry from its last checkpoint, with the same
secret streams, after its anchor (the spend's seq and hash) was checked against the ledger:
the total number of steps, and so the ε spent, is exactly the plan's.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from dpsynth.data.engines import PassCallback
from dpsynth.errors import AnchorError, DataError, UsageError
from dpsynth.ledger import Ledger
from dpsynth.ledger.anchors import SpendAnchor, verified_spend
from dpsynth.methods.registry import get_method
from dpsynth.privacy.accounting.plan import PrivacyPlan
from dpsynth.privacy.accounting.plan_check import check_plan_parameters
from dpsynth.privacy.mechanisms.poisson import batch_sampler
from dpsynth.privacy.mechanisms.randomness import PrivateRandomness
from dpsynth.rundir import RunDir
from dpsynth.training.data import (
    load_recorded,
    public_info,
    recorded_fingerprint,
    recorded_public_size,
)
from dpsynth.training.public import check_resume_spec, needs_reload, reload_public
from dpsynth.training.request import TableOptions
from dpsynth.training.session import Session, central_generator
from dpsynth.training.summary import run_summary


def recorded_ledger(run: RunDir) -> Path:
    recorded = run.read_config().get("ledger")
    path = recorded.get("path") if isinstance(recorded, dict) else None
    if not isinstance(path, str) or not path:
        raise DataError(f"{run.path}: config.json records no ledger path; pass --ledger")
    return Path(path)


def resume_run(
    run: RunDir,
    ledger: Ledger,
    device: torch.device,
    log_private_loss: bool,
    public_spec: str | None = None,
    on_pass: PassCallback | None = None,
    table: TableOptions | None = None,
) -> Session | dict[str, Any]:
    """Check a run's anchor and load its state (its summary if it had finished); a run
    started with `--public` reads its public set again when it restarts from scratch
    (`public_spec`, if given, must name that set); a table counted out of core counts again on
    its recorded engine with `table`'s workers and TLS credentials, if given."""
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
    check_resume_spec(public_spec, run_config.get("public"), name)
    # workers and TLS files checked against the recorded engine, before anything is read
    choice = table.recorded_engine(data_cfg.get("engine")) if table is not None else None
    workers = table.workers if table is not None else None
    # The spend this run may close is the one its anchor points at, checked before any data
    # is read: same hash, this run id and data, and events equal to the plan the loop will use.
    check_plan_parameters(
        plan.events,
        private=plan.private,
        noise_multiplier=None if plan.gaussian_sum is None else plan.noise_multiplier,
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
        return {**run_summary(run, run_config, ledger, plan, plan.steps), "already_finished": True}
    if spend.get("status") == "aborted":
        raise UsageError(f"the ledger entry of this run (seq {seq}) was aborted; start a new run")
    randomness = PrivateRandomness.from_json(run.read_secret())
    records = load_recorded(data_cfg, name, on_pass, randomness, choice, workers)
    info = public_info(
        records,
        recorded_fingerprint(ledger, records.content_digest, fingerprint),
        recorded_public_size(data_cfg),
    )
    if info.fingerprint != fingerprint:
        raise DataError(
            f"{data_cfg['spec']}: the data changed since this run started "
            "(fingerprint differs); a resumed run must see the same records"
        )
    if log_private_loss:  # asked for at resume time: log the remaining steps' losses too
        run_config = {**run_config, "log_private_loss": True}
    trainer = backend.trainer(
        info, run_config["config"], plan, device, run_config["seed"], randomness
    )
    records.attach_to(trainer, backend.name)  # an engine's counter for a marginal trainer
    sampler = batch_sampler(
        records.n, plan.sampling_rate, randomness.generator("loop/batches"),
        records.sampling_units,
    )  # fmt: skip
    central_rng = central_generator(plan, randomness)
    start = 0
    restored = None
    if run.has_checkpoint():
        tensors, state = run.load_checkpoint()
        restored = {
            k.removeprefix("trainer/"): v for k, v in tensors.items() if k.startswith("trainer/")
        }
        trainer.load_state_tensors(restored)
        start = int(state["step"])
        _load_streams(randomness, run.load_private_state(start)["generators"])
    run.truncate_log(start)
    public = None
    if needs_reload(run_config, start, restored):
        public = reload_public(run_config["public"], info, name)
    return Session(
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
        public=public,
    )


def join_run(start: Mapping[str, Any], device: torch.device) -> Session:
    """A rank other than 0 joins the run rank 0 started: it reads the same data (checked by
    fingerprint), builds the same trainer and streams, and restores the same state."""
    run_config = dict(start["run_config"])
    data_cfg = run_config["data"]
    randomness = PrivateRandomness.from_json(start["secret"])
    records = load_recorded(data_cfg, "rank 0's run", randomness=randomness)
    info = public_info(records, data_cfg["fingerprint"], recorded_public_size(data_cfg))
    # Rank 0 sends its content digest on the private channel it sends the secret on.
    if records.content_digest != start["content_digest"]:
        raise DataError(
            f"{data_cfg['spec']}: this rank reads different records than rank 0 (fingerprint "
            "differs); every node must see the same data"
        )
    backend = get_method(run_config["method"])
    plan = PrivacyPlan.from_json(run_config["privacy"])
    trainer = backend.trainer(
        info, run_config["config"], plan, device, run_config["seed"], randomness
    )
    sampler = batch_sampler(
        records.n,
        plan.sampling_rate,
        randomness.generator("loop/batches"),
        records.sampling_units,
    )
    central_rng = central_generator(plan, randomness)
    if start["tensors"] is not None:
        trainer.load_state_tensors(start["tensors"])
    _load_streams(randomness, start["generators"])
    public = None
    if needs_reload(run_config, int(start["start_step"]), start["tensors"]):
        public = reload_public(run_config["public"], info, "rank 0's run")
    return Session(
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
        public=public,
    )


def _load_streams(randomness: PrivateRandomness, states: Mapping[str, str]) -> None:
    """Restore the saved secret streams. A table's DP releases before step 0 (`schema/…`:
    spent when the run began, never drawn from again) are handed out first, so that a run
    with a schema release restores the streams it saved."""
    for purpose in states:
        if purpose.startswith("schema/"):
            randomness.generator(purpose)
    randomness.load_state(states)
