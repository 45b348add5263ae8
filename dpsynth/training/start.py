"""Starting a new run: plan, reserve, write (rank 0, or the only process).

Order of events, which is the privacy contract:
1. load the data set's public description (N, shape, classes, the keyed fingerprint);
2. compute the privacy plan (σ from the target ε, δ, q, T and the dataset's earlier spends);
   build the trainer and the batch sampler: everything that can fail on public facts fails
   here, before any spend;
3. reserve the spend in the ledger (fsynced; refused with exit 3 over a budget cap) and write
   the run's config and its secret (to `private/`) before any record is read.
The loop (`dpsynth.training.loop`) then reads records, one Poisson batch per step.
"""

from __future__ import annotations

import shutil
import uuid
from dataclasses import replace
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path
from typing import Any

import torch

from dpsynth import __version__
from dpsynth.data.engines import PassCallback
from dpsynth.data.engines.source import TableSource
from dpsynth.data.sources import is_table_spec, load_data
from dpsynth.data.table_codec import TableData
from dpsynth.distributed import Launch
from dpsynth.errors import UsageError
from dpsynth.ledger import Ledger
from dpsynth.ledger.anchors import run_config_digest
from dpsynth.methods.base import Method
from dpsynth.methods.blocks import stage_shares
from dpsynth.methods.recommend import AUTO, recommend_method, resolve_preset
from dpsynth.methods.registry import get_method
from dpsynth.privacy.accounting.calibration import default_delta
from dpsynth.privacy.accounting.plan import PrivacyTarget
from dpsynth.privacy.mechanisms.poisson import batch_sampler
from dpsynth.privacy.mechanisms.randomness import PrivateRandomness
from dpsynth.rundir import RunDir
from dpsynth.training.data import (
    attach_source,
    check_engine_method,
    check_modality,
    keyed_fingerprint,
    public_info,
)
from dpsynth.training.image_units import bounded_images
from dpsynth.training.public import ledger_record, open_public
from dpsynth.training.release_fit import check_training_fits, recommended
from dpsynth.training.request import TrainRequest
from dpsynth.training.schema_spend import with_released_one_ways
from dpsynth.training.session import Session, central_generator
from dpsynth.training.table_units import (
    check_unit_composition,
    check_unit_method,
    id_columns_advice,
    unit_bound,
    unit_record,
    unit_rows,
)


def _package_versions() -> dict[str, str]:
    names = ("torch", "prv-accountant", "numpy", "safetensors")
    return {"dpsynth": __version__, **{name: version(name) for name in names}}


