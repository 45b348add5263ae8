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
import math
import re
import shutil
import zipfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from dpsynth.data.images import DataInfo
from dpsynth.data.limits import check_batch_size
from dpsynth.errors import DataError, UsageError
from dpsynth.methods.base import Generator, check_truncation
from dpsynth.methods.registry import get_method
from dpsynth.outdir import (
    check_target,
    remove_stale_staging,
    replace_dir,
    staging_dir,
    staging_file,
)
from dpsynth.privacy.anchors import SpendAnchor, privacy_statement, verified_spend
from dpsynth.privacy.ledger import Ledger
from dpsynth.runs import RunDir, write_json_atomic
from dpsynth.training import resolve_device

SampleProgress = Callable[[int, int], None]


def load_generator(run_dir: Path | str, device: str = "auto") -> tuple[Generator, dict, DataInfo]:
    """The generator of a run (from its last checkpoint), its config and its data info.

    A config.json that does not describe the checkpoint (an unknown method, missing keys,
    changed classes or layer sizes) is a DataError naming the run, never a traceback.
    """
    run = RunDir(run_dir)
    run_config = run.read_config()
    torch_device = resolve_device(device)
    try:
        info = DataInfo.from_json(run_config["data"])
        backend = get_method(run_config["method"])
        config = run_config["config"]
    except (UsageError, KeyError, TypeError, ValueError, AttributeError) as exc:
        raise DataError(
            f"{run.path}: config.json is not a valid run config ({_one_line(exc)})"
        ) from None
    tensors, _ = run.load_checkpoint(torch_device)
    trainer_tensors = {
        k.removeprefix("trainer/"): v for k, v in tensors.items() if k.startswith("trainer/")
    }
    try:
        generator = backend.generator_from_state(info, config, trainer_tensors, torch_device)
    except (RuntimeError, KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
        raise DataError(
            f"{run.path}: the checkpoint does not match config.json (was it edited?): "
            f"{_one_line(exc)}"
        ) from None
    return generator, run_config, info


def set_truncation(generator: Generator, truncation: float | None, method: str) -> None:
    """Override the sampler's latent scale (`sample --truncation`; None keeps the run's).

    Scaling z ~ N(0, I) by t < 1 trades diversity for samples nearer the generator's typical
    output (the "truncation trick"). It acts on the released generator only, so it costs no
    privacy. Samplers without a latent (pge's chains, psg's fixed set) refuse it.
    """
    if truncation is None:
        return
    value = check_truncation(truncation, "--truncation")
    if generator.truncation is None:
        raise UsageError(f"--truncation: {method}'s sampler has no latent to scale")
    generator.truncation = value


def _one_line(exc: BaseException, limit: int = 160) -> str:
    lines = str(exc).strip().splitlines()
    text = lines[0] if lines else ""
    text = text if len(text) <= limit else text[: limit - 1] + "…"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def run_privacy(run_dir: Path | str, ledger_path: Path | str | None = None) -> dict[str, Any]:
    """The privacy statement of a run's outputs, taken from the ledger spend it is anchored to.

    `ledger_path` defaults to the ledger the run recorded. The anchor (seq and hash in
    config.json) is checked as for `--resume` (same hash, run id, data and events); a run that
    does not match its ledger is refused (AnchorError, exit 2), so an edited config.json or a
    ledger from which the spend was cut can never produce a statement; a config.json edited
    after the spend was reserved (method, settings, data, plan) is a RunConfigEditedError
    (exit 4).
    """
    run = RunDir(run_dir)
    run_config = run.read_config()
    name = str(run.path)
    anchor = SpendAnchor.from_run_config(run_config, name)
    try:
        data = run_config["data"]
        run_id, dataset_id = str(run_config["run_id"]), str(data["dataset_id"])
        fingerprint, events = str(data["fingerprint"]), list(run_config["privacy"]["events"])
        path = Path(ledger_path or run_config["ledger"]["path"])
    except (KeyError, TypeError, ValueError) as exc:
        raise DataError(
            f"{name}: config.json is not a valid run config ({_one_line(exc)})"
        ) from None
    spend = verified_spend(
        Ledger(path),
        anchor,
        run_id=run_id,
        dataset_id=dataset_id,
        fingerprint=fingerprint,
        events=events,
        run_name=name,
        run_config=run_config,
    )
    statement = privacy_statement(spend)
    release = run_config.get("schema_release")
    if isinstance(release, dict) and statement["private"]:
        statement = _with_schema_release(statement, Ledger(path), release, run_id, name)
    return {**statement, "ledger": str(path.resolve())}


def _with_schema_release(
    statement: dict[str, Any], ledger: Ledger, release: dict[str, Any], run_id: str, name: str
) -> dict[str, Any]:
    """The statement of a table run whose schema was released with DP before training: the
    outputs carry the released schema too, so their ε composes both spends (read from the
    ledger, which must hold the release under this run's id)."""
    from dpsynth.privacy.accounting import compose_epsilon

    try:
        spend = ledger.spend(int(release["ledger_seq"]))
    except (KeyError, TypeError, ValueError, UsageError):
        spend = {}
    if spend.get("run_id") != run_id or spend.get("command") != "schema-release":
        raise DataError(f"{name}: the ledger holds no schema release of this run (was it cut?)")
    training = ledger.spend(int(statement["ledger_seq"]))
    delta = float(statement["delta"])
    bound = compose_epsilon([*spend["events"], *training["events"]], delta)
    return {
        **statement,
        "epsilon": bound.epsilon,
        "schema_release_seq": int(spend["seq"]),
        "statement": (
            f"(ε ≤ {bound.epsilon:.4g}, δ = {delta:g})-DP, {bound.accountant} (training and the "
            f"schema release, seq {spend['seq']}, composed)"
        ),
    }


def label_counts(labels: str, n: int, num_classes: int) -> list[int]:
    """Records per class: `balanced` (data-independent, free) or per-class COUNTS `a,b,...`.

    Balanced gives each class n // K records and the first n % K classes one more (a table's
    run may also ask for its target's `weights`: see `table_label_counts`).
    """
    if labels == "balanced":
        return [n // num_classes + (1 if c < n % num_classes else 0) for c in range(num_classes)]
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
    return counts


def weighted_counts(n: int, weights: Sequence[float]) -> list[int]:
    """`n` records split in proportions `weights` (largest remainder; they sum to n)."""
    exact = [n * float(w) / float(sum(weights)) for w in weights]
    counts = [math.floor(e) for e in exact]
    order = sorted(range(len(exact)), key=lambda c: exact[c] - counts[c], reverse=True)
    for c in order[: n - sum(counts)]:
        counts[c] += 1
    return counts


def table_label_counts(labels: str, n: int, info: DataInfo) -> tuple[list[int], str]:
    """Records per class of a table's sample and the rule used, stated in its manifest.

    `weights`: the target's `weights` in the run's schema (declared public or released with DP
    before training: the proportions the generator was trained with); `balanced` (the default:
    on census it gave downstream classifiers a higher ROC-AUC than the true 6% share) or
    COUNTS as for images.
    """
    schema = info.schema or {}
    target = next((c for c in schema.get("columns", ()) if c["name"] == schema.get("target")), {})
    weights = target.get("weights")
    if labels == "weights":
        if not weights:
            raise UsageError("--labels weights: the run's schema gives its target no 'weights'")
        source = target.get("weights_source") or "declared public in the schema"
        return weighted_counts(n, weights), f"weights of the target ({source})"
    counts = label_counts(labels, n, len(info.classes))
    return counts, "balanced" if labels == "balanced" else "counts (--labels)"


def parse_labels(labels: str, n: int, num_classes: int) -> torch.Tensor:
    """All N labels to generate, class by class (see `label_counts`), as one int64 tensor."""
    counts = label_counts(labels, n, num_classes)
    return torch.repeat_interleave(torch.arange(num_classes), torch.tensor(counts))


def label_chunks(counts: Sequence[int], batch_size: int) -> Iterator[torch.Tensor]:
    """The labels of `parse_labels`, in order, as int64 chunks of at most `batch_size`; memory
    is O(batch_size) whatever the total."""
    label, left = 0, 0
    remaining = sum(counts)
    while remaining > 0:
        size = min(batch_size, remaining)
        parts = []
        need = size
        while need > 0:
            while left == 0:
                left = counts[label]
                label += 1
            take = min(need, left)
            parts.append(torch.full((take,), label - 1, dtype=torch.int64))
            left -= take
            need -= take
        remaining -= size
        yield torch.cat(parts)


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
    batches = list(_batches(generator, counts, batch_size, seed))
    images = torch.cat([batch.cpu() for batch, _ in batches])
    return images, torch.cat([chunk for _, chunk in batches]), info.classes


def _batches(
    generator: Generator, counts: Sequence[int], batch_size: int, seed: int
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    rng = torch.Generator(device=generator.device).manual_seed(seed)
    for chunk in label_chunks(counts, batch_size):
        done = 0
        for images in generator.sample(chunk.to(generator.device), batch_size, rng):
            size = int(images.shape[0])
            yield images, chunk[done : done + size]
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


# Far beyond any real release; above it a typo (an extra zero or two) is the likely cause.
MAX_SAMPLES = 10**9


def sample_run(
    run_dir: Path | str,
    n: int,
    out_dir: Path | str,
    fmt: str | None = None,
    labels: str = "balanced",
    batch_size: int = 500,
    seed: int = 0,
    device: str = "auto",
    force: bool = False,
    ledger_path: Path | str | None = None,
    progress: SampleProgress | None = None,
    truncation: float | None = None,
) -> dict[str, Any]:
    """Write N synthetic images to `out_dir` and record the release in the ledger.

    PNG: `OUT/<class>/<index>.png`, `labels.csv`, `manifest.json`. NPZ: `OUT/samples.npz`
    (`x` uint8 [N,C,H,W], `y` int64, `classes`) and `manifest.json`. Everything is written into
    a staging folder beside OUT and renamed into place at the end, in batches so that memory
    stays flat in N. `force` replaces only an earlier output of `sample` (see
    `dpsynth.outdir.check_target`); staging folders of killed runs are removed first.
    A table's run writes one CSV file instead (`fmt` csv, the default there): see
    `sample_table`. `truncation` overrides the run's latent scale (see `set_truncation`).
    """
    if n < 1:
        raise UsageError(f"--n must be at least 1, got {n}")
    if n > MAX_SAMPLES:
        raise UsageError(f"--n must be at most {MAX_SAMPLES:.0e}, got {n}")
    if _run_modality(run_dir) == "table":
        if fmt not in (None, "csv"):
            raise UsageError(f"--format {fmt}: a table's run writes csv")
        return sample_table(
            run_dir, n, out_dir, labels=labels, batch_size=batch_size, seed=seed,
            device=device, force=force, ledger_path=ledger_path, progress=progress,
            truncation=truncation,
        )  # fmt: skip
    fmt = fmt or "png"
    if fmt not in ("png", "npz"):
        raise UsageError(f"--format must be png or npz, got {fmt!r}")
    check_batch_size("--batch-size", batch_size, 1)
    out = Path(out_dir)
    run = RunDir(run_dir)
    # The statement comes from the ledger, checked before anything is generated or written.
    privacy = run_privacy(run_dir, ledger_path)
    check_target(
        out,
        flag="--out",
        force=force,
        protected=[(run.path, "the run directory"), (Path(privacy["ledger"]), "the ledger")],
        written_by_us=is_sample_output,
    )
    generator, run_config, info = load_generator(run_dir, device)
    check_batch_size("--batch-size", batch_size, math.prod(info.shape))
    set_truncation(generator, truncation, run_config["method"])
    counts = label_counts(labels, n, len(info.classes))
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
        release = _record_release(run_config, info, privacy["ledger"], output_sha, n, fmt, out)
        manifest = {
            "run_id": run_config["run_id"],
            "run": str(Path(run_dir).resolve()),
            "method": run_config["method"],
            "private": privacy["private"],
            "privacy": privacy["statement"],
            "privacy_source": {
                key: privacy[key]
                for key in ("ledger", "ledger_seq", "ledger_hash", "status", "epsilon", "delta")
            },
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


def is_sample_output(folder: Path) -> bool:
    """True when `folder` holds only what `sample` writes, with its manifest."""
    try:
        manifest = json.loads((folder / "manifest.json").read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(manifest, dict) or not {"run_id", "output_sha256"} <= manifest.keys():
        return False
    if manifest.get("format") == "npz":
        return {p.name for p in folder.iterdir()} <= {"manifest.json", "samples.npz"}
    classes = {str(name) for name in manifest.get("classes") or []}
    for path in folder.iterdir():
        if path.name in ("manifest.json", "labels.csv") and path.is_file():
            continue
        if path.name not in classes or path.is_symlink() or not path.is_dir():
            return False
        if any(not (f.is_file() and _PNG_NAME.match(f.name)) for f in path.iterdir()):
            return False
    return True


_PNG_NAME = re.compile(r"^\d+\.png$")


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
        for images, labels in _batches(generator, counts, batch_size, seed):
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
            for images, _ in _batches(generator, counts, batch_size, seed):
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


def _record_release(
    run_config: dict[str, Any],
    info: DataInfo,
    ledger_path: Path | str,
    output_sha: str,
    n: int,
    fmt: str,
    out: Path,
) -> dict[str, Any] | None:
    path = ledger_path
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


def _run_modality(run_dir: Path | str) -> str:
    try:
        data = RunDir(run_dir).read_config().get("data")
    except DataError:
        return "image"  # the image path reports the problem with its own message
    return str(data.get("modality", "image")) if isinstance(data, dict) else "image"


def table_manifest_path(out: Path | str) -> Path:
    """Where `sample` writes the manifest of a CSV: `OUT.manifest.json` beside it."""
    out = Path(out)
    return out.with_name(out.name + ".manifest.json")


def sample_table(
    run_dir: Path | str,
    n: int,
    out: Path | str,
    labels: str = "balanced",
    batch_size: int = 500,
    seed: int = 0,
    device: str = "auto",
    force: bool = False,
    ledger_path: Path | str | None = None,
    progress: SampleProgress | None = None,
    truncation: float | None = None,
) -> dict[str, Any]:
    """Write N synthetic rows of a table's run to the CSV file `out` and record the release.

    The CSV has the original header, column order and category strings (see
    `dpsynth.data.tabular`); it is streamed batch by batch into a temporary name beside
    `out` and renamed into place, with `OUT.manifest.json` (provenance, privacy statement,
    SHA-256 of the CSV). `force` replaces only an earlier CSV of `sample` (one with its
    manifest). Categorical blocks are sampled with the public `seed`.
    """
    import os

    from dpsynth.data.tabular import codec_for

    check_batch_size("--batch-size", batch_size, 1)
    out = Path(out)
    run = RunDir(run_dir)
    privacy = run_privacy(run_dir, ledger_path)
    manifest_path = table_manifest_path(out)
    resolved = out.resolve()
    if resolved == Path(privacy["ledger"]).resolve() or run.path.resolve() in resolved.parents:
        raise UsageError(f"--out {out}: would overwrite the ledger or the run directory")
    if out.is_dir():
        raise UsageError(f"--out {out} is a folder; a table is written to a CSV file")
    if out.exists():
        if not force:
            raise UsageError(f"--out {out} exists; pass --force to replace it")
        if not manifest_path.is_file():
            raise UsageError(
                f"--out {out} was not written by `sample` (no {manifest_path.name}); "
                "--force replaces only an earlier sample"
            )
    generator, run_config, info = load_generator(run_dir, device)
    check_batch_size("--batch-size", batch_size, math.prod(info.shape))
    set_truncation(generator, truncation, run_config["method"])
    codec = codec_for(info)
    counts, label_rule = table_label_counts(labels, n, info)
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_staging(out.parent)  # CSVs that killed `sample` runs were writing
    replaced = out.exists()
    temporary = staging_file(out)
    digest = hashlib.sha256()
    rng = np.random.default_rng(seed)
    done = 0
    try:
        with temporary.open("w", encoding="utf-8", newline="") as handle:
            for rows, chunk in _batches(generator, counts, batch_size, seed):
                frame = codec.decode(rows.cpu().numpy(), chunk.numpy(), rng)
                text = codec.csv_text(frame, header=done == 0)
                handle.write(text)
                digest.update(text.encode("utf-8"))
                done += len(frame)
                if progress is not None:
                    progress(done, n)
            handle.flush()
            os.fsync(handle.fileno())
        output_sha = digest.hexdigest()
        release = _record_release(run_config, info, privacy["ledger"], output_sha, n, "csv", out)
        manifest = {
            "run_id": run_config["run_id"],
            "run": str(Path(run_dir).resolve()),
            "method": run_config["method"],
            "private": privacy["private"],
            "privacy": privacy["statement"],
            "privacy_source": {
                key: privacy[key]
                for key in ("ledger", "ledger_seq", "ledger_hash", "status", "epsilon", "delta")
            },
            "n": n,
            "format": "csv",
            "modality": "table",
            "classes": list(info.classes),
            "label_counts": counts,
            "labels": label_rule,
            "seed": seed,
            "truncation": generator.truncation,
            "columns": [c.name for c in codec.schema.columns],
            "schema": info.schema,
            "dataset_id": info.dataset_id,
            "fingerprint": info.fingerprint,
            "output_sha256": output_sha,
            "ledger": release,
        }
        write_json_atomic(manifest_path, manifest)
        os.replace(temporary, out)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    return {"out": str(out), "manifest": str(manifest_path), "replaced": replaced, **manifest}
