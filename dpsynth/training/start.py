"""Starting a new run: open the data, plan, build, reserve, write (rank 0, or the only process).

`start_run` is these steps, in the order that is the privacy contract:
1. `open_data`: the records and their public description (N, shape, classes, the keyed
   fingerprint); a table's DP releases of its entries are planned from public facts, the
   training plan is checked to fit after them (`plan_training`), and only then are they spent;
2. `plan_run`: the privacy plan (σ from the target ε, δ, q, T and the data set's earlier
   spends), made by `plan_training`, the one place a run's preset, config and plan are made;
3. `build_trainer`: the trainer and the batch sampler. Everything that can fail on public
   facts fails in steps 1 to 3, before any spend;
4. `reserve_spend`: the spend reserved in the ledger (fsynced; refused with exit 3 over a
   budget cap), then `write_run`: the run's config and its secret (to `private/`), before any
   record is read.
The loop (`dpsynth.training.loop`) then reads records, one Poisson batch per step.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path
from typing import Any

import torch

from dpsynth import __version__
from dpsynth.data.engines import PassCallback
from dpsynth.data.images import DataInfo, ImageData
from dpsynth.data.public import PublicImages
from dpsynth.data.records import Records
from dpsynth.data.schema_file import parse_schema
from dpsynth.data.sources import is_table_spec
from dpsynth.distributed import Launch
from dpsynth.errors import UsageError
from dpsynth.ledger import Ledger
from dpsynth.ledger.anchors import run_config_digest
from dpsynth.methods.base import Method, Trainer
from dpsynth.methods.blocks import stage_shares
from dpsynth.methods.recommend import AUTO, recommend_method, resolve_preset
from dpsynth.methods.registry import get_method
from dpsynth.privacy.accounting.calibration import default_delta
from dpsynth.privacy.accounting.events import DpEvent
from dpsynth.privacy.accounting.plan import PrivacyPlan, PrivacyTarget
from dpsynth.privacy.mechanisms.contribution import UnitBound
from dpsynth.privacy.mechanisms.poisson import PoissonSampler, batch_sampler
from dpsynth.privacy.mechanisms.randomness import PrivateRandomness
from dpsynth.rundir import RunDir
from dpsynth.training.data import keyed_fingerprint, open_images, public_info
from dpsynth.training.public import ledger_record, open_public
from dpsynth.training.request import TrainRequest
from dpsynth.training.session import Session, central_generator
from dpsynth.training.table_prepare import prepare_table, with_released_one_ways
from dpsynth.training.table_units import (
    check_unit_composition,
    check_unit_method,
    id_columns_advice,
    unit_record,
)


def start_run(
    request: TrainRequest,
    torch_device: torch.device,
    launch: Launch | None,
    on_pass: PassCallback | None = None,
) -> Session:
    """Plan, reserve and write a new run (rank 0, or the only process), step by step (see the
    module); `on_pass` hears of each pass an out-of-core engine makes over a table."""
    assert request.run.ledger is not None and request.backend.method is not None
    run, ledger = RunDir(request.run.out), Ledger(request.run.ledger)
    # --method auto is resolved from the public description once it is known (step 1).
    backend = None if request.backend.method == AUTO else get_method(request.backend.method)
    run.check_new()
    run_id = uuid.uuid4().hex[:12]
    # Drawn before anything is read; it reaches the disk only in the run's private folder.
    seed = request.privacy.privacy_seed
    randomness = PrivateRandomness(seed) if seed is not None else PrivateRandomness.fresh()
    data = open_data(request, backend, ledger, run_id, randomness, on_pass)
    planned = plan_run(request, data, ledger)
    built = build_trainer(request, data, planned, torch_device, randomness)
    if data.existing is None:  # the ledger's key is made only now: nothing can refuse the run
        data = replace(
            data, info=replace(data.info, fingerprint=keyed_fingerprint(ledger, data.digest))
        )
    run_config = reserve_spend(request, ledger, run_id, data, planned, built, torch_device)
    if launch is not None:  # informational: the mechanism is the same for any world size
        run_config["launch"] = {"world_size": launch.world_size}
    write_run(run, ledger, run_config, randomness, data.info)
    return Session(
        run=run, ledger=ledger, backend=data.backend, records=data.records, info=data.info,
        config=planned.config, plan=planned.plan, trainer=built.trainer, sampler=built.sampler,
        randomness=randomness, central_rng=built.central_rng, run_config=run_config,
        start_step=0, warnings=planned.warnings, public=built.public,
    )  # fmt: skip


@dataclass(frozen=True)
class OpenedData:
    """Step 1: the records the loop reads, their public description, the run's backend, the
    ledger's keyed fingerprint of the records (None: none yet), a table's release record and
    an image folder's privacy unit."""

    records: Records
    info: DataInfo
    backend: Method
    existing: str | None
    schema_release: dict[str, Any] | None = None
    image_unit: UnitBound | None = None

    @property
    def digest(self) -> str:
        """The records' plain content digest (in memory only: it is a membership test)."""
        return self.records.content_digest


