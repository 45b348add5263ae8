"""A trained run for sampling: its generator from the last checkpoint, the sampler's latent
scale, and its privacy statement from the ledger spend it is anchored to (checked)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dpsynth.data.images import DataInfo
from dpsynth.errors import DataError, UsageError
from dpsynth.ledger import Ledger
from dpsynth.ledger.anchors import SpendAnchor, privacy_statement, verified_spend
from dpsynth.methods.base import Generator, check_truncation
from dpsynth.methods.registry import get_method
from dpsynth.runs import RunDir
from dpsynth.training import resolve_device


def load_generator(run_dir: Path | str, device: str = "auto") -> tuple[Generator, dict, DataInfo]:
    """The generator of a run (from its last checkpoint), its config and its data info.

    A config.json that does not describe the checkpoint (an unknown method, missing keys,
    changed classes or layer sizes) is a DataError naming the run, never a traceback.
    """
    run = RunDir(run_dir)
    run_config = run.read_config()
    torch_device = resolve_device(device)
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


def run_privacy(run_dir: Path | str, ledger_path: Path | str | None = None) -> dict[str, Any]:
    """The privacy statement of a run's outputs, taken from the ledger spend it is anchored to.

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
    statement = privacy_statement(spend)
    release = run_config.get("schema_release")
    if isinstance(release, dict) and statement["private"]:
        statement = _with_schema_release(statement, Ledger(path), release, run_id, name)
    return {**statement, "ledger": str(path.resolve())}


def _with_schema_release(
    statement: dict[str, Any], ledger: Ledger, release: dict[str, Any], run_id: str, name: str
) -> dict[str, Any]:
    """The statement of a table run whose schema was released with DP before training: the
    outputs carry the released schema too, so their ε composes both spends (read from the
    ledger, which must hold the release under this run's id)."""
    from dpsynth.privacy.accounting import compose_epsilon

    try:
        spend = ledger.spend(int(release["ledger_seq"]))
    except (KeyError, TypeError, ValueError, UsageError):
        spend = {}
    if spend.get("run_id") != run_id or spend.get("command") != "schema-release":
        raise DataError(f"{name}: the ledger holds no schema release of this run (was it cut?)")
    training = ledger.spend(int(statement["ledger_seq"]))
    delta = float(statement["delta"])
    bound = compose_epsilon([*spend["events"], *training["events"]], delta)
    return {
        **statement,
        "epsilon": bound.epsilon,
        "schema_release_seq": int(spend["seq"]),
        "statement": (
            f"(ε ≤ {bound.epsilon:.4g}, δ = {delta:g})-DP, {bound.accountant} (training and the "
            f"schema release, seq {spend['seq']}, composed)"
        ),
    }


def run_modality(run_dir: Path | str) -> str:
    """`image` or `table`, from the run's config.json (`image` when it cannot be read)."""
    try:
        data = RunDir(run_dir).read_config().get("data")
    except DataError:
        return "image"  # the image path reports the problem with its own message
    return str(data.get("modality", "image")) if isinstance(data, dict) else "image"
