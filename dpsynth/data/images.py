"""In-memory image data sets: uint8 pixels, integer labels, and their public description."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import torch


@dataclass(frozen=True)
class DataInfo:
    """What is public about a data set: its size, shape and label set, and its identity.

    `dataset_id` keys the ledger's per-dataset composition; `fingerprint` names which records
    were used, keyed under the ledger's secret key (`dpsynth.ledger.key`; empty until a
    ledger keyed it), so that it links spends without being a membership test. Neither the
    pixels nor anything computed from them beyond these fields is here.
    """

    spec: str
    kind: str
    n: int
    shape: tuple[int, int, int]
    classes: tuple[str, ...]
    fingerprint: str
    dataset_id: str
    # "image" (shape (C, H, W), uint8 pixels) or "table" (shape (D,), rows encoded under
    # `schema`, the public schema's JSON: public by construction once declared or released).
    modality: str = "image"
    schema: dict | None = None
    # Tables with a privacy unit: the column naming it and the most rows a unit keeps (every
    # mechanism's sensitivity is scaled by it); None and 1: the unit is a row.
    unit: str | None = None
    rows_per_unit: int = 1

    def to_json(self) -> dict:
        """A JSON-ready dict (shape and classes as lists; modality and schema for tables)."""
        out = {
            "spec": self.spec,
            "kind": self.kind,
            "n": self.n,
            "shape": list(self.shape),
            "classes": list(self.classes),
            "fingerprint": self.fingerprint,
            "dataset_id": self.dataset_id,
        }
        if self.modality != "image":
            out["modality"] = self.modality
            out["schema"] = self.schema
        if self.unit is not None:
            out["privacy_unit"] = {"column": self.unit, "max_rows_per_unit": self.rows_per_unit}
        return out

    @classmethod
    def from_json(cls, obj: dict) -> DataInfo:
        """Inverse of `to_json`."""
        return cls(
            spec=obj["spec"],
            kind=obj["kind"],
            n=int(obj["n"]),
            shape=tuple(obj["shape"]),  # type: ignore[arg-type]
            classes=tuple(obj["classes"]),
            fingerprint=obj["fingerprint"],
            dataset_id=obj["dataset_id"],
            modality=str(obj.get("modality", "image")),
            schema=obj.get("schema"),
            unit=(obj.get("privacy_unit") or {}).get("column"),
            rows_per_unit=int((obj.get("privacy_unit") or {}).get("max_rows_per_unit", 1)),
        )


def image_content_digest(x: torch.Tensor, y: torch.Tensor, classes: tuple[str, ...]) -> str:
    """SHA-256 of the canonical bytes: shape, class names, uint8 pixels (N,C,H,W), int64 labels.

    Private: with every other record known, it tells whether a record is in the data. It is
    only ever written keyed (`DataInfo.fingerprint`)."""
    h = hashlib.sha256()
    h.update(("dpsynth-images-v1|" + ",".join(map(str, x.shape)) + "|").encode())
    h.update(("\x1f".join(classes) + "|").encode())
    h.update(np.ascontiguousarray(x.numpy(), dtype=np.uint8).tobytes())
    h.update(np.ascontiguousarray(y.numpy(), dtype="<i8").tobytes())
    return h.hexdigest()


@dataclass
class ImageData:
    """A labelled image data set held in memory.

    x: uint8 tensor [N, C, H, W]; y: int64 tensor [N] with values in range(len(classes)).
    """

    x: torch.Tensor
    y: torch.Tensor
    classes: tuple[str, ...]
    spec: str
    kind: str
    dataset_id: str = ""
    _content_digest: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not self.dataset_id:
            self.dataset_id = self.spec

    @property
    def n(self) -> int:
        """Number of records."""
        return int(self.x.shape[0])

    @property
    def shape(self) -> tuple[int, int, int]:
        """Per-record shape (C, H, W)."""
        c, h, w = self.x.shape[1:]
        return (int(c), int(h), int(w))

    @property
    def content_digest(self) -> str:
        """SHA-256 of the canonical image and label bytes (cached; private, see
        `image_content_digest`)."""
        if self._content_digest is None:
            self._content_digest = image_content_digest(self.x, self.y, self.classes)
        return self._content_digest

    def info(self, fingerprint: str = "") -> DataInfo:
        """The public description of this data set, with the ledger's keyed `fingerprint`."""
        return DataInfo(
            spec=self.spec,
            kind=self.kind,
            n=self.n,
            shape=self.shape,
            classes=tuple(self.classes),
            fingerprint=fingerprint,
            dataset_id=self.dataset_id,
        )

    def as_float(self) -> torch.Tensor:
        """Pixels as float32 in [-1, 1], the scale every generator trains on."""
        return self.x.float().div(127.5).sub(1.0)

    # the `Records` interface (`dpsynth.data.records`): images are held and handed over
    engine: ClassVar[str] = "memory"  # records.MEMORY_ENGINE (records imports this module)
    rows_in_memory: ClassVar[bool] = True
    sampling_units: ClassVar[None] = None  # a person keeps one image (`image_units`)

    def attach_to(self, trainer: object, method: str) -> None:
        """Nothing: the loop hands the trainer its batches of images."""

    def close(self) -> None:
        """Nothing to release: the images are held."""


def to_uint8(images: torch.Tensor) -> torch.Tensor:
    """Map float images in [-1, 1] back to uint8 pixels (clamped)."""
    return images.add(1.0).mul(127.5).round().clamp(0, 255).to(torch.uint8)
