"""Sampling an image run: in memory (`generate`), or written as PNG files or an NPZ archive
beside its manifest (`sample_run`, which hands a table's run to `sample_table`)."""

from __future__ import annotations

import csv
import hashlib
import io
import math
import shutil
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from dpsynth.data.images import DataInfo
from dpsynth.data.limits import check_batch_size
from dpsynth.errors import UsageError
from dpsynth.methods.base import Generator
from dpsynth.rundir import RunDir, write_json_atomic
from dpsynth.sampling.labels import label_chunks, label_counts, labelled_batches
from dpsynth.sampling.options import SampleOptions
from dpsynth.sampling.outputs import (
    SampleProgress,
    check_release_target,
    is_sample_output,
    record_release,
    release_header,
)
from dpsynth.sampling.table import write_table
from dpsynth.sampling.trained_run import load_generator, run_modality, run_privacy, set_truncation
from dpsynth.staging import remove_stale_staging, replace_dir, staging_dir

# Far beyond any real release; above it a typo (an extra zero or two) is the likely cause.
MAX_SAMPLES = 10**9


def generate(
    run_dir: Path | str,
    n: int,
    seed: int = 0,
    device: str = "auto",
    labels: str = "balanced",
    batch_size: int = 500,
) -> tuple[torch.Tensor, torch.Tensor, tuple[str, ...]]:
    """N synthetic images (uint8 [N,C,H,W]) with their labels and class names, in memory."""
    if not 1 <= n <= MAX_SAMPLES:
        raise UsageError(f"--n must be in [1, {MAX_SAMPLES:.0e}], got {n}")
    generator, _, info = load_generator(run_dir, device)
    counts = label_counts(labels, n, len(info.classes))
    batches = list(labelled_batches(generator, counts, batch_size, seed))
    images = torch.cat([batch.cpu() for batch, _ in batches])
    return images, torch.cat([chunk for _, chunk in batches]), info.classes


def sample_images_array(
    run_dir: Path | str, n: int, opts: SampleOptions
) -> tuple[np.ndarray, np.ndarray, tuple[str, ...], dict[str, Any]]:
    """N synthetic images of an image run in memory: uint8 [N,C,H,W], their int64 labels, the
    class names, and the release's manifest (written nowhere). The records are those an NPZ
    sample with the same options holds; the ledger records the release with the SHA-256 of
    the images' and labels' bytes (uint8, then little-endian int64)."""
    if not 1 <= n <= MAX_SAMPLES:
        raise UsageError(f"{{n}} must be in [1, {MAX_SAMPLES:.0e}], got {n}", parameter="n")
    batch_size = opts.batch(500)
    check_batch_size("--batch-size", batch_size, 1)
    privacy = run_privacy(run_dir, opts.ledger_path, partial=opts.partial)
    generator, run_config, info = load_generator(run_dir, opts.device)
    check_batch_size("--batch-size", batch_size, math.prod(info.shape))
    set_truncation(generator, opts.truncation, run_config["method"])
    counts = label_counts(opts.labels, n, len(info.classes))
    parts, done = [], 0
    for images, _ in labelled_batches(generator, counts, batch_size, opts.seed):
        parts.append(np.ascontiguousarray(images.cpu().numpy(), dtype=np.uint8))
        done += len(parts[-1])
        if opts.progress is not None:
            opts.progress(done, n)
    x = np.concatenate(parts)
    y = torch.cat(list(label_chunks(counts, 1 << 20))).numpy().astype(np.int64)
    digest = hashlib.sha256(memoryview(x).cast("B"))  # no copy of the images
    digest.update(y.astype("<i8").tobytes())
    output_sha = digest.hexdigest()
    release = record_release(run_config, info, privacy["ledger"], output_sha, n, "arrays", None)
    manifest = {
        **release_header(run_dir, run_config, privacy),
        "training": privacy["training"],
        "n": n,
        "format": "arrays",
        "classes": list(info.classes),
        "label_counts": counts,
        "seed": opts.seed,
        "shape": list(info.shape),
        "output_sha256": output_sha,
        "ledger": release,
    }
    return x, y, info.classes, manifest


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


