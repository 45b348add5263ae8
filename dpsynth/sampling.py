"""`dpsynth sample`: draw synthetic records from a trained run and write them out.

Sampling reads no private data: it runs the saved generator, so it is post-processing of what
the training mechanism released and costs no privacy. It is still recorded in the ledger, as a
zero-cost release event with the SHA-256 of what was written, so a data owner can tie every
file that left the machine to a run and its spend.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from dpsynth.data.images import DataInfo
from dpsynth.errors import UsageError
from dpsynth.methods.base import Generator
from dpsynth.methods.registry import get_method
from dpsynth.privacy.ledger import Ledger
from dpsynth.runs import RunDir, write_json_atomic
from dpsynth.training import resolve_device

SampleProgress = Callable[[int, int], None]


def load_generator(run_dir: Path | str, device: str = "auto") -> tuple[Generator, dict, DataInfo]:
    """The generator of a run (from its last checkpoint), its config and its data info."""
    run = RunDir(run_dir)
    run_config = run.read_config()
    torch_device = resolve_device(device)
    tensors, _ = run.load_checkpoint(torch_device)
    trainer_tensors = {
        k.removeprefix("trainer/"): v for k, v in tensors.items() if k.startswith("trainer/")
    }
    info = DataInfo.from_json(run_config["data"])
    backend = get_method(run_config["method"])
    generator = backend.generator_from_state(
        info, run_config["config"], trainer_tensors, torch_device
    )
    return generator, run_config, info


def parse_labels(labels: str, n: int, num_classes: int) -> torch.Tensor:
    """Labels to generate: `balanced` (data-independent, free) or per-class COUNTS `a,b,...`.

    Balanced gives each class n // K records and the first n % K classes one more.
    """
    if labels == "balanced":
        counts = [n // num_classes + (1 if c < n % num_classes else 0) for c in range(num_classes)]
    else:
        try:
            counts = [int(part) for part in labels.split(",")]
        except ValueError:
            raise UsageError(
                f"--labels must be 'balanced' or per-class counts, got {labels!r}"
            ) from None
        if len(counts) != num_classes or min(counts) < 0:
            raise UsageError(
                f"--labels needs {num_classes} non-negative counts (one per class), got {labels!r}"
            )
        if sum(counts) != n:
            raise UsageError(f"--labels counts sum to {sum(counts)}, but --n is {n}")
    return torch.repeat_interleave(torch.arange(num_classes), torch.tensor(counts))


def generate(
    run_dir: Path | str,
    n: int,
    seed: int = 0,
    device: str = "auto",
    labels: str = "balanced",
    batch_size: int = 500,
) -> tuple[torch.Tensor, torch.Tensor, tuple[str, ...]]:
    """N synthetic images (uint8 [N,C,H,W]) with their labels and class names, in memory."""
    generator, _, info = load_generator(run_dir, device)
    wanted = parse_labels(labels, n, len(info.classes))
    images = torch.cat([batch.cpu() for batch, _ in _batches(generator, wanted, batch_size, seed)])
    return images, wanted, info.classes


def _batches(
    generator: Generator, labels: torch.Tensor, batch_size: int, seed: int
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    rng = torch.Generator(device=generator.device).manual_seed(seed)
    done = 0
    for start in range(0, labels.numel(), batch_size):
        chunk = labels[start : start + batch_size].to(generator.device)
        for images in generator.sample(chunk, batch_size, rng):
            size = int(images.shape[0])
            yield images, labels[done : done + size]
            done += size


def _png_bytes(image: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(image[0] if image.shape[0] == 1 else image.transpose(1, 2, 0)).save(
        buffer, format="PNG"
    )
    return buffer.getvalue()


def _safe_class_dir(name: str) -> str:
    if not name or name in (".", "..") or "/" in name or "\\" in name or "\x00" in name:
        raise UsageError(f"class name {name!r} cannot be used as a folder name")
    return name


def sample_run(
    run_dir: Path | str,
    n: int,
    out_dir: Path | str,
    fmt: str = "png",
    labels: str = "balanced",
    batch_size: int = 500,
    seed: int = 0,
    device: str = "auto",
    force: bool = False,
    ledger_path: Path | str | None = None,
    progress: SampleProgress | None = None,
) -> dict[str, Any]:
    """Write N synthetic images to `out_dir` and record the release in the ledger.

    PNG: `OUT/<class>/<index>.png`, `labels.csv`, `manifest.json`. NPZ: `OUT/samples.npz`
    (`x` uint8 [N,C,H,W], `y` int64, `classes`) and `manifest.json`. Everything is written into
    a temporary folder beside OUT and renamed into place at the end, in batches so that memory
    stays flat in N.
    """
    if n < 1:
        raise UsageError(f"--n must be at least 1, got {n}")
    if fmt not in ("png", "npz"):
        raise UsageError(f"--format must be png or npz, got {fmt!r}")
    if batch_size < 1:
        raise UsageError(f"--batch-size must be at least 1, got {batch_size}")
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not force:
        raise UsageError(f"{out} exists and is not empty; use --force to replace it")
    generator, run_config, info = load_generator(run_dir, device)
    wanted = parse_labels(labels, n, len(info.classes))
    class_dirs = [_safe_class_dir(name) for name in info.classes]
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    digest = hashlib.sha256()
    try:
        if fmt == "png":
            _write_pngs(generator, wanted, batch_size, seed, staging, class_dirs, digest, progress)
        else:
            _write_npz(generator, wanted, batch_size, seed, staging, info, digest, progress)
        output_sha = digest.hexdigest()
        release = _record_release(run_config, info, ledger_path, output_sha, n, fmt, out)
        manifest = {
            "run_id": run_config["run_id"],
            "run": str(Path(run_dir).resolve()),
            "method": run_config["method"],
            "private": run_config["private"],
            "privacy": _privacy_line(run_config),
            "n": n,
            "format": fmt,
            "classes": list(info.classes),
            "label_counts": torch.bincount(wanted, minlength=len(info.classes)).tolist(),
            "seed": seed,
            "shape": list(info.shape),
            "output_sha256": output_sha,
            "ledger": release,
        }
        details = generator.release_details(wanted)
        if details:
            manifest["generator"] = details
        write_json_atomic(staging / "manifest.json", manifest)
        if out.exists():
            shutil.rmtree(out) if out.is_dir() else out.unlink()
        os.replace(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return {"out": str(out), **{k: v for k, v in manifest.items() if k != "classes"}}


def _write_pngs(
    generator: Generator,
    wanted: torch.Tensor,
    batch_size: int,
    seed: int,
    staging: Path,
    class_dirs: list[str],
    digest: Any,
    progress: SampleProgress | None,
) -> None:
    for name in class_dirs:
        (staging / name).mkdir()
    rows: list[tuple[str, int, str]] = []
    index = 0
    for images, labels in _batches(generator, wanted, batch_size, seed):
        for image, label in zip(images.cpu().numpy(), labels.tolist(), strict=True):
            relative = f"{class_dirs[label]}/{index:06d}.png"
            data = _png_bytes(image)
            (staging / relative).write_bytes(data)
            digest.update(relative.encode() + b"\0" + hashlib.sha256(data).digest())
            rows.append((relative, label, class_dirs[label]))
            index += 1
        if progress is not None:
            progress(index, int(wanted.numel()))
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["file", "label", "class"])
    writer.writerows(rows)
    data = buffer.getvalue().encode()
    (staging / "labels.csv").write_bytes(data)
    digest.update(b"labels.csv\0" + hashlib.sha256(data).digest())


def _write_npz(
    generator: Generator,
    wanted: torch.Tensor,
    batch_size: int,
    seed: int,
    staging: Path,
    info: DataInfo,
    digest: Any,
    progress: SampleProgress | None,
) -> None:
    # One preallocated uint8 array: N x C x H x W bytes, the size of the output itself.
    x = np.lib.format.open_memmap(
        staging / "x.npy", mode="w+", dtype=np.uint8, shape=(int(wanted.numel()), *info.shape)
    )
    done = 0
    for images, _ in _batches(generator, wanted, batch_size, seed):
        x[done : done + images.shape[0]] = images.cpu().numpy()
        done += int(images.shape[0])
        if progress is not None:
            progress(done, int(wanted.numel()))
    x.flush()
    path = staging / "samples.npz"
    np.savez(path, x=x, y=wanted.numpy().astype(np.int64), classes=np.array(info.classes))
    del x
    (staging / "x.npy").unlink()
    digest.update(b"samples.npz\0" + hashlib.sha256(path.read_bytes()).digest())


def _privacy_line(run_config: dict[str, Any]) -> str:
    privacy = run_config["privacy"]
    if not run_config["private"]:
        return "NOT PRIVATE (trained with --epsilon inf)"
    bound = float(privacy["epsilon_bound"])
    return f"(ε ≤ {bound:.4g}, δ = {privacy['delta']:g})-DP, {privacy['accountant']}"


def _record_release(
    run_config: dict[str, Any],
    info: DataInfo,
    ledger_path: Path | str | None,
    output_sha: str,
    n: int,
    fmt: str,
    out: Path,
) -> dict[str, Any] | None:
    path = ledger_path or run_config["ledger"]["path"]
    entry = Ledger(path).record_release(
        dataset_id=info.dataset_id,
        fingerprint=info.fingerprint,
        command="sample",
        method=run_config["method"],
        run_id=run_config["run_id"],
        output_sha256=output_sha,
        details={"n": n, "format": fmt, "out": str(out.resolve())},
    )
    return {"path": str(Path(path).resolve()), "seq": entry["seq"]}


def manifest_of(out_dir: Path | str) -> dict[str, Any]:
    """The manifest a `sample` output folder carries."""
    return json.loads((Path(out_dir) / "manifest.json").read_text())