def open_data(
    request: TrainRequest, backend: Method | None, ledger: Ledger, run_id: str,
    randomness: PrivateRandomness, on_pass: PassCallback | None = None,
) -> OpenedData:  # fmt: skip
    """Step 1: the records and their public description; `--method auto` chosen on it."""
    assert request.input.data is not None
    schema_release, image_unit = None, None
    records: Records
    if is_table_spec(request.input.data):  # its unit is checked against earlier spends there
        records, schema_release, backend = _open_table(
            request, backend, ledger, run_id, randomness, on_pass
        )
    else:
        records, image_unit = open_images(request, backend, randomness)
    # The ledger's keyed fingerprint: it links spends on the same records, and unlike their
    # plain digest it is no membership test for whoever reads the ledger or the run dir. A
    # ledger without a key yet gets one only once nothing can refuse the command.
    existing = ledger.data_fingerprint(records.content_digest, create=False)
    info = public_info(records, existing or "", request.input.public_size)
    if info.modality == "image":  # a folder's images protect one unit per data set
        check_unit_composition(ledger, info.dataset_id, existing, image_unit)
    if image_unit is not None:
        info = replace(info, unit=image_unit.column, rows_per_unit=image_unit.max_rows)
    if backend is None:
        backend = get_method(recommend_method(info, request.target_epsilon))
    return OpenedData(records, info, backend, existing, schema_release, image_unit)


def _open_table(
    request: TrainRequest, backend: Method | None, ledger: Ledger, run_id: str,
    randomness: PrivateRandomness, on_pass: PassCallback | None,
) -> tuple[Records, dict[str, Any] | None, Method]:  # fmt: skip
    """The table (`training.table_prepare`), its release record (None: nothing released) and
    the run's backend (`--method auto` chosen on the description the release is planned on).
    The training plan is checked to fit after the release's events before it is spent."""
    table = prepare_table(request, backend, ledger, on_pass)
    try:
        backend = backend or get_method(recommend_method(table.info, request.target_epsilon))
        if table.pending is None:
            assert table.records is not None
            return table.records, None, backend
        if table.unit is not None:
            check_unit_method(backend, table.unit)
        info, pending = table.info, table.pending
        prior = (*ledger.events_for(info.dataset_id, info.fingerprint or None), *pending.events)
        assert pending.delta is not None
        plan_training(backend, request, info, pending.delta, prior, in_memory=table.in_memory)
        records, release = table.spend(
            ledger, backend.name, run_id, randomness, reach_ends=backend.draws_end_tails
        )
        return records, release, backend
    except BaseException:
        table.close()
        raise


@dataclass(frozen=True)
class PlannedRun:
    """Step 2: the resolved preset, the config, the privacy plan and the run's warnings."""

    preset: str
    config: dict[str, Any]
    plan: PrivacyPlan
    warnings: list[str] = field(default_factory=list)
    needs_public: str | None = None


def plan_training(
    backend: Method,
    request: TrainRequest,
    info: DataInfo,
    delta: float,
    prior: Sequence[DpEvent],
    release: dict[str, Any] | None = None,
    in_memory: bool = True,
) -> PlannedRun:
    """The preset, config and privacy plan of `backend` on `info` after the `prior` events;
    UsageError (exit 2) from public facts only when they cannot start. `release` is the
    record of a table's release (its 1-way histograms go into the config); `in_memory` is
    false for an engine's source (its rows are counted, never held)."""
    target = request.target_epsilon
    preset = resolve_preset(backend, request.backend.preset, info, target)
    config = backend.config(preset, dict(request.backend.overrides), info)
    config = with_released_one_ways(config, release, backend.reuses_one_ways)
    if in_memory:
        backend.validate_config(config, info)
    else:
        backend.validate_config(config, info, rows_in_memory=False)  # type: ignore[call-arg]
    plan = backend.plan(info, PrivacyTarget(target, float(delta)), config, prior)
    return PlannedRun(preset, config, plan)