def sample_run(run_dir: Path | str, n: int, out_dir: Path | str, **options: Any) -> dict[str, Any]:
    """Write N synthetic images to `out_dir` and record the release in the ledger.

    PNG: `OUT/<class>/<index>.png`, `labels.csv`, `manifest.json`. NPZ: `OUT/samples.npz`
    (`x` uint8 [N,C,H,W], `y` int64, `classes`) and `manifest.json`. Everything is written into
    a staging folder beside OUT and renamed into place at the end, in batches so that memory
    stays flat in N. `force` replaces only an earlier output of `sample` (see
    `dpsynth.staging.check_target`); staging folders of killed runs are removed first.
    A table's run writes one CSV file instead (`fmt` csv, the default there), or Parquet for
    an `out` ending in `.parquet`: see `sample_table`, which also writes a partitioned Parquet
    folder (`partitions`, `workers`, `on_partition`; images have none and refuse them).
    `truncation` overrides the run's latent scale (see `set_truncation`). `batch_size`
    (records generated at once) defaults to 500 (10,000 for a partitioned release).
    A run whose training did not finish is refused (exit 2) unless `partial`, and then the
    manifest says it is a partial release (`training`, and the privacy statement).
    `options` are the fields of `SampleOptions`, by name.
    """
    opts = SampleOptions(**options)
    if n < 1:
        raise UsageError(f"{{n}} must be at least 1, got {n}", parameter="n")
    if n > MAX_SAMPLES:
        raise UsageError(f"{{n}} must be at most {MAX_SAMPLES:.0e}, got {n}", parameter="n")
    if run_modality(run_dir) == "table":
        if opts.fmt not in (None, "csv", "parquet"):
            raise UsageError(
                f"{{fmt}} {opts.fmt}: a table's run writes csv or parquet", parameter="fmt"
            )
        return write_table(run_dir, n, out_dir, opts)
    if opts.partitions is not None:
        raise UsageError(
            "{partitions}: only a table's run writes a partitioned release",
            parameter="partitions",
        )
    fmt = opts.fmt or "png"
    if fmt not in ("png", "npz"):
        raise UsageError(f"{{fmt}} must be png or npz, got {fmt!r}", parameter="fmt")
    batch_size, seed, progress = opts.batch(500), opts.seed, opts.progress
    check_batch_size("--batch-size", batch_size, 1)
    out = Path(out_dir)
    run = RunDir(run_dir)
    # The statement comes from the ledger, checked before anything is generated or written.
    privacy = run_privacy(run_dir, opts.ledger_path, partial=opts.partial)
    check_release_target(out, run, privacy["ledger"], opts.force, is_sample_output)
    generator, run_config, info = load_generator(run_dir, opts.device)
    check_batch_size("--batch-size", batch_size, math.prod(info.shape))
    set_truncation(generator, opts.truncation, run_config["method"])
    counts = label_counts(opts.labels, n, len(info.classes))
    class_dirs = [_safe_class_dir(name) for name in info.classes]
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_staging(out.parent)
    _check_free_space(out.parent, n * math.prod(info.shape))
    staging = staging_dir(out)
    digest = hashlib.sha256()
    try:
        if fmt == "png":
            _write_pngs(generator, counts, batch_size, seed, staging, class_dirs, digest, progress)
        else:
            _write_npz(generator, counts, batch_size, seed, staging, info, digest, progress)
        output_sha = digest.hexdigest()
        release = record_release(run_config, info, privacy["ledger"], output_sha, n, fmt, out)
        manifest = {
            **release_header(run_dir, run_config, privacy),
            "training": privacy["training"],
            "n": n,
            "format": fmt,
            "classes": list(info.classes),
            "label_counts": counts,
            "seed": seed,
            "shape": list(info.shape),
            "output_sha256": output_sha,
            "ledger": release,
        }
        if generator.truncation is not None:
            manifest["truncation"] = generator.truncation
        details = generator.release_details(counts)
        if details:
            manifest["generator"] = details
        write_json_atomic(staging / "manifest.json", manifest)
        replaced = out.exists()
        replace_dir(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    found = {k: v for k, v in manifest.items() if k != "classes"}
    return {"out": str(out), "replaced": replaced, **found}


def _check_free_space(folder: Path, needed: int) -> None:
    """Refuse early when the output (at least its raw pixel bytes) cannot fit on the disk."""
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return
    if needed > free:
        raise UsageError(
            f"--n needs at least {needed / 1e9:.3g} GB for the images, but only "
            f"{free / 1e9:.3g} GB are free in {folder}"
        )


def _write_pngs(
    generator: Generator,
    counts: Sequence[int],
    batch_size: int,
    seed: int,
    staging: Path,
    class_dirs: list[str],
    digest: Any,
    progress: SampleProgress | None,
) -> None:
    for name in class_dirs:
        (staging / name).mkdir()
    total = sum(counts)
    index = 0
    csv_digest = hashlib.sha256()
    # labels.csv is written as the images are, so nothing of size N is kept in memory.
    with (staging / "labels.csv").open("w", newline="") as handle:
        header = "file,label,class\n"
        handle.write(header)
        csv_digest.update(header.encode())
        for images, labels in labelled_batches(generator, counts, batch_size, seed):
            rows = []
            for image, label in zip(images.cpu().numpy(), labels.tolist(), strict=True):
                relative = f"{class_dirs[label]}/{index:06d}.png"
                data = _png_bytes(image)
                (staging / relative).write_bytes(data)
                digest.update(relative.encode() + b"\0" + hashlib.sha256(data).digest())
                rows.append((relative, label, class_dirs[label]))
                index += 1
            text = io.StringIO()
            csv.writer(text, lineterminator="\n").writerows(rows)
            handle.write(text.getvalue())
            csv_digest.update(text.getvalue().encode())
            if progress is not None:
                progress(index, total)
    digest.update(b"labels.csv\0" + csv_digest.digest())


def _write_npz(
    generator: Generator,
    counts: Sequence[int],
    batch_size: int,
    seed: int,
    staging: Path,
    info: DataInfo,
    digest: Any,
    progress: SampleProgress | None,
) -> None:
    # The archive is streamed member by member (as np.savez lays it out: stored, not
    # compressed), so neither the images nor the N labels are ever held in memory at once.
    total = sum(counts)
    path = staging / "samples.npz"
    with zipfile.ZipFile(path, mode="w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
        with zf.open("x.npy", mode="w", force_zip64=True) as member:
            _npy_header(member, np.uint8, (total, *info.shape))
            done = 0
            for images, _ in labelled_batches(generator, counts, batch_size, seed):
                member.write(np.ascontiguousarray(images.cpu().numpy(), dtype=np.uint8).data)
                done += int(images.shape[0])
                if progress is not None:
                    progress(done, total)
        with zf.open("y.npy", mode="w", force_zip64=True) as member:
            _npy_header(member, np.int64, (total,))
            for chunk in label_chunks(counts, 1 << 20):
                member.write(chunk.numpy().astype("<i8").data)
        with zf.open("classes.npy", mode="w") as member:
            np.lib.format.write_array(member, np.array(info.classes), allow_pickle=False)
    digest.update(b"samples.npz\0" + _file_sha256(path))


def _npy_header(handle: Any, dtype: Any, shape: tuple[int, ...]) -> None:
    header = {
        "descr": np.lib.format.dtype_to_descr(np.dtype(dtype).newbyteorder("<")),
        "fortran_order": False,
        "shape": shape,
    }
    np.lib.format.write_array_header_1_0(handle, header)


def _file_sha256(path: Path) -> bytes:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.digest()
