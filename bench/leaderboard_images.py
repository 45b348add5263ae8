"""The leaderboard's image rows: the real and public references, one (method, ε[, variant])
trained, sampled and evaluated through the CLI, and the sample grids they keep."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

from bench import leaderboard_runs as board
from bench.ablation import ABLATION_VARIANTS, distinct_variants
from bench.leaderboard_runs import REPO, _run_row, preset_for, test_spec


def _evaluate(
    folder: Path, args: argparse.Namespace, ledger: Path, seeds: int
) -> tuple[dict, float]:
    """`dpsynth evaluate` of an image folder against the held-out split: its JSON, seconds."""
    metrics = "accuracy" if args.no_fid else "accuracy,fid,precision,recall"
    command = [
        "evaluate", "--synthetic", str(folder), "--real", test_spec(args),
        "--metrics", metrics, "--classifier", "cnn", "--seeds", str(seeds),
        "--fid-n", str(args.fid_n),
        "--device", args.device, "--ledger", str(ledger), "--quiet",
    ]  # fmt: skip
    if args.inception_weights:
        command += ["--inception-weights", str(args.inception_weights)]
    return board.run_cli(command)


def _scores(evaluation: dict) -> dict[str, Any]:
    """A row's image scores (CNN accuracy, FID, precision, recall) from `evaluate`'s JSON."""
    found = evaluation["metrics"]
    accuracy = found["accuracy"]
    fid = found.get("fid")
    return {
        "cnn_mean": accuracy["mean"],
        "cnn_std": accuracy["std"],
        "cnn_per_seed": accuracy.get("per_seed"),
        "fid": fid["value"] if fid else None,
        "fid_n_synthetic": fid.get("n_synthetic") if fid else None,
        "fid_n_real": fid.get("n_real") if fid else None,
        "precision": found["precision"]["value"] if "precision" in found else None,
        "recall": found["recall"]["value"] if "recall" in found else None,
        "warnings": evaluation.get("warnings", []),
    }


def write_image_folder(x: Any, y: Any, classes: tuple[str, ...], out: Path) -> int:
    """Labelled uint8 images [n, C, H, W] as PNG class folders (what `evaluate` reads);
    returns n."""
    import numpy as np
    from PIL import Image

    for index, (image, label) in enumerate(zip(x, y, strict=True)):
        folder = out / classes[int(label)]
        folder.mkdir(parents=True, exist_ok=True)
        array = image.numpy()
        array = array[0] if array.shape[0] == 1 else np.transpose(array, (1, 2, 0))
        Image.fromarray(array).save(folder / f"{index}.png")
    return len(y)


def write_real_folder(data: str, out: Path) -> int:
    """The real train split as PNG class folders (what `evaluate` reads); returns n."""
    from dpsynth.data.sources import load_data

    records = load_data(data)
    return write_image_folder(records.x, records.y, tuple(records.classes), out)


def real_row(args: argparse.Namespace, seeds: int) -> dict[str, Any]:
    """The real-trained upper bound: the train split evaluated as if it were synthetic."""
    with tempfile.TemporaryDirectory(prefix="leaderboard-real-") as tmp:
        folder = Path(tmp) / "real"
        n = write_real_folder(args.data, folder)
        evaluation, _ = _evaluate(folder, args, Path(tmp) / "ledger.jsonl", seeds)
    return {"method": "real train data", "preset": None, "epsilon": None, "n": n} | _scores(
        evaluation
    )


PUBLIC_METHOD = "the public images alone (no ε)"


def public_row(args: argparse.Namespace, seeds: int, info: Any) -> dict[str, Any]:
    """What `--public` gives with no private record at all: the declared-public images, read
    as `train --public` reads them (the data's shape and classes, from `info`), evaluated as if
    they were the release. A release that uses them earns its ε only where it beats this."""
    from dpsynth.data.public import load_public

    public = load_public(args.public, tuple(info.shape), tuple(info.classes))
    if public.y is None:
        raise SystemExit(f"--public {args.public}: the public row needs the data's class names")
    with tempfile.TemporaryDirectory(prefix="leaderboard-public-") as tmp:
        folder = Path(tmp) / "public"
        n = write_image_folder(public.x, public.y, tuple(info.classes), folder)
        evaluation, _ = _evaluate(folder, args, Path(tmp) / "ledger.jsonl", seeds)
        save_sample_grid(folder, args.grids / grid_folder(args.data) / "public-images.png")
    return {"method": PUBLIC_METHOD, "preset": None, "epsilon": None, "n": n} | _scores(evaluation)


def parse_variant(text: str) -> tuple[str, list[str]]:
    """`NAME:key=value,key=value` (or `NAME:` for no change) → (NAME, ["key=value", …])."""
    name, _, settings = text.partition(":")
    if not name:
        raise argparse.ArgumentTypeError(f"--variant {text!r}: NAME:key=value,… expected")
    return name, [item.strip() for item in settings.split(",") if item.strip()]


def settings_for(method: str, info: Any, preset: str, wanted: list[str]) -> list[str]:
    """The `key=value` settings of `wanted` that the method's preset has (a variant's stage
    settings are skipped by a backend without that stage, e.g. a teacher key)."""
    from dpsynth.methods.registry import get_method

    known = get_method(method).presets_for(info)[preset]
    return [item for item in wanted if item.split("=", 1)[0] in known]


def requested_variants(args: argparse.Namespace) -> list[tuple[str, list[str]]]:
    """`--ablation`'s variants (bench/ablation.py), then each `--variant`."""
    return [*(ABLATION_VARIANTS if args.ablation else []), *(args.variant or [])]