def plan_run(request: TrainRequest, data: OpenedData, ledger: Ledger) -> PlannedRun:
    """Step 2: δ, the plan after the data set's earlier spends, and the run's warnings."""
    backend, info, release = data.backend, data.info, data.schema_release
    warnings: list[str] = list((release or {}).get("warnings", []))
    if backend.table_advice and info.modality == "table":
        warnings.append(backend.table_advice)
    if info.modality == "table" and info.unit is None:
        advice = id_columns_advice(parse_schema(info.schema or {}, "the run's schema"))
        if advice:
            warnings.append(advice)
    delta = request.privacy.delta
    if delta is None:  # the schema release's δ when there was one (N before bounding)
        delta = (release or {}).get("delta") or default_delta(info.n)
    elif delta >= 1.0 / info.n:
        warnings.append(
            f"δ={delta:g} is not below 1/N = {1.0 / info.n:.3g}: a mechanism could release a "
            "whole record with that probability; use a smaller --delta"
        )
    # Budgets follow the data: spends linked by dataset id or fingerprint are composed in.
    # Without a key no spend holds a keyed fingerprint; the plain digest (in memory only)
    # finds the spends a legacy ledger recorded under it.
    prior = ledger.events_for(info.dataset_id, data.existing or data.digest)
    in_memory = data.records.rows_in_memory  # an engine counts: no rows held
    planned = plan_training(backend, request, info, delta, prior, release, in_memory)
    if planned.preset in backend.preset_advice and info.modality == "image":
        warnings.append(backend.preset_advice[planned.preset])
    needs = backend.public_requirement(planned.preset, planned.config)
    if needs and request.images.public is None:
        raise UsageError(
            f"{backend.name}'s preset {planned.preset!r} {needs}: give {{public}} SPEC "
            "(labelled images of the data's classes), or take a preset without it",
            parameter="public",
        )
    return replace(planned, warnings=warnings, needs_public=needs)


@dataclass(frozen=True)
class BuiltTrainer:
    """Step 3: the trainer, its batch sampler, the central images' stream, public images."""

    trainer: Trainer
    sampler: PoissonSampler
    central_rng: torch.Generator | None
    public: PublicImages | None = None
    public_record: dict[str, Any] | None = None


def build_trainer(
    request: TrainRequest, data: OpenedData, planned: PlannedRun, torch_device: torch.device,
    randomness: PrivateRandomness,
) -> BuiltTrainer:  # fmt: skip
    """Step 3: what can fail before the first private read fails here, before the spend is
    reserved: the trainer and batch sampler (weights from the seed, not data), an engine's
    counter, declared-public images."""
    backend, records, plan = data.backend, data.records, planned.plan
    try:
        seed = request.backend.seed
        trainer = backend.trainer(data.info, planned.config, plan, torch_device, seed, randomness)
        sampler = batch_sampler(
            records.n, plan.sampling_rate, randomness.generator("loop/batches"),
            records.sampling_units,
        )  # fmt: skip
        central_rng = central_generator(plan, randomness)
        trainer.preflight()
    except (ValueError, TypeError, OverflowError, RuntimeError, MemoryError) as exc:
        # e.g. an optimizer refusing a value, a seed out of range, a network too large to build
        raise UsageError(
            f"--method {backend.name} cannot start with these settings: {exc}"
        ) from None
    # an engine's counter for a marginal trainer: refused here, before the reservation, if not
    records.attach_to(trainer, backend.name)
    spec = request.images.public
    if spec is None:
        return BuiltTrainer(trainer, sampler, central_rng)
    # Declared-public images (no ε, never through the privacy layer): refused here, before
    # the reservation, when they are the private data or the trainer would not use them.
    assert isinstance(records, ImageData)
    public, record = open_public(spec, records, data.info, trainer, backend.name)
    if planned.needs_public and not public.labelled:
        classes = data.info.classes
        raise UsageError(
            f"--public {public.spec}: {backend.name}'s preset {planned.preset!r} with these "
            f"settings needs images labelled with the data's classes ({', '.join(classes[:6])}"
            f"{', …' if len(classes) > 6 else ''}); these are not"
        )
    return BuiltTrainer(trainer, sampler, central_rng, public, record)


