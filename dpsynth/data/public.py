"""Images the data owner declares public (`train --public SPEC`), brought to the private data's
public shape, for pretraining at no privacy cost.

The set is read through the same loaders as `--data` (any image spec), converted to the private
data's channel count (repeat, or the ITU-R 601 luma average) and resized to its H×W with a fixed
public interpolation (bilinear, antialiased). Its labels are kept only when its class names are
the private data's label set (mapped by name); otherwise it is unlabelled. Nothing here reads
the private records: the shape and the label set it is brought to are public facts.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from dpsynth.data.images import ImageData
from dpsynth.data.sources import _convert_channels, is_table_spec, load_data, parse_spec
from dpsynth.errors import DataError, UsageError

# What `describe` says about the map to the private shape (it is part of the public record).
INTERPOLATION = "bilinear, antialiased"
_RESIZE_CHUNK = 1024


@dataclass(frozen=True)
class PublicImages:
    """A declared-public image set in the private data's shape.

    x: uint8 [n, C, H, W] (the private data's C, H, W); y: int64 [n] in the private data's
    label order, or None when the set's classes are not the private label set (unlabelled).
    `content_digest` is the SHA-256 of the images as used (after the resize) with their own
    labels and classes: public data, so it may be published.
    """

    x: torch.Tensor
    y: torch.Tensor | None
    spec: str
    classes: tuple[str, ...]
    source_shape: tuple[int, ...] | None
    content_digest: str

    @property
    def n(self) -> int:
        """Number of images."""
        return int(self.x.shape[0])

    @property
    def labelled(self) -> bool:
        """Whether the set carries the private data's labels."""
        return self.y is not None

    def as_float(self) -> torch.Tensor:
        """Pixels as float32 in [-1, 1], the scale every generator trains on."""
        return self.x.float().div(127.5).sub(1.0)

    def describe(self, shape: tuple[int, int, int]) -> str:
        """One line on how the set was brought to `shape` (C, H, W)."""
        c, h, w = shape
        if self.source_shape is None:
            return f"read as {c} channel(s) at {h}×{w} ({INTERPOLATION})"
        c0, h0, w0 = self.source_shape
        steps = []
        if c0 != c:
            steps.append(f"{c0} → {c} channel(s)")
        if (h0, w0) != (h, w):
            steps.append(f"{h0}×{w0} → {h}×{w} ({INTERPOLATION})")
        return "; ".join(steps) or "used as is"


def pixel_digest(x: torch.Tensor) -> str:
    """SHA-256 of uint8 images [N, C, H, W] alone (shape and bytes, no labels): tells the
    same pictures under other class names."""
    h = hashlib.sha256(("dpsynth-pixels-v1|" + ",".join(map(str, x.shape)) + "|").encode())
    h.update(np.ascontiguousarray(x.numpy(), dtype=np.uint8).tobytes())
    return h.hexdigest()


def _resize(x: np.ndarray, height: int, width: int) -> np.ndarray:
    """uint8 [N, C, h, w] → [N, C, height, width] (bilinear, antialiased)."""
    if x.shape[2:] == (height, width):
        return x
    out = np.empty((*x.shape[:2], height, width), dtype=np.uint8)
    for start in range(0, len(x), _RESIZE_CHUNK):
        chunk = torch.from_numpy(x[start : start + _RESIZE_CHUNK].astype(np.float32))
        resized = F.interpolate(chunk, size=(height, width), mode="bilinear", antialias=True)
        out[start : start + _RESIZE_CHUNK] = resized.round().clamp(0, 255).to(torch.uint8).numpy()
    return out


def _read(spec: str, shape: tuple[int, int, int]) -> tuple[ImageData, tuple[int, ...] | None]:
    """The set read through `load_data` and brought to `shape`, and its shape as stored (None
    for a class folder, whose files the loader converts and resizes as it reads them)."""
    channels, height, width = shape
    if is_table_spec(spec):
        raise UsageError(f"--public {spec}: a table; --public takes images")
    try:
        if parse_spec(spec).kind == "folder":  # files of several sizes or channel counts
            size = height if height == width else None
            data = load_data(spec, image_size=size, channels=channels)
            source = None
        else:
            data = load_data(spec)
            source = data.shape
    except (UsageError, DataError) as exc:
        raise type(exc)(f"--public: {exc}") from None
    pixels = _resize(_convert_channels(data.x.numpy(), channels), height, width)
    used = ImageData(
        x=torch.from_numpy(np.ascontiguousarray(pixels)),
        y=data.y,
        classes=data.classes,
        spec=data.spec,
        kind=data.kind,
    )
    return used, source


def load_public(spec: str, shape: tuple[int, int, int], classes: tuple[str, ...]) -> PublicImages:
    """Read the image set `spec` (any `--data` image spec) in the private data's public
    `shape` (C, H, W) with its labels mapped onto `classes` when its class names are the same
    set (else unlabelled). UsageError for a table or a bad spec, DataError for bad files."""
    data, source = _read(spec, tuple(int(s) for s in shape))  # type: ignore[arg-type]
    if data.n == 0:
        raise DataError(f"--public {spec}: no images")
    y = None
    if len(data.classes) == len(classes) and set(data.classes) == set(classes):
        order = torch.tensor([classes.index(name) for name in data.classes], dtype=torch.int64)
        y = order[data.y]
    return PublicImages(
        x=data.x,
        y=y,
        spec=data.spec,
        classes=tuple(data.classes),
        source_shape=source,
        content_digest=data.content_digest,
    )


def same_as_private(public: PublicImages, private: ImageData) -> bool:
    """Whether the public set is the private data itself: the same spec or dataset id, the
    same content digest, or the same pictures (pixels alone, in the private shape)."""
    if public.spec in (private.spec, private.dataset_id):
        return True
    if public.content_digest == private.content_digest:
        return True
    return public.x.shape == private.x.shape and pixel_digest(public.x) == pixel_digest(private.x)