def method_variants(
    method: str, epsilon: str, args: argparse.Namespace, info: Any
) -> list[tuple[str, list[str]] | None]:
    """The rows of one (method, ε): `--variant`s, with `--ablation`'s first; None (the preset
    alone) without either. A variant that changes nothing the preset has beyond what an
    earlier one changed is dropped (e.g. `alone` for `freq`)."""
    variants = requested_variants(args)
    if not variants:
        return [None]
    preset = preset_for(method, info, epsilon, args.preset)
    effective = [settings_for(method, info, preset, items) for _, items in variants]
    return list(distinct_variants(variants, effective))


def save_sample_grid(folder: Path, path: Path, per_class: int = 10) -> None:
    """The first `per_class` images of each class folder of a sample, one class per row."""
    import numpy as np
    import torch
    from PIL import Image

    from dpsynth.training.png_grid import save_grid

    images = []
    for class_dir in sorted(p for p in folder.iterdir() if p.is_dir()):
        files = sorted(class_dir.glob("*.png"), key=lambda f: (len(f.name), f.name))[:per_class]
        for file in files:
            array = np.asarray(Image.open(file))
            array = array[None] if array.ndim == 2 else np.transpose(array, (2, 0, 1))
            images.append(torch.from_numpy(array.copy()))
    if images:
        save_grid(torch.stack(images), path, nrow=per_class)


def grid_path(args: argparse.Namespace, method: str, preset: str, epsilon: str,
              variant: str | None) -> Path:  # fmt: skip
    """Where a row's sample grid is kept: `GRIDS/<data>/<method>-<preset>-e<ε>[-variant].png`."""
    tail = f"-{variant}" if variant else ""
    name = f"{method}-{preset}-e{epsilon}{tail}.png".replace("/", "_")
    return args.grids / grid_folder(args.data) / name


def grid_folder(data: str) -> str:
    """One folder name per data spec (`mnist-5k`, `npz-digits28-train` for npz:DIR/digits28/
    train.npz): a path in a spec would otherwise nest the grids in its folders."""
    if ":" in data and "/" in data:
        kind, path = data.split(":", 1)
        parts = Path(path).with_suffix("").parts[-2:]
        return "-".join([kind, *parts])
    return data.replace(":", "-")


def method_row(
    method: str,
    epsilon: str,
    args: argparse.Namespace,
    seeds: int,
    n: int,
    info: Any,
    variant: tuple[str, list[str]] | None = None,
) -> dict[str, Any]:
    """Train, sample and evaluate one (method, ε[, variant]) in a fresh temporary ledger; the
    sample's grid (10 images a class) is kept under `args.grids`."""
    preset = preset_for(method, info, epsilon, args.preset)
    extra = settings_for(method, info, preset, variant[1]) if variant else []
    with tempfile.TemporaryDirectory(prefix=f"leaderboard-{method}-") as tmp:
        root = Path(tmp)
        ledger = root / "ledger.jsonl"
        command = [
            "train", "--method", method, "--data", args.data, "--epsilon", epsilon,
            "--preset", preset, "--out", str(root / "run"), "--device", args.device,
            "--ledger", str(ledger), "--quiet",
        ]  # fmt: skip
        for item in [*(args.set or []), *extra]:
            command += ["--set", item]
        if args.public:  # declared-public pretraining images (no ε; the same plan)
            command += ["--public", args.public]
        trained, train_s = board.run_cli(command)
        sampled, sample_s = board.run_cli(
            ["sample", str(root / "run"), "--n", str(n), "--out", str(root / "synth"),
             "--device", args.device, "--ledger", str(ledger), "--quiet"]
        )  # fmt: skip
        grid = grid_path(args, method, preset, epsilon, variant[0] if variant else None)
        save_sample_grid(root / "synth", grid)
        evaluation, _ = _evaluate(root / "synth", args, ledger, seeds)
    row = _run_row(method, preset, epsilon, args, (trained, train_s), (sampled, sample_s))
    row["overrides"] = [*(args.set or []), *extra]
    row |= {"variant": variant[0] if variant else None, "grid": _relative(grid)}
    row["stages"] = trained.get("stages")
    row["public"] = args.public
    return row | {"sample_images_per_s": round(sampled["n"] / sample_s, 1)} | _scores(evaluation)


def _relative(path: Path) -> str:
    """`path` relative to the repository when inside it (as the report records grids)."""
    try:
        return str(path.resolve().relative_to(REPO))
    except ValueError:
        return str(path)