def reserve_spend(
    request: TrainRequest, ledger: Ledger, run_id: str, data: OpenedData, planned: PlannedRun,
    built: BuiltTrainer, torch_device: torch.device,
) -> dict[str, Any]:  # fmt: skip
    """Step 4: the spend reserved in the ledger, bound to what config.json will say about
    method, settings, data and plan; returns that config."""
    info, backend, plan, config = data.info, data.backend, planned.plan, planned.config
    images = "images" if data.image_unit is not None else None
    # `classes` (in info) and `channels` let --resume read the data the same way
    data_json = {
        **info.to_json(), "image_size": request.images.image_size,
        "channels": request.images.channels,
    }  # fmt: skip
    if not data.records.rows_in_memory:  # --resume counts with the same engine
        data_json["engine"] = data.records.engine
    if request.input.public_size is not None:  # `n` is then N', not the record count
        data_json["public_size"] = True
    if data.image_unit is not None:  # --resume maps and bounds the folder the same way
        data_json["privacy_unit"].update(records="images", file=str(request.privacy.privacy_unit))
    bound = {"method": backend.name, "config": config, "data": data_json, "privacy": plan.to_json()}
    if built.public_record is not None:
        bound["public"] = built.public_record
    public = ledger_record(built.public_record) if built.public_record is not None else None
    entry = ledger.reserve(
        dataset_id=info.dataset_id, fingerprint=info.fingerprint, command="train",
        method=backend.name, run_id=run_id, events=list(plan.events), delta=plan.delta,
        private=plan.private, config_sha256=run_config_digest(bound), public=public,
        # Another process may have spent on this dataset since the plan was made.
        max_total_epsilon=plan.target_epsilon if plan.private else None,
        privacy_unit=unit_record(info, images),
    )  # fmt: skip
    assert request.run.ledger is not None
    release = data.schema_release
    run_config: dict[str, Any] = {
        "run_id": run_id, "method": backend.name, "preset": planned.preset, "config": config,
        "data": data_json, "privacy": plan.to_json(), "private": plan.private,
        "ledger": {
            "path": str(Path(request.run.ledger).resolve()), "spend_seq": entry["seq"],
            "spend_hash": entry["hash"],
        },
        # The budget's split between the shared stages and the method's own mechanism.
        "stages": stage_shares(config) if info.modality == "image" else None,
        "seed": request.backend.seed,
        "seed_scope": (
            "public randomness only (initialisation, preview); the DP mechanisms draw from a "
            "secret seed kept in private/"
        ),
        "log_private_loss": bool(request.run.log_private_loss),
        "device": str(torch_device), "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "versions": _package_versions(), "warnings": planned.warnings,
    }  # fmt: skip
    if release is not None:
        run_config["schema_release"] = release
    if info.unit is not None:
        run_config["privacy_unit"] = {
            **(unit_record(info, images) or {}),
            "unit_sizes": (release or {}).get("unit_sizes", {}).get("shares"),
        }
    if built.public_record is not None:
        run_config["public"] = built.public_record
    return run_config


def write_run(
    run: RunDir, ledger: Ledger, run_config: dict[str, Any], randomness: PrivateRandomness,
    info: DataInfo,
) -> None:  # fmt: skip
    """Step 4, end: config.json and the secret on disk before the first record is read, so
    that a crash can still be resumed; if that fails, the reservation is closed at zero cost."""
    existed = run.path.exists()  # empty if so (check_new)
    try:
        run.write_config(run_config)
        run.write_secret(randomness.to_json())
    except BaseException:
        # Nothing was read yet: the reservation is closed at zero cost, and the run directory,
        # holding nothing that counts, is left as it was found.
        seq, run_id = run_config["ledger"]["spend_seq"], run_config["run_id"]
        ledger.abort(seq, events=[], run_id=run_id, fingerprint=info.fingerprint)
        _clear_new_run_dir(run.path, existed)
        raise


def _package_versions() -> dict[str, str]:
    names = ("torch", "prv-accountant", "numpy", "safetensors")
    return {"dpsynth": __version__, **{name: version(name) for name in names}}


def _clear_new_run_dir(path: Path, existed: bool) -> None:
    """Remove what a failed start wrote: the folder itself, or its content when the user had
    made it (empty) beforehand. Best effort: the original error is the one to report."""
    if not existed:
        shutil.rmtree(path, ignore_errors=True)
        return
    for child in list(path.iterdir()) if path.is_dir() else []:
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)