def start_run(
    request: TrainRequest,
    torch_device: torch.device,
    launch: Launch | None,
    on_pass: PassCallback | None = None,
) -> Session:
    """Plan, reserve and write a new run (rank 0, or the only process); `on_pass` hears of
    each pass an out-of-core engine makes over a table."""
    out, ledger_path, preset, seed = request.out, request.ledger_path, request.preset, request.seed
    log_private_loss, privacy_seed = request.log_private_loss, request.privacy_seed
    image_size, channels = request.image_size, request.channels
    delta = request.delta
    run = RunDir(out)
    assert ledger_path is not None and request.method is not None and request.data is not None
    ledger = Ledger(ledger_path)
    target_epsilon = request.target_epsilon
    # --method auto is resolved from the public description once it is known (below).
    backend = None if request.method == AUTO else get_method(request.method)
    run.check_new()
    run_id = uuid.uuid4().hex[:12]
    # Drawn before anything is read; it reaches the disk only in the run's private folder.
    randomness = (
        PrivateRandomness(privacy_seed) if privacy_seed is not None else PrivateRandomness.fresh()
    )
    schema_release, image_unit = None, None
    if is_table_spec(request.data):
        records, schema_release, backend = _load_table(
            request, backend, ledger, target_epsilon, run_id, randomness, on_pass
        )
    else:
        if backend is not None:
            check_modality(backend, "image")
        records = load_data(
            request.data,
            image_size=image_size,
            dataset_id=request.dataset_id,
            classes=request.classes,
            channels=channels,
        )
        if request.privacy_unit is not None:  # one image a person, before anything is read
            unit_spec = (request.data, request.privacy_unit, request.max_rows_per_unit or 1)
            records, image_unit = bounded_images(*unit_spec, records, randomness)
    # The ledger's keyed fingerprint: it links spends on the same records, and unlike their
    # plain digest it is no membership test for whoever reads the ledger or the run dir. A
    # ledger without a key yet gets one only once nothing can refuse the command (below).
    digest = records.content_digest
    existing = ledger.data_fingerprint(digest, create=False)
    info = public_info(records, existing or "", request.public_size)
    if not isinstance(records, TableData):  # images, engines: one unit per data set
        check_unit_composition(ledger, info.dataset_id, existing, image_unit)
    if image_unit is not None:
        info = replace(info, unit=image_unit.column, rows_per_unit=image_unit.max_rows)
    if backend is None:
        backend = get_method(recommend_method(info, target_epsilon))
    warnings: list[str] = list((schema_release or {}).get("warnings", []))
    if backend.table_advice and info.modality == "table":
        warnings.append(backend.table_advice)
    if isinstance(records, TableData) and records.unit is None:
        advice = id_columns_advice(records.schema)
        if advice:
            warnings.append(advice)
    if delta is None:  # the schema release's δ when there was one (N before bounding)
        delta = (schema_release or {}).get("delta") or default_delta(info.n)
    elif delta >= 1.0 / info.n:
        warnings.append(
            f"δ={delta:g} is not below 1/N = {1.0 / info.n:.3g}: a mechanism could release a "
            "whole record with that probability; use a smaller --delta"
        )
    preset = resolve_preset(backend, preset, info, target_epsilon)
    if preset in backend.preset_advice and info.modality == "image":
        warnings.append(backend.preset_advice[preset])
    config = backend.config(preset, dict(request.overrides), info)
    config = with_released_one_ways(config, schema_release, backend.reuses_one_ways)
    needs_public = backend.public_requirement(preset, config)
    if needs_public and request.public is None:
        raise UsageError(
            f"{backend.name}'s preset {preset!r} {needs_public}: give {{public}} SPEC (labelled "
            "images of the data's classes), or take a preset without it",
            parameter="public",
        )
    # What can fail before the first private read fails here, before the spend is reserved:
    # the config, the plan, the trainer and batch sampler (weights from the seed, not data).
    if isinstance(records, TableSource):  # the engine counts: no rows are held here
        backend.validate_config(config, info, rows_in_memory=False)  # type: ignore[call-arg]
    else:
        backend.validate_config(config, info)
    target = PrivacyTarget(target_epsilon, float(delta))
    # Budgets follow the data: spends linked by dataset id or fingerprint are composed in.
    # Without a key no spend holds a keyed fingerprint; the plain digest (in memory only)
    # finds the spends a legacy ledger recorded under it.
    prior = ledger.events_for(info.dataset_id, existing or digest)
    plan = backend.plan(info, target, config, prior)
    try:
        trainer = backend.trainer(info, config, plan, torch_device, seed, randomness)
        sampler = batch_sampler(
            records.n, plan.sampling_rate, randomness.generator("loop/batches"), unit_rows(records)
        )
        central_rng = central_generator(plan, randomness)
        trainer.preflight()
    except (ValueError, TypeError, OverflowError, RuntimeError, MemoryError) as exc:
        # e.g. an optimizer refusing a value, a seed out of range, a network too large to build
        raise UsageError(
            f"--method {backend.name} cannot start with these settings: {exc}"
        ) from None
    if isinstance(records, TableSource):  # refused here, before the reservation, if it can't
        attach_source(trainer, records, backend.name)
    # Declared-public images (no ε, never through the privacy layer): refused here, before
    # the reservation, when they are the private data or the trainer would not use them.
    public, public_record = None, None
    if request.public is not None:
        assert not isinstance(records, TableData)
        public, public_record = open_public(request.public, records, info, trainer, backend.name)
        if needs_public and not public.labelled:
            raise UsageError(
                f"--public {public.spec}: {backend.name}'s preset {preset!r} with these settings "
                f"needs images labelled with the data's classes ({', '.join(info.classes[:6])}"
                f"{', …' if len(info.classes) > 6 else ''}); these are not"
            )
    if existing is None:
        info = replace(info, fingerprint=keyed_fingerprint(ledger, digest))
    # `classes` (in info) and `channels` let --resume read the data the same way
    data_json = {**info.to_json(), "image_size": image_size, "channels": channels}
    if isinstance(records, TableSource):  # --resume counts with the same engine
        data_json["engine"] = records.engine
    if request.public_size is not None:  # `n` is then N', not the record count
        data_json["public_size"] = True
    if image_unit is not None:  # --resume maps and bounds the folder the same way
        data_json["privacy_unit"].update(records="images", file=str(request.privacy_unit))
    # The spend binds what config.json will say about method, settings, data and plan.
    bound = {"method": backend.name, "config": config, "data": data_json, "privacy": plan.to_json()}
    if public_record is not None:
        bound["public"] = public_record
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
        public=ledger_record(public_record) if public_record is not None else None,
        privacy_unit=unit_record(info, "images" if image_unit is not None else None),
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
        # The budget's split between the shared stages and the method's own mechanism.
        "stages": stage_shares(config) if info.modality == "image" else None,
        "seed": seed,
        "seed_scope": (
            "public randomness only (initialisation, preview); the DP mechanisms draw from a "
            "secret seed kept in private/"
        ),
        "log_private_loss": bool(log_private_loss),
        "device": str(torch_device),
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "versions": _package_versions(),
        "warnings": warnings,
    }
    if schema_release is not None:
        run_config["schema_release"] = schema_release
    if info.unit is not None:
        run_config["privacy_unit"] = {
            **(unit_record(info, "images" if image_unit is not None else None) or {}),
            "unit_sizes": (schema_release or {}).get("unit_sizes", {}).get("shares"),
        }
    if public_record is not None:
        run_config["public"] = public_record
    if launch is not None:  # informational: the mechanism is the same for any world size
        run_config["launch"] = {"world_size": launch.world_size}
    existed = run.path.exists()  # empty if so (check_new)
    try:
        run.write_config(run_config)
        # On disk before the first record is read, so that a crash can still be resumed.
        run.write_secret(randomness.to_json())
    except BaseException:
        # Nothing was read yet: the reservation is closed at zero cost, and the run directory,
        # holding nothing that counts, is left as it was found.
        ledger.abort(entry["seq"], events=[], run_id=run_id, fingerprint=info.fingerprint)
        _clear_new_run_dir(run.path, existed)
        raise
    return Session(
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
        public=public,
    )


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


