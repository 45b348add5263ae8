"""The class-folder reader (torchvision's ImageFolder layout): one sub-folder per class of
PIL-readable images, each file one record whatever the symbolic links say, every image's size
read from its header and checked against the pixel cap before anything is decoded.
"""

from __future__ import annotations

import os
import re
import warnings
from pathlib import Path

import numpy as np
from PIL import Image

from dpsynth.data.limits import MAX_IMAGE_PIXELS, over_budget
from dpsynth.data.readers import RawImages, data_error, describe, one_line, too_large
from dpsynth.errors import UsageError

IMAGE_SUFFIXES = frozenset(
    {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".pgm", ".ppm"}
)
GRAY_MODES = frozenset({"1", "L", "LA"})
WIDE_MODES = frozenset({"I", "F", "I;16", "I;16B", "I;16L", "I;16N"})


def list_image_folder(root: Path) -> tuple[tuple[str, ...], list[tuple[Path, int]]]:
    """Class names (sorted sub-folders) and (file, label) pairs, as torchvision ImageFolder.

    Hidden files and folders and files without an image suffix are skipped; files directly in
    `root` (a sample's labels.csv, manifest.json) are not records. Symbolic links are followed
    but every file counts once, whatever the links say: a folder reached twice (a link loop, or
    two links to one folder) is walked once, a file reached twice in one class is one record,
    and a file reached from two classes is an error (a record has one label). Otherwise one
    person's image could enter the data set many times, and the unit of privacy would break.
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
    owner: dict[str, tuple[Path, int]] = {}  # real path → the first (path, label) reaching it
    walked: set[str] = set()
    for label, class_dir in enumerate(class_dirs):
        found = []
        walked.clear()  # per class: another class reaching the same files must be seen
        for folder, dirnames, filenames in os.walk(class_dir, followlinks=True):
            real_folder = os.path.realpath(folder)
            if real_folder in walked:
                dirnames[:] = []  # a loop, or a folder already walked through another link
                continue
            walked.add(real_folder)
            dirnames[:] = [name for name in dirnames if not name.startswith(".")]
            for name in filenames:
                if name.startswith(".") or Path(name).suffix.lower() not in IMAGE_SUFFIXES:
                    continue
                path = Path(folder) / name
                real = os.path.realpath(path)
                if real in owner:
                    first, first_label = owner[real]
                    if first_label != label:
                        raise data_error(
                            path,
                            f"is the same file as {first} (through a symbolic link) but in "
                            f"class {class_dir.name!r}, not {class_dirs[first_label].name!r}; "
                            "a record has one label: remove the link",
                        )
                    continue
                owner[real] = (path, label)
                found.append(path)
        files.extend((path, label) for path in sorted(found))
    if not files:
        suffixes = ", ".join(sorted(IMAGE_SUFFIXES))
        raise data_error(root, f"no image files ({suffixes}) in its class sub-folders")
    return tuple(entry.name for entry in class_dirs), files


def _probe(path: Path) -> tuple[str, tuple[int, int]]:
    """The image's mode and size from its header (nothing is decoded); DataError above the
    pixel cap. PIL's decompression-bomb warning becomes that error instead of a printed line."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path) as image:
                mode, size = image.mode, image.size
    except (Image.DecompressionBombWarning, Image.DecompressionBombError) as bomb:
        # PIL says "Image size (N pixels) exceeds limit of ..."
        declared = re.search(r"\((\d+) pixels\)", str(bomb))
        pixels = f"{int(declared[1]):,} pixels" if declared else "too many pixels"
        raise too_large(path, f"its header declares {pixels}") from None
    # PIL's format plugins raise many exception types on corrupt files, not only OSError.
    except Exception as error:
        raise data_error(path, f"cannot open image ({describe(error)})") from error
    if size[0] * size[1] > MAX_IMAGE_PIXELS:
        raise too_large(path, f"it is {size[0]}x{size[1]}")
    return mode, size


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
    # Decoded pixels are held whole: refuse before decoding when they cannot fit.
    problem = over_budget(len(files) * channels * size[0] * size[1])
    if problem:
        raise data_error(root, f"{len(files)} images of {size[0]}x{size[1]} {problem}")
    x = np.empty((len(files), channels, size[1], size[0]), dtype=np.uint8)
    for i, (path, _) in enumerate(files):
        x[i] = _decode(path, "L" if gray else "RGB", size)
    y = np.array([label for _, label in files], dtype=np.int64)
    return RawImages(x, y, classes)
