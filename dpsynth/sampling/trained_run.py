"""A trained run for sampling: its generator from the last checkpoint, the sampler's latent
scale, and its privacy statement from the ledger spend it is anchored to (checked), which
says when training did not finish (a partial release, allowed only on request)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from dpsynth.data.images import DataInfo
from dpsynth.errors import DataError, UsageError
from dpsynth.ledger import Ledger
from dpsynth.ledger.anchors import (
    SpendAnchor,
    privacy_statement,
    unit_phrase,
    verified_spend,
)
from dpsynth.methods.base import Generator, check_truncation
from dpsynth.methods.registry import get_method
from dpsynth.rundir import WEIGHTS_FILE, RunDir


@dataclass(frozen=True)
class TrainingState:
    """How far a run's training got: the step of its last checkpoint, of the plan's total."""

    steps: int
    total_steps: int

    @property
    def finished(self) -> bool:
        """True once the checkpoint holds the plan's last step."""
        return self.steps >= self.total_steps

    def to_json(self) -> dict[str, Any]:
        """What a manifest records: steps done, the plan's total, and whether it is partial."""
        return {"steps": self.steps, "total_steps": self.total_steps, "partial": not self.finished}


def training_state(run_dir: Path | str) -> TrainingState | None:
    """The step of the run's last checkpoint (read from the weights file's own metadata, which
    is what `load_generator` loads; 0 without one) and the plan's total (`config.json`); None
    when the config records no total (not a config `train` wrote: nothing can be said)."""
    run = RunDir(run_dir)
    privacy = run.read_config().get("privacy")
    total = privacy.get("steps") if isinstance(privacy, dict) else None
    if total is None:
        return None
    path = run.path / WEIGHTS_FILE
    steps = 0
    if path.is_file():
        try:
            from safetensors import safe_open

            with safe_open(str(path), framework="pt") as handle:
                steps = json.loads((handle.metadata() or {})["state"])["step"]
        except Exception as exc:
            raise DataError(f"{path}: unreadable checkpoint ({_one_line(exc)})") from None
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (steps, total)):
        raise DataError(f"{run.path}: the checkpoint's step or the plan's steps is not a count")
    return TrainingState(steps, total)


def partial_note(state: TrainingState) -> str:
    """What a statement adds for a release from an unfinished run: where training stopped, and
    that the ε stated is the run's whole reservation (a reserved spend counts in full)."""
    return (
        f"partial release: training stopped at step {state.steps} of {state.total_steps} "
        "(the ε is the run's whole reserved spend, which counts in full)"
    )


_PARTIAL = re.compile(r"partial release: training stopped at step (\d+) of (\d+)")


def released_training_state(manifest: Mapping[str, Any]) -> TrainingState | None:
    """Where training stood when a sample was drawn, as its manifest says (`training`, else
    the partial note in its statement); None when the manifest says nothing about it. Only
    used to weaken what an evaluation states, never to strengthen it."""
    recorded = manifest.get("training")
    if isinstance(recorded, Mapping):
        steps, total = recorded.get("steps"), recorded.get("total_steps")
        if isinstance(steps, int) and isinstance(total, int):
            return TrainingState(steps, total)
    found = _PARTIAL.search(str(manifest.get("privacy") or ""))
    return TrainingState(int(found[1]), int(found[2])) if found else None


def unfinished_note(manifest: Mapping[str, Any], spend_status: str | None) -> str | None:
    """What an evaluation's statement adds when the sample it reads came from an unfinished
    run: the manifest's record of a partial release, else a run whose ledger spend is not
    completed (a sample drawn before training finished, by a dpsynth that did not record it).
    None for a finished run."""
    state = released_training_state(manifest)
    if state is not None and not state.finished:
        return partial_note(state)
    if spend_status in ("reserved", "aborted"):
        return (
            f"from an unfinished run: its ledger spend is {spend_status}, not completed "
            "(the ε is the run's whole reserved spend, which counts in full)"
        )
    return None


def check_finished(state: TrainingState, run_name: str, status: str | None) -> None:
    """UsageError (exit 2, one line) for a run whose training did not finish: `sample`
    releases such a checkpoint only with `--partial`."""
    if state.finished:
        return
    if state.steps == 0:
        raise UsageError(
            f"{run_name}: training stopped before its first checkpoint (step 0 of "
            f"{state.total_steps}); `dpsynth train --resume --out {run_name}` finishes it"
        )
    where = f"{run_name}: training stopped at step {state.steps} of {state.total_steps}"
    if status == "aborted":
        raise UsageError(
            f"{where} and its spend was aborted (it cannot be resumed); pass --partial to "
            "release this checkpoint"
        )
    raise UsageError(
        f"{where}; `dpsynth train --resume --out {run_name}` finishes it, or pass --partial "
        "to release this checkpoint"
    )


def _device(device: str) -> torch.device:
    """The torch device `device` names (`training.resolve_device`); the CPU without importing
    the training package, which a sampling worker would otherwise load at its start."""
    if device == "cpu":
        return torch.device("cpu")
    from dpsynth.training import resolve_device

    return resolve_device(device)