def _load_table(
    request: TrainRequest,
    backend: Method | None,
    ledger: Ledger,
    target_epsilon: float,
    run_id: str,
    randomness: PrivateRandomness,
    on_pass: PassCallback | None = None,
) -> tuple[TableData | TableSource, dict[str, Any] | None, Method]:
    """The table under a public schema, the release of its schema entries (None: none), and
    the run's backend (`--method auto`: chosen from the table's public description, the one a
    DP schema release is planned on, so that the release and the run agree). A release is
    planned from public facts, the training plan after it is checked to fit, and only then is
    the release spent."""
    from dpsynth.data.engines import EngineChoice, parse_engine
    from dpsynth.training.engine_release import engine_table
    from dpsynth.training.table_schema import read_table_input, release_table_schema, schema_share
    from dpsynth.training.table_source import table_engine

    if backend is not None:
        check_modality(backend, "table")
    if request.image_size is not None or request.channels is not None:
        raise UsageError(
            "{image_size} and {channels} are for images, not tables",
            parameters=("image_size", "channels"),
        )
    if request.classes is not None:
        message = "a table's classes are its schema's target categories; drop {classes}"
        raise UsageError(message, parameter="classes")
    assert request.data is not None
    unit = unit_bound(request.privacy_unit, request.max_rows_per_unit)
    if unit is not None and backend is not None:
        check_unit_method(backend, unit)
    engine = parse_engine(request.engine)
    counts = backend is None or hasattr(getattr(backend, "trainer_class", None), "attach_counter")
    chosen_engine = table_engine(
        request.data, engine, request.schema, request.memory_budget, counts
    )
    if chosen_engine != "memory":
        if engine.name == "auto":  # DuckDB, chosen for the table's size
            engine = EngineChoice(chosen_engine)
        if backend is not None:
            check_engine_method(backend, EngineChoice(chosen_engine, engine.address).spec)
        if unit is not None:
            raise UsageError(
                f"{{privacy_unit}}: the table is counted out of core ({chosen_engine}); a privacy "
                "unit bounds rows in memory for now (--engine memory, within the memory budget)",
                parameters=("privacy_unit", "engine"),
            )
        return engine_table(request, engine, backend, ledger, run_id, randomness, on_pass)
    table = read_table_input(
        spec=request.data,
        schema_path=request.schema,
        schema_public=request.schema_public,
        schema_epsilon=request.schema_epsilon,
        class_weights_epsilon=request.class_weights_epsilon,
        dataset_id=request.dataset_id,
        ledger=ledger,
        delta=request.delta,
        public_size=request.public_size,
        target_epsilon=target_epsilon,
        unit=unit,
        share=schema_share(backend is None or backend.reuses_one_ways),  # auto: mst or aim
    )
    if table.provisional is None:  # nothing to release: choose on the encoded table
        records = table.encoded()
        existing = ledger.data_fingerprint(records.content_digest, create=False)
        check_unit_composition(ledger, table.dataset, existing, unit)
        return records, None, backend or recommended(records.info(""), target_epsilon)
    # before the release is spent: the data set's earlier spends must protect the same unit
    check_unit_composition(ledger, table.dataset, table.fingerprint, unit)
    info = table.provisional
    if request.public_size is not None:
        info = replace(info, n=request.public_size)
    backend = backend or recommended(info, target_epsilon)
    if unit is not None:
        check_unit_method(backend, unit)
    # The training run must still fit after the release's spend: planned before it is spent.
    assert table.delta is not None
    check_training_fits(backend, request, info, table.events, table.delta, ledger)
    records, release = release_table_schema(table, ledger, backend.name, run_id, randomness)
    return records, release, backend
