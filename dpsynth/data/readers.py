"""Readers for the user's own image files: IDX (MNIST family), class folders, `.npz` arrays.

Each reader returns `RawImages` (uint8 pixels [N, C, H, W], int64 labels, class names) or
raises `DataError` with one line that starts with the offending file. Which channels, size and
class names a data set has comes from the file format and the folder layout, which the data
owner declares by writing them; nothing is chosen by looking at pixel or label statistics.
The label set is public (see docs/privacy.md): IDX files are the ten digits by
format, a class folder's classes are its sub-folder names, and an `.npz` needs a stored
`classes` array or a declared list (`--classes`). A record whose label lies outside the
declared set is malformed data, never a new class.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from dpsynth.errors import DataError, UsageError

IDX_UNSIGNED_BYTE = 0x08
IDX_FILES: dict[str, tuple[str, str]] = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
IDX_CLASSES: tuple[str, ...] = tuple(str(d) for d in range(10))
IMAGE_SUFFIXES = frozenset(
    {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".pgm", ".ppm"}
)
GRAY_MODES = frozenset({"1", "L", "LA"})
WIDE_MODES = frozenset({"I", "F", "I;16", "I;16B", "I;16L", "I;16N"})
RESIZE_CHUNK = 2048


@dataclass
class RawImages:
    """Decoded images before they become an `ImageData`: x uint8 [N,C,H,W], y int64 [N]."""

    x: np.ndarray
    y: np.ndarray
    classes: tuple[str, ...]


def one_line(text: str) -> str:
    """Collapse whitespace so that an error message stays on one line."""
    return " ".join(str(text).split())


def data_error(path: Path | str, problem: str) -> DataError:
    """A one-line `DataError` that names the file first."""
    return DataError(one_line(f"{path}: {problem}"))


def describe(error: BaseException) -> str:
    """A short description of a low-level exception for an error message."""
    text = str(error) or type(error).__name__
    return one_line(text)


def resize_uint8(x: np.ndarray, image_size: int) -> np.ndarray:
    """Resize uint8 images [N,C,H,W] to image_size x image_size (bilinear, antialiased)."""
    if x.shape[2:] == (image_size, image_size):
        return x
    out = np.empty((*x.shape[:2], image_size, image_size), dtype=np.uint8)
    for start in range(0, len(x), RESIZE_CHUNK):
        chunk = torch.from_numpy(x[start : start + RESIZE_CHUNK].astype(np.float32))
        resized = F.interpolate(
            chunk, size=(image_size, image_size), mode="bilinear", antialias=True
        )
        out[start : start + RESIZE_CHUNK] = resized.round().clamp(0, 255).to(torch.uint8).numpy()
    return out


# --- IDX (MNIST, Fashion-MNIST, KMNIST as torchvision keeps them) ---------------------------


def idx_search_folders(root: Path) -> list[Path]:
    """Where `mnist:DIR` looks for IDX files, in order."""
    return [root, root / "raw", root / "MNIST" / "raw"]


def _find_file(folder: Path, name: str) -> Path | None:
    dotted = name.replace("-idx", ".idx")  # some mirrors write train-images.idx3-ubyte
    for candidate in (name, name + ".gz", dotted, dotted + ".gz"):
        if (folder / candidate).is_file():
            return folder / candidate
    return None


def find_idx_files(root: Path, split: str) -> tuple[Path, Path]:
    """The images and labels files of a split under `root` (see `idx_search_folders`)."""
    images_name, labels_name = IDX_FILES[split]
    for folder in idx_search_folders(root):
        images, labels = _find_file(folder, images_name), _find_file(folder, labels_name)
        if images and labels:
            return images, labels
        if images or labels:
            found, missing = (images, labels_name) if images else (labels, images_name)
            raise UsageError(f"found {found} but no {missing}[.gz] next to it")
    looked = ", ".join(str(folder) for folder in idx_search_folders(root))
    raise UsageError(f"no such file or folder: {images_name}[.gz] (looked in {looked})")


def read_maybe_gzip(path: Path) -> bytes:
    """The bytes of a file, gunzipped when it starts with the gzip magic number."""
    import gzip
    import zlib

    try:
        with path.open("rb") as handle:
            compressed = handle.read(2) == b"\x1f\x8b"
        if compressed:
            with gzip.open(path, "rb") as handle:
                return handle.read()
        return path.read_bytes()
    except (OSError, EOFError, zlib.error) as error:  # gzip.BadGzipFile is an OSError
        raise data_error(path, f"cannot read ({describe(error)})") from error


def parse_idx(data: bytes, path: Path, ndim: int) -> np.ndarray:
    """Decode an IDX array of unsigned bytes with `ndim` dimensions, checking the header."""
    if len(data) < 4 or data[0] != 0 or data[1] != 0:
        raise data_error(path, f"not an IDX file (magic number 0x{data[:4].hex()})")
    type_code, dims = data[2], data[3]
    if type_code != IDX_UNSIGNED_BYTE:
        raise data_error(path, f"IDX element type 0x{type_code:02x} unsupported (need 0x08)")
    if dims != ndim:
        raise data_error(path, f"IDX array has {dims} dimensions, expected {ndim}")
    header = 4 + 4 * dims
    if len(data) < header:
        raise data_error(path, "IDX header is truncated")
    shape = struct.unpack(f">{dims}I", data[4:header])
    expected = header + int(np.prod(shape, dtype=np.int64))
    if len(data) != expected:
        raise data_error(
            path,
            f"IDX header says shape {list(shape)} ({expected} bytes) "
            f"but the file has {len(data)} bytes",
        )
    return np.frombuffer(data, dtype=np.uint8, offset=header).reshape(shape)


def read_idx(root: Path, split: str) -> RawImages:
    """Read `train-*` or `t10k-*` IDX images and labels under `root` (gzipped or not).

    Classes are "0".."9" by format (the MNIST family): a label outside 0..9 is a DataError,
    never an extra class (the label set is public, not read off the data).
    """
    images_path, labels_path = find_idx_files(root, split)
    images = parse_idx(read_maybe_gzip(images_path), images_path, ndim=3)
    labels = parse_idx(read_maybe_gzip(labels_path), labels_path, ndim=1)
    if len(images) != len(labels):
        raise data_error(
            images_path, f"has {len(images)} images but {labels_path} has {len(labels)} labels"
        )
    if len(images) == 0:
        raise data_error(images_path, "holds no images")
    outside = np.flatnonzero(labels >= len(IDX_CLASSES))
    if outside.size:
        raise data_error(
            labels_path,
            f"record {int(outside[0])} has label {int(labels[outside[0]])}, outside the IDX "
            "label set 0-9 (the label set is public and fixed by the format)",
        )
    return RawImages(images[:, None].copy(), labels.astype(np.int64), IDX_CLASSES)


# --- class folders (torchvision ImageFolder layout) ----------------------------------------


def list_image_folder(root: Path) -> tuple[tuple[str, ...], list[tuple[Path, int]]]:
    """Class names (sorted sub-folders) and (file, label) pairs, as torchvision ImageFolder.

    Hidden files and folders and files without an image suffix are skipped; files directly in
    `root` (a sample's labels.csv, manifest.json) are not records.
    """
    try:
        class_dirs = sorted(
            entry for entry in root.iterdir() if entry.is_dir() and not entry.name.startswith(".")
        )
    except OSError as error:
        raise data_error(root, f"cannot list folder ({describe(error)})") from error
    if not class_dirs:
        raise data_error(root, "has no class sub-folders (expected one sub-folder per class)")
    files: list[tuple[Path, int]] = []
    for label, class_dir in enumerate(class_dirs):
        found = []
        for folder, dirnames, filenames in os.walk(class_dir, followlinks=True):
            dirnames[:] = [name for name in dirnames if not name.startswith(".")]
            found.extend(
                Path(folder) / name
                for name in filenames
                if not name.startswith(".") and Path(name).suffix.lower() in IMAGE_SUFFIXES
            )
        files.extend((path, label) for path in sorted(found))
    if not files:
        suffixes = ", ".join(sorted(IMAGE_SUFFIXES))
        raise data_error(root, f"no image files ({suffixes}) in its class sub-folders")
    return tuple(entry.name for entry in class_dirs), files


def _probe(path: Path) -> tuple[str, tuple[int, int]]:
    try:
        with Image.open(path) as image:
            return image.mode, image.size
    # PIL's format plugins raise many exception types on corrupt files, not only OSError.
    except Exception as error:
        raise data_error(path, f"cannot open image ({describe(error)})") from error


def _decode(path: Path, mode: str, size: tuple[int, int]) -> np.ndarray:
    try:
        with Image.open(path) as image:
            converted = image.convert(mode)
            if converted.size != size:
                converted = converted.resize(size, Image.Resampling.BILINEAR)
            pixels = np.asarray(converted, dtype=np.uint8)
    except Exception as error:  # see _probe
        raise data_error(path, f"cannot decode image ({describe(error)})") from error
    return pixels[None] if pixels.ndim == 2 else pixels.transpose(2, 0, 1)


def read_image_folder(
    root: Path, image_size: int | None = None, channels: int | None = None
) -> RawImages:
    """Read one sub-folder per class of PIL-readable images into uint8 [N, C, H, W].

    One channel when every image is grayscale (PIL modes 1, L, LA), three (RGB, alpha dropped)
    when every image is colour. A folder that mixes both needs `channels` (1 or 3), to which
    every image is converted: one colour file must not silently decide the data's shape.
    All images must share one size unless `image_size` is given, which resizes every image to
    image_size x image_size (bilinear; non-square images are stretched).
    """
    classes, files = list_image_folder(root)
    probes = [_probe(path) for path, _ in files]
    wide = next((i for i, (mode, _) in enumerate(probes) if mode in WIDE_MODES), None)
    if wide is not None:
        raise data_error(
            files[wide][0], f"image mode {probes[wide][0]} (16/32-bit) unsupported; save as 8-bit"
        )
    gray_files = [mode in GRAY_MODES for mode, _ in probes]
    if channels is None:
        if any(gray_files) and not all(gray_files):
            gray_at, colour_at = gray_files.index(True), gray_files.index(False)
            raise UsageError(
                one_line(
                    f"{root}: images mix grayscale and colour ({files[gray_at][0]} is "
                    f"{probes[gray_at][0]}, {files[colour_at][0]} is {probes[colour_at][0]}); "
                    "pass --channels 1 or --channels 3 to convert them all"
                )
            )
        channels = 1 if all(gray_files) else 3
    gray = channels == 1
    if image_size is None:
        first_size = probes[0][1]
        odd = next((i for i, (_, size) in enumerate(probes) if size != first_size), None)
        if odd is not None:
            (w0, h0), (w1, h1) = first_size, probes[odd][1]
            raise data_error(
                root,
                f"images differ in size: {files[0][0]} is {w0}x{h0}, {files[odd][0]} is "
                f"{w1}x{h1}; pass --image-size N to resize all to NxN",
            )
        size = first_size
    else:
        size = (image_size, image_size)
    x = np.empty((len(files), channels, size[1], size[0]), dtype=np.uint8)
    for i, (path, _) in enumerate(files):
        x[i] = _decode(path, "L" if gray else "RGB", size)
    y = np.array([label for _, label in files], dtype=np.int64)
    return RawImages(x, y, classes)


# --- .npz arrays ----------------------------------------------------------------------------


def _load_npz_arrays(path: Path) -> dict[str, np.ndarray]:
    try:
        with path.open("rb") as handle:
            magic = handle.read(6)
    except OSError as error:
        raise data_error(path, f"cannot read ({describe(error)})") from error
    if not magic.startswith((b"PK\x03\x04", b"PK\x05\x06", b"\x93NUMPY")):
        # np.load would take anything else for a pickle and say so, which misleads.
        raise data_error(path, "is not an .npz file (no zip archive header)")
    try:
        archive = np.load(path, allow_pickle=False)
    except Exception as error:  # numpy/zipfile raise ValueError, OSError, BadZipFile, ...
        raise data_error(path, f"not a readable .npz archive ({describe(error)})") from error
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise data_error(path, "is a single .npy array, expected an .npz with arrays x and y")
    with archive:
        missing = [key for key in ("x", "y") if key not in archive.files]
        if missing:
            raise data_error(
                path, f"has no array {' or '.join(missing)} (found: {', '.join(archive.files)})"
            )
        keys = [key for key in ("x", "y", "classes") if key in archive.files]
        try:
            return {key: archive[key] for key in keys}
        except Exception as error:  # truncated member, bad CRC, pickled object array
            raise data_error(path, f"cannot read arrays ({describe(error)})") from error


def _npz_pixels(x: np.ndarray, path: Path) -> np.ndarray:
    if x.dtype != np.uint8:
        if x.dtype.kind not in "iu":
            raise data_error(
                path,
                f"x has dtype {x.dtype}; pixels must be uint8 0..255 "
                "(for floats in [0, 1]: np.round(x * 255).astype(np.uint8))",
            )
        if x.size and (x.min() < 0 or x.max() > 255):
            raise data_error(path, f"x has dtype {x.dtype} with values outside 0..255")
        x = x.astype(np.uint8)
    if x.ndim == 3:
        return x[:, None].copy()
    if x.ndim == 4 and x.shape[3] in (1, 3):  # channels-last wins when both axes could be C
        return np.ascontiguousarray(x.transpose(0, 3, 1, 2))
    if x.ndim == 4 and x.shape[1] in (1, 3):
        return np.ascontiguousarray(x)
    raise data_error(
        path, f"x has shape {list(x.shape)}; expected [N,H,W], [N,H,W,C] or [N,C,H,W], C 1 or 3"
    )


def class_name_problem(classes: tuple[str, ...]) -> str | None:
    """Why a list of class names is unusable (duplicates, unsafe folder names), or None."""
    if not classes:
        return "the class list is empty"
    if len(set(classes)) != len(classes):
        return "classes has duplicate names"
    bad = [name for name in classes if name in ("", ".", "..") or any(c in name for c in "/\\\0")]
    if bad:
        # class names become folder names when sampling; keep them safe as one path component
        return f"class name {bad[0]!r} is not usable as a folder name"
    return None


def _npz_classes(
    arrays: dict[str, np.ndarray], declared: tuple[str, ...] | None, path: Path
) -> tuple[str, ...]:
    if "classes" not in arrays:
        if declared is None:
            raise UsageError(
                f"{path}: has no `classes` array, and the label set is public, not read off y: "
                "pass --classes a,b,... (or store a `classes` string array in the file)"
            )
        return declared
    names = arrays["classes"]
    if names.ndim != 1 or names.dtype.kind not in "US":
        raise data_error(path, "classes must be a 1-D array of strings")
    classes = tuple(
        name.decode("utf-8", "replace") if isinstance(name, bytes) else str(name)
        for name in names.tolist()
    )
    problem = class_name_problem(classes)
    if problem:
        raise data_error(path, problem)
    if declared is not None and declared != classes:
        raise UsageError(
            one_line(
                f"{path}: --classes {','.join(declared)} differs from the file's classes "
                f"{','.join(classes)}"
            )
        )
    return classes


def read_npz(path: Path, classes: tuple[str, ...] | None = None) -> RawImages:
    """Read arrays `x` (uint8 [N,H,W], [N,H,W,C] or [N,C,H,W], C 1 or 3) and `y` (ints [N]).

    A 4-D array whose last axis is 1 or 3 is taken as channels-last even when its second axis
    is also 1 or 3. Class names come from a string array `classes` in the file or from the
    declared `classes` (both given: they must agree); with neither it is a UsageError, since
    the label set is public and never derived from y. A label outside the class list is a
    DataError.
    """
    arrays = _load_npz_arrays(path)
    x = _npz_pixels(arrays["x"], path)
    y = arrays["y"]
    if y.ndim != 1 or y.dtype.kind not in "iu":
        raise data_error(path, f"y must be a 1-D integer array (got {y.dtype} {list(y.shape)})")
    if len(y) != len(x):
        raise data_error(path, f"x has {len(x)} images but y has {len(y)} labels")
    if len(y) == 0:
        raise data_error(path, "holds no images")
    if int(y.min()) < 0:
        raise data_error(path, "y has negative labels")
    names = _npz_classes(arrays, classes, path)
    outside = np.flatnonzero(y >= len(names))
    if outside.size:
        raise data_error(
            path,
            f"record {int(outside[0])} has label {int(y[outside[0]])}, outside the "
            f"{len(names)} declared classes ({','.join(names)})",
        )
    classes = names
    return RawImages(x, y.astype(np.int64), classes)