def load_generator(run_dir: Path | str, device: str = "auto") -> tuple[Generator, dict, DataInfo]:
    """The generator of a run (from its last checkpoint), its config and its data info.

    A config.json that does not describe the checkpoint (an unknown method, missing keys,
    changed classes or layer sizes) is a DataError naming the run, never a traceback.
    """
    run = RunDir(run_dir)
    run_config = run.read_config()
    torch_device = _device(device)
    try:
        info = DataInfo.from_json(run_config["data"])
        backend = get_method(run_config["method"])
        config = run_config["config"]
    except (UsageError, KeyError, TypeError, ValueError, AttributeError) as exc:
        raise DataError(
            f"{run.path}: config.json is not a valid run config ({_one_line(exc)})"
        ) from None
    tensors, _ = run.load_checkpoint(torch_device)
    trainer_tensors = {
        k.removeprefix("trainer/"): v for k, v in tensors.items() if k.startswith("trainer/")
    }
    try:
        generator = backend.generator_from_state(info, config, trainer_tensors, torch_device)
    except (RuntimeError, KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
        raise DataError(
            f"{run.path}: the checkpoint does not match config.json (was it edited?): "
            f"{_one_line(exc)}"
        ) from None
    return generator, run_config, info


def set_truncation(generator: Generator, truncation: float | None, method: str) -> None:
    """Override the sampler's latent scale (`sample --truncation`; None keeps the run's).

    Scaling z ~ N(0, I) by t < 1 trades diversity for samples nearer the generator's typical
    output (the "truncation trick"). It acts on the released generator only, so it costs no
    privacy. Samplers without a latent (pge's chains, psg's fixed set) refuse it.
    """
    if truncation is None:
        return
    value = check_truncation(truncation, "--truncation")
    if generator.truncation is None:
        raise UsageError(f"--truncation: {method}'s sampler has no latent to scale")
    generator.truncation = value


def _one_line(exc: BaseException, limit: int = 160) -> str:
    lines = str(exc).strip().splitlines()
    text = lines[0] if lines else ""
    text = text if len(text) <= limit else text[: limit - 1] + "…"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def run_privacy(
    run_dir: Path | str, ledger_path: Path | str | None = None, partial: bool = False
) -> dict[str, Any]:
    """The privacy statement of a run's outputs, taken from the ledger spend it is anchored to.

    A run whose training did not finish (its checkpoint is short of the plan's steps) is
    refused with one line (UsageError, exit 2) unless `partial`; with it, the statement says
    that this is a partial release and where training stopped (`training` holds the steps).

    `ledger_path` defaults to the ledger the run recorded. The anchor (seq and hash in
    config.json) is checked as for `--resume` (same hash, run id, data and events); a run that
    does not match its ledger is refused (AnchorError, exit 2), so an edited config.json or a
    ledger from which the spend was cut can never produce a statement; a config.json edited
    after the spend was reserved (method, settings, data, plan) is a RunConfigEditedError
    (exit 4).
    """
    run = RunDir(run_dir)
    run_config = run.read_config()
    name = str(run.path)
    anchor = SpendAnchor.from_run_config(run_config, name)
    try:
        data = run_config["data"]
        run_id, dataset_id = str(run_config["run_id"]), str(data["dataset_id"])
        fingerprint, events = str(data["fingerprint"]), list(run_config["privacy"]["events"])
        path = Path(ledger_path or run_config["ledger"]["path"])
    except (KeyError, TypeError, ValueError) as exc:
        raise DataError(
            f"{name}: config.json is not a valid run config ({_one_line(exc)})"
        ) from None
    spend = verified_spend(
        Ledger(path),
        anchor,
        run_id=run_id,
        dataset_id=dataset_id,
        fingerprint=fingerprint,
        events=events,
        run_name=name,
        run_config=run_config,
    )
    state = training_state(run.path)
    if state is not None and not partial:
        check_finished(state, name, spend.get("status"))
    statement = privacy_statement(spend)
    release = run_config.get("schema_release")
    if isinstance(release, dict) and statement["private"]:
        statement = _with_schema_release(statement, Ledger(path), release, run_id, name)
    if state is not None and not state.finished:
        statement = {**statement, "statement": f"{statement['statement']}; {partial_note(state)}"}
    training = state.to_json() if state is not None else None
    return {**statement, "training": training, "ledger": str(path.resolve())}


def _with_schema_release(
    statement: dict[str, Any], ledger: Ledger, release: dict[str, Any], run_id: str, name: str
) -> dict[str, Any]:
    """The statement of a table run whose schema was released with DP before training: the
    outputs carry the released schema too, so their ε composes both spends (read from the
    ledger, which must hold the release under this run's id)."""
    from dpsynth.privacy.accounting.compose import compose_epsilon

    try:
        spend = ledger.spend(int(release["ledger_seq"]))
    except (KeyError, TypeError, ValueError, UsageError):
        spend = {}
    if spend.get("run_id") != run_id or spend.get("command") != "schema-release":
        raise DataError(f"{name}: the ledger holds no schema release of this run (was it cut?)")
    training = ledger.spend(int(statement["ledger_seq"]))
    delta = float(statement["delta"])
    bound = compose_epsilon([*spend["events"], *training["events"]], delta)
    whom = unit_phrase(training.get("privacy_unit"))  # both spends bound one unit's rows
    return {
        **statement,
        "epsilon": bound.epsilon,
        "schema_release_seq": int(spend["seq"]),
        "statement": (
            f"(ε ≤ {bound.epsilon:.4g}, δ = {delta:g})-DP{whom}, {bound.accountant} (training "
            f"and the schema release, seq {spend['seq']}, composed)"
        ),
    }


def run_modality(run_dir: Path | str) -> str:
    """`image` or `table`, from the run's config.json (`image` when it cannot be read)."""
    try:
        data = RunDir(run_dir).read_config().get("data")
    except DataError:
        return "image"  # the image path reports the problem with its own message
    return str(data.get("modality", "image")) if isinstance(data, dict) else "image"
