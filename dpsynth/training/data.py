"""The run's data: read the way the run recorded it, described publicly (N or a declared
public size N', shape, classes) and named by the ledger's keyed fingerprint, never by the
records' plain digest.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from dpsynth.data.engines import EngineChoice, PassCallback
from dpsynth.data.engines.source import TableSource, needs_rows_message
from dpsynth.data.images import DataInfo, ImageData
from dpsynth.data.schema_file import parse_schema
from dpsynth.data.sources import load_data
from dpsynth.data.table_codec import TableData
from dpsynth.errors import DataError, UsageError
from dpsynth.ledger import Ledger
from dpsynth.ledger.key import is_legacy
from dpsynth.methods.base import Method
from dpsynth.methods.registry import get_method, method_names
from dpsynth.privacy.mechanisms.contribution import UnitBound
from dpsynth.privacy.mechanisms.randomness import PrivateRandomness
from dpsynth.training.request import TrainRequest


def open_images(
    request: TrainRequest, backend: Method | None, randomness: PrivateRandomness
) -> tuple[ImageData, UnitBound | None]:
    """A new run's images as read, and with a privacy unit each person bounded to one image
    (from the run's secret `randomness`) before anything is read; `backend` None: auto."""
    if backend is not None:
        check_modality(backend, "image")
    data, images, privacy = request.input, request.images, request.privacy
    records = load_data(
        data.data,
        image_size=images.image_size,
        dataset_id=data.dataset_id,
        classes=images.classes,
        channels=images.channels,
    )
    if privacy.privacy_unit is None:
        return records, None
    from dpsynth.training.image_units import bounded_images

    unit_spec = (data.data, privacy.privacy_unit, privacy.max_rows_per_unit or 1)
    return bounded_images(*unit_spec, records, randomness)


def load_recorded(
    data_cfg: Mapping[str, Any],
    name: str,
    on_pass: PassCallback | None = None,
    randomness: PrivateRandomness | None = None,
    choice: EngineChoice | None = None,
    workers: int | None = None,
) -> ImageData | TableData | TableSource:
    """The data a run recorded in config.json, read the same way (resume, other ranks; a
    table counted out of core by the same engine, after its check pass again: `choice` is
    that engine with the resumed request's TLS credentials, counting with `workers`; a table
    with a privacy unit bounded to the same rows, which the run's secret `randomness`
    replays)."""
    engine = data_cfg.get("engine")
    if data_cfg.get("modality") == "table" and engine not in (None, "memory"):
        from dpsynth.data.engines import parse_engine
        from dpsynth.training.table_source import open_table_source

        schema = parse_schema(data_cfg["schema"], f"{name} schema")
        return open_table_source(
            data_cfg["spec"], schema, choice or parse_engine(engine), None,
            data_cfg["dataset_id"], on_pass, workers=workers,
        )  # fmt: skip
    if data_cfg.get("modality") == "table":
        # The run's schema is public (declared or released when the run began): no new release.
        from dpsynth.training.table_units import load_bounded_table

        return load_bounded_table(
            data_cfg["spec"],
            parse_schema(data_cfg["schema"], f"{name} schema"),
            data_cfg["dataset_id"],
            data_cfg.get("privacy_unit"),
            randomness,
        )
    images = load_data(
        data_cfg["spec"],
        image_size=data_cfg.get("image_size"),
        dataset_id=data_cfg["dataset_id"],
        classes=data_cfg.get("classes"),
        channels=data_cfg.get("channels"),
    )
    if data_cfg.get("privacy_unit") and isinstance(images, ImageData):
        from dpsynth.training.image_units import rebound_images

        return rebound_images(images, data_cfg["spec"], data_cfg["privacy_unit"], randomness)
    return images


def check_engine_method(backend: Method, engine: str) -> None:
    """UsageError (exit 2), before the table is read, for a backend whose trainer needs the
    rows themselves on an out-of-core engine."""
    if not hasattr(getattr(backend, "trainer_class", None), "attach_counter"):
        raise UsageError(needs_rows_message(engine, backend.name))


def check_modality(backend: Method, modality: str) -> None:
    """UsageError (exit 2) when the backend cannot train on this kind of data."""
    if modality not in backend.modalities:
        others = [n for n in method_names() if modality in get_method(n).modalities]
        kind = "image-only" if backend.modalities == ("image",) else "not for " + modality + "s"
        raise UsageError(
            f"--method {backend.name} is {kind}; for {modality}s use --method "
            f"{' or '.join(others) or '(none)'}"
        )


def public_info(
    records: ImageData | TableData | TableSource, fingerprint: str, public_size: int | None
) -> DataInfo:
    """The data's public description; with a public size N', `n` is N' (the sampling rate, δ
    and config.json use it), and the records must not outnumber it."""
    info = records.info(fingerprint)
    if public_size is None:
        return info
    if records.n > public_size:
        raise DataError(
            f"{info.spec}: --public-size {public_size} is below the number of records; it must "
            "be a public upper bound on it"
        )
    return replace(info, n=public_size)


def recorded_public_size(data_cfg: Mapping[str, Any]) -> int | None:
    """The public size N' a run recorded (its `n`), or None when `n` is the record count."""
    return int(data_cfg["n"]) if data_cfg.get("public_size") else None


def keyed_fingerprint(ledger: Ledger, content_digest: str) -> str:
    """The ledger's keyed fingerprint of the data (its key is made on first use)."""
    fingerprint = ledger.data_fingerprint(content_digest)
    assert fingerprint is not None
    return fingerprint


def recorded_fingerprint(ledger: Ledger, content_digest: str, recorded: str) -> str:
    """This data's fingerprint in the form the run recorded: keyed, or the plain digest a run
    started before the ledger key kept (its spend names that digest, so it is what the run's
    anchor and the closing status line must match)."""
    return content_digest if is_legacy(recorded) else keyed_fingerprint(ledger, content_digest)
