"""Synthetic images for evaluation: a sample folder (or any class-folder tree), or a run dir.

A synthetic folder's classes are matched to the real set's classes by NAME: a folder may lack
a class (a generator that never drew it), and its sorted sub-folders need not line up with the
real set's label order.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from dpsynth.data.images import ImageData
from dpsynth.data.limits import over_budget
from dpsynth.errors import DataError, UsageError


@dataclass
class SyntheticImages:
    """Synthetic uint8 images with labels indexed by the REAL set's class list.

    `source` is "folder" or "run"; `provenance` holds what is known about the data set the
    generator was trained on (dataset_id, fingerprint, method, run_id), possibly empty.
    """

    x: torch.Tensor
    y: torch.Tensor
    classes: tuple[str, ...]
    source: str
    path: Path
    provenance: dict


def is_run_dir(path: Path) -> bool:
    """A run directory is recognised by its `config.json`."""
    return (path / "config.json").is_file()


def load_synthetic(
    path: str | Path,
    real_classes: tuple[str, ...],
    real_shape: tuple[int, int, int],
    *,
    n: int | None = None,
    seed: int = 0,
    device: str = "cpu",
) -> SyntheticImages:
    """Read a sample folder or sample `n` images from a run dir, in the real set's class order.

    Images are brought to the real set's shape (channels and size), so that one classifier
    and one FID pipeline see both. With a folder and `n`, a seeded random subset of n images
    is used.
    """
    root = Path(path).expanduser()
    if not root.exists():
        raise UsageError(
            f"{{synthetic}} {root}: no such folder or run directory", parameter="synthetic"
        )
    if is_run_dir(root):
        _check_image_run(root, n, real_shape)
        x, y, classes, provenance = _sample_run(root, n, seed, device)
        source = "run"
    else:
        x, y, classes = _read_folder(root, real_shape[0])
        provenance = read_folder_provenance(root)
        source = "folder"
        if n is not None:
            if n > len(y):
                raise UsageError(f"{{n}} {n} but {root} holds only {len(y)} images", parameter="n")
            rng = torch.Generator().manual_seed(seed)
            keep = torch.randperm(len(y), generator=rng, device=rng.device)[:n]
            x, y = x[keep.sort().values], y[keep.sort().values]
    y = map_labels_by_name(y, classes, real_classes)
    x = match_shape(x, real_shape)
    return SyntheticImages(
        x=x, y=y, classes=tuple(real_classes), source=source, path=root, provenance=provenance
    )


def _check_image_run(root: Path, n: int | None, real_shape: tuple[int, int, int]) -> None:
    """UsageError for a table's run given against image data, or for `--n` images whose
    pixels (held whole, then as floats) would not fit the memory budget."""
    try:
        data = json.loads((root / "config.json").read_text()).get("data")
    except (OSError, ValueError, RecursionError, AttributeError):
        data = None  # the sampler reports an unreadable config with its own message
    if isinstance(data, dict) and data.get("modality") == "table":
        raise UsageError(
            f"{{synthetic}} {root} is a table's run: evaluate a sample of it (`dpsynth sample "
            f"{root} --out rows.csv`) against a table ({{real}} csv:FILE or a built-in table)",
            parameters=("synthetic", "real"),
        )
    if n is not None:
        shape = data.get("shape") if isinstance(data, dict) else None
        known = isinstance(shape, list) and all(type(v) is int and v > 0 for v in shape)
        values = math.prod(shape) if known and shape else 0
        problem = over_budget(n * max(values, math.prod(real_shape)) * 8)
        if problem:
            raise UsageError(f"{{n}} {n}: the synthetic images {problem}", parameter="n")


def map_labels_by_name(
    y: torch.Tensor, classes: tuple[str, ...] | list[str], real_classes: tuple[str, ...]
) -> torch.Tensor:
    """Re-index labels from `classes` to `real_classes` by class name.

    Raises DataError when a synthetic class name is not among the real set's classes.
    """
    index = {name: i for i, name in enumerate(real_classes)}
    unknown = [name for name in classes if name not in index]
    if unknown:
        raise DataError(
            f"synthetic class {unknown[0]!r} is not a class of the real data "
            f"({', '.join(real_classes)})"
        )
    lookup = torch.tensor([index[name] for name in classes], dtype=torch.int64)
    return lookup[y.long()]


def match_shape(x: torch.Tensor, shape: tuple[int, int, int]) -> torch.Tensor:
    """Bring uint8 images [N, C, H, W] to shape (C, H, W): gray<->RGB and bilinear resize."""
    channels, height, width = shape
    if x.shape[1] != channels:
        if x.shape[1] == 3 and channels == 1:
            # ITU-R 601 luma, as PIL's convert("L")
            weights = torch.tensor([0.299, 0.587, 0.114]).view(1, 3, 1, 1)
            x = (x.float() * weights).sum(dim=1, keepdim=True).round().clamp(0, 255)
            x = x.to(torch.uint8)
        elif x.shape[1] == 1 and channels == 3:
            x = x.repeat(1, 3, 1, 1)
        else:
            raise DataError(f"cannot compare {x.shape[1]}-channel images with {channels}-channel")
    if tuple(x.shape[2:]) != (height, width):
        resized = F.interpolate(x.float(), size=(height, width), mode="bilinear", antialias=True)
        x = resized.round().clamp(0, 255).to(torch.uint8)
    return x


def _read_folder(root: Path, channels: int) -> tuple[torch.Tensor, torch.Tensor, tuple[str, ...]]:
    from dpsynth.data.sources import load_data

    # Synthetic images are compared in the real data's channels: convert on reading, so a
    # folder mixing grayscale and colour files needs no --channels of its own.
    data: ImageData = load_data(f"folder:{root}", channels=channels)
    return data.x, data.y, tuple(data.classes)


def read_folder_provenance(root: Path) -> dict:
    """What a sample folder's `manifest.json` says about its origin (empty when unknown)."""
    manifest = root / "manifest.json"
    if not manifest.is_file():
        return {}
    try:
        obj = json.loads(manifest.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(obj, dict):
        return {}
    found = _provenance_from(obj)
    run = obj.get("run")
    if isinstance(run, str) and is_run_dir(Path(run)):
        # The run's config.json names the training data set; the manifest may not.
        found = {**read_run_provenance(Path(run)), **found}
    return found


def read_run_provenance(run_dir: Path) -> dict:
    """What a run directory's `config.json` says about the data it was trained on."""
    try:
        obj = json.loads((run_dir / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return _provenance_from(obj) if isinstance(obj, dict) else {}


def _provenance_from(obj: dict) -> dict:
    # A run config has the data info under "data"; a manifest has its release line under "ledger".
    found: dict = {}
    for holder in (obj, obj.get("data"), obj.get("ledger"), obj.get("source")):
        if not isinstance(holder, dict):
            continue
        for key in ("dataset_id", "fingerprint", "method", "run_id"):
            value = holder.get(key)
            if isinstance(value, str) and key not in found:
                found[key] = value
    return found


def _sample_run(
    run_dir: Path, n: int | None, seed: int, device: str
) -> tuple[torch.Tensor, torch.Tensor, tuple[str, ...], dict]:
    from dpsynth import sampling

    if n is None:
        raise UsageError(
            "{synthetic} RUN needs {n} N (how many images to sample)",
            parameters=("synthetic", "n"),
        )
    x, y, classes = sampling.generate(run_dir, n, seed, device)
    return x.cpu(), y.cpu().long(), tuple(classes), read_run_provenance(run_dir)


def train_log(run_dir: Path) -> list[dict]:
    """The `train-log.jsonl` lines of a run dir (those with a step and an ε), possibly none."""
    path = run_dir / "train-log.jsonl"
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and "step" in row and "epsilon" in row:
            rows.append(row)
    return rows
