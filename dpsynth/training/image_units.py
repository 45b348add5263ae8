"""A privacy unit for a class folder of images (`train --data folder:DIR --privacy-unit
UNITS.csv --max-rows-per-unit 1`): the CSV maps each image file to the person it shows.

Every person keeps one image, drawn with the run's secret randomness before any mechanism reads
the folder (`privacy.mechanisms.contribution`, replayed identically on resume). On the bounded
set each record is one person, so every image mechanism (DP-SGD, the frequency model, central
images, the DP teacher, dpkernel's and dpaf's releases) protects a person unchanged. K > 1
images a person would need each mechanism's sensitivity scaled for K images (user-level
clipping of the sum of a person's gradients), which the image backends do not have yet: it is
refused before anything is read or spent.

The CSV has a header; its first column is the image's path (relative to DIR, or absolute), its
second the unit (any text; its header names the unit in the statement, e.g. `patient_id`).
"""

from __future__ import annotations

import csv
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from dpsynth.data.image_folder import list_image_folder
from dpsynth.data.images import ImageData
from dpsynth.data.sources import parse_spec
from dpsynth.errors import DataError, UsageError
from dpsynth.privacy.mechanisms.contribution import UnitBound, bound_contributions
from dpsynth.privacy.mechanisms.randomness import PrivateRandomness

BOUNDING_STREAM = "images/contribution-bound"
MAX_IMAGES_PER_UNIT = 1


def check_image_unit(data: str, unit_file: str, max_rows: int) -> UnitBound:
    """UsageError (exit 2), before anything is read, for a unit on data that has none (a
    built-in set, IDX or `.npz`), a unit file that does not exist, or K above what the image
    backends support; the unit (its column: the unit file's second header)."""
    parsed = parse_spec(data)
    if parsed.kind != "folder":
        raise UsageError(
            f"{{privacy_unit}}: {data} holds no person behind its images (a unit maps the files "
            "of a folder: --data folder:DIR --privacy-unit UNITS.csv); drop {privacy_unit}",
            parameter="privacy_unit",
        )
    if max_rows > MAX_IMAGES_PER_UNIT:
        raise UsageError(
            f"{{max_rows_per_unit}} {max_rows}: the image backends bound one image a person "
            "(their mechanisms are not scaled for several yet); use --max-rows-per-unit 1",
            parameter="max_rows_per_unit",
        )
    path = Path(unit_file)
    if not path.is_file():
        raise UsageError(
            f"{{privacy_unit}} {unit_file}: for images, a CSV file mapping each image's path to "
            "its person (header: path,unit); no such file",
            parameter="privacy_unit",
        )
    return UnitBound(_unit_name(path), max_rows)


def _unit_name(path: Path) -> str:
    """The unit's name: the unit file's second header."""
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            header = next(csv.reader(handle), [])
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"{path}: cannot read the unit file ({exc})") from None
    if len(header) < 2 or not header[1].strip():
        raise DataError(f"{path}: the unit file needs a header `path,unit` (two columns)")
    return header[1].strip()


def image_units(data: str, unit_file: str) -> np.ndarray:
    """The unit of each image of `folder:DIR`, in the order the folder is read (DataError,
    exit 4, for an image without a unit or a mapped path that is not one of the images)."""
    root = Path(parse_spec(data).target)
    _, files = list_image_folder(root)
    mapping: dict[str, str] = {}
    with Path(unit_file).open(newline="", encoding="utf-8") as handle:
        rows = csv.reader(handle)
        next(rows, None)
        for line, row in enumerate(rows, start=2):
            if len(row) < 2 or not row[0].strip() or not row[1].strip():
                raise DataError(f"{unit_file}:{line}: expected `path,unit`, both non-empty")
            mapping[_key(root, row[0].strip())] = row[1].strip()
    keys = [_key(root, str(path)) for path, _ in files]
    missing = [k for k in keys if k not in mapping]
    if missing:
        raise DataError(
            f"{unit_file}: {len(missing):,} image(s) of {root} have no unit (first: "
            f"{missing[0]}); every image must name its person"
        )
    unknown = sorted(set(mapping) - set(keys))
    if unknown:
        raise DataError(
            f"{unit_file}: {len(unknown):,} path(s) are not images of {root} (first: {unknown[0]})"
        )
    return np.asarray([mapping[k] for k in keys], dtype=object)


def _key(root: Path, path: str) -> str:
    """A file's path relative to the folder (as written, or resolved from an absolute one)."""
    candidate = Path(path)
    if candidate.is_absolute():
        try:
            return candidate.resolve().relative_to(root.resolve()).as_posix()
        except ValueError:
            return candidate.as_posix()
    return candidate.as_posix()


def bound_images(
    records: ImageData, units: np.ndarray, unit: UnitBound, randomness: PrivateRandomness
) -> ImageData:
    """The images with at most K a person, drawn from the run's secret stream (the same ones
    every time the run reads the folder); the content digest names the whole folder."""
    if len(units) != records.n:
        raise DataError("the unit file maps a different number of images than were read")
    generator = randomness.replayable(BOUNDING_STREAM)
    kept = torch.from_numpy(bound_contributions(units, unit.max_rows, generator))
    digest = records.content_digest
    return replace(records, x=records.x[kept], y=records.y[kept], _content_digest=digest)


def bounded_images(
    data: str, unit_file: str, max_rows: int, records: ImageData, randomness: PrivateRandomness
) -> tuple[ImageData, UnitBound]:
    """A new run's folder bounded to one image a person (its unit checked when the request was
    built), and the unit."""
    unit = check_image_unit(data, unit_file, max_rows)
    return bound_images(records, image_units(data, unit_file), unit, randomness), unit


def rebound_images(
    records: ImageData, data: str, recorded: dict, randomness: PrivateRandomness | None
) -> ImageData:
    """A run's folder read again (resume, other ranks), bounded to the same images."""
    if randomness is None:
        raise DataError("a folder with a privacy unit is read again with its run's secret")
    unit = UnitBound(str(recorded["column"]), int(recorded["max_rows_per_unit"]))
    return bound_images(records, image_units(data, str(recorded["file"])), unit, randomness)
