"""Readers for the user's own image files: IDX (MNIST family) and `.npz` arrays (class folders:
`dpsynth.data.image_folder`).

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

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from dpsynth.data.limits import MAX_IMAGE_PIXELS, fmt_bytes, memory_budget, over_budget
from dpsynth.errors import DataError, UsageError

IDX_UNSIGNED_BYTE = 0x08
IDX_FILES: dict[str, tuple[str, str]] = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
IDX_CLASSES: tuple[str, ...] = tuple(str(d) for d in range(10))
# Images resized at once: at most this many float32 bytes per chunk (and at most 2048 images).
RESIZE_CHUNK = 2048
RESIZE_CHUNK_BYTES = 256 << 20


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
    per_image = 4 * int(np.prod(x.shape[1:])) + 4 * x.shape[1] * image_size * image_size
    step = max(1, min(RESIZE_CHUNK, RESIZE_CHUNK_BYTES // max(per_image, 1)))
    for start in range(0, len(x), step):
        chunk = torch.from_numpy(x[start : start + step].astype(np.float32))
        resized = F.interpolate(
            chunk, size=(image_size, image_size), mode="bilinear", antialias=True
        )
        out[start : start + step] = resized.round().clamp(0, 255).to(torch.uint8).numpy()
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
        cap = memory_budget() // 2
        opener = gzip.open if compressed else open
        with opener(path, "rb") as handle:
            data = handle.read(cap + 1)  # a gzip bomb stops at the cap
        if len(data) > cap:
            raise data_error(
                path, f"holds more than {fmt_bytes(cap)} (half the memory budget) of pixel data"
            )
        return data
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
        raise data_error(images_path, "holds no records")
    outside = np.flatnonzero(labels >= len(IDX_CLASSES))
    if outside.size:
        raise data_error(
            labels_path,
            f"record {int(outside[0])} has label {int(labels[outside[0]])}, outside the IDX "
            "label set 0-9 (the label set is public and fixed by the format)",
        )
    return RawImages(images[:, None].copy(), labels.astype(np.int64), IDX_CLASSES)


def too_large(path: Path, what: str) -> DataError:
    """The DataError for an image over the pixel cap (`what` says how large it is)."""
    return data_error(
        path,
        f"{what}, more than the cap of {MAX_IMAGE_PIXELS:,} pixels per image (4096x4096); "
        "resize it before use",
    )


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
        _check_npz_sizes(archive, keys, path)
        try:
            return {key: archive[key] for key in keys}
        except Exception as error:  # truncated member, bad CRC, pickled object array
            raise data_error(path, f"cannot read arrays ({describe(error)})") from error


def _check_npz_sizes(archive: np.lib.npyio.NpzFile, keys: list[str], path: Path) -> None:
    """Refuse arrays whose headers declare more bytes than the memory budget holds, before
    they are decompressed (a compressed archive of zeros can declare terabytes)."""
    needed = 0
    for key in keys:
        try:
            with archive.zip.open(f"{key}.npy") as member:
                version = np.lib.format.read_magic(member)
                read_header = (
                    np.lib.format.read_array_header_1_0
                    if version == (1, 0)
                    else np.lib.format.read_array_header_2_0
                )
                shape, _, dtype = read_header(member)
        except Exception:  # a damaged member: reported with its reason when it is read
            continue
        needed += int(np.prod(shape, dtype=object)) * max(dtype.itemsize, 1)
    problem = over_budget(2 * needed)  # the arrays, and one converted copy of the pixels
    if problem:
        raise data_error(path, f"its arrays {problem}")


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
        return _check_pixels(x[:, None].copy(), path)
    if x.ndim == 4 and x.shape[3] in (1, 3):  # channels-last wins when both axes could be C
        return _check_pixels(np.ascontiguousarray(x.transpose(0, 3, 1, 2)), path)
    if x.ndim == 4 and x.shape[1] in (1, 3):
        return _check_pixels(np.ascontiguousarray(x), path)
    raise data_error(
        path, f"x has shape {list(x.shape)}; expected [N,H,W], [N,H,W,C] or [N,C,H,W], C 1 or 3"
    )


def _check_pixels(x: np.ndarray, path: Path) -> np.ndarray:
    """x [N, C, H, W] with records of at least one pixel and at most the pixel cap."""
    height, width = x.shape[2], x.shape[3]
    if height * width == 0:
        raise data_error(path, f"x has shape {list(x.shape)}: its records hold no pixels")
    if height * width > MAX_IMAGE_PIXELS:
        raise too_large(path, f"its images are {width}x{height}")
    return x


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
        raise data_error(path, "holds no records (x and y are empty)")
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
