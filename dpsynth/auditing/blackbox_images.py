"""Black-box one-run audit of a whole image run: canary images in, `train` → `sample`, a
membership score from the released images only.

As `auditing/blackbox.py` does for tables (Steinke, Nasr and Jagielski's one-run audit with the
release as the only view): m canary images, each added to a built-in image set's training
split with probability 1/2, written as an .npz file and read back by `train` like any user
data; the library's own `train_run` and `sample_run` (NPZ) run in a temporary folder with
its own ledger, and each canary is scored by how close the nearest released image of its
label comes to it (minus the L2 distance in [-1, 1] pixels). The canaries are rare by
design: every pixel black or white at random (a digit image is mostly black with a few
strokes), so a released image near one is hard to explain without the canary.

What it shows and what it does not: as the table black-box. A bound of 0 is the expected
result of a correct run; it does not show that ε is tight nor that a stronger attack fails.
Only public data (the built-in set) and synthetic canaries are read.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch

from dpsynth.auditing.blackbox import BlackBoxResult
from dpsynth.auditing.guesses import draw_canaries
from dpsynth.data.builtin import BUILTINS, load_builtin
from dpsynth.errors import UsageError
from dpsynth.methods.registry import get_method

__all__ = ["canary_images", "nearest_scores", "run_image_blackbox"]

MODE = "black-box (train → sample, score from the released images)"


def canary_images(
    shape: tuple[int, ...], classes: int, count: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """`count` canaries: uint8 [count, C, H, W] pixels each 0 or 255 at random, and labels
    spread over the classes (int64 [count])."""
    rng = np.random.default_rng(seed)
    pixels = (rng.integers(0, 2, (count, *shape)) * 255).astype(np.uint8)
    return pixels, (np.arange(count) % classes).astype(np.int64)


def nearest_scores(
    canaries: np.ndarray, labels: np.ndarray, released: np.ndarray, released_labels: np.ndarray
) -> torch.Tensor:
    """Each canary's score: minus the L2 distance (pixels in [-1, 1]) to the nearest released
    image of its label (float64 [m]; −inf where no image has that label)."""
    ours = torch.from_numpy(canaries.reshape(len(canaries), -1)).double() / 127.5 - 1.0
    theirs = torch.from_numpy(released.reshape(len(released), -1)).double() / 127.5 - 1.0
    scores = torch.full((len(canaries),), -float("inf"), dtype=torch.float64)
    for label in np.unique(labels):
        mine = torch.from_numpy(labels == label)
        pool = theirs[torch.from_numpy(released_labels == label)]
        if len(pool):
            scores[mine] = -torch.cdist(ours[mine], pool).min(dim=1).values
    return scores


def run_image_blackbox(
    method: str,
    preset: str,
    epsilon: float,
    *,
    canaries: int = 100,
    confidence: float = 0.95,
    data: str = "digits",
    seed: int | None = None,
    synthetic_images: int | None = None,
    workdir: Path | str | None = None,
    overrides: Mapping[str, str] | None = None,
) -> BlackBoxResult:
    """One black-box run: canaries into the built-in image set's training split, `train` (with
    `overrides`, `train`'s `--set` values) and `sample` through the library, guesses from the
    released images → a lower bound."""
    from dpsynth.sampling.images import sample_run
    from dpsynth.training.entry import train_run

    if "image" not in get_method(method).modalities:
        raise UsageError(f"--method {method} takes table data; audit it on a built-in table")
    if data not in BUILTINS:
        raise UsageError(
            f"--black-box on images audits a built-in set (one of {', '.join(BUILTINS)}), "
            f"got --data {data}"
        )
    described = BUILTINS[data]
    x, y = load_builtin(data, "train")
    generator, included = draw_canaries(canaries, seed)
    canary_seed = int(torch.randint(0, 2**31 - 1, (1,), generator=generator))
    pixels, labels = canary_images(
        tuple(x.shape[1:]), len(described.classes), canaries, canary_seed
    )
    keep = included.numpy()
    with tempfile.TemporaryDirectory(dir=workdir) as folder:
        work = Path(folder)
        train_npz = work / "train.npz"
        np.savez(
            train_npz,
            x=np.concatenate([x, pixels[keep]]),
            y=np.concatenate([y, labels[keep]]),
            classes=np.array(described.classes),
        )
        ledger = work / "ledger.jsonl"
        trained = train_run(
            method=method,
            data=f"npz:{train_npz}",
            epsilon=float(epsilon),
            preset=preset,
            out=work / "run",
            ledger_path=ledger,
            device="cpu",
            seed=0,
            overrides=dict(overrides or {}),
        )
        count = int(synthetic_images or len(x))
        sample_run(work / "run", count, work / "synthetic", fmt="npz", ledger_path=ledger,
                   device="cpu")  # fmt: skip
        with np.load(work / "synthetic" / "samples.npz") as release:
            released, released_labels = release["x"], release["y"]
    scores = nearest_scores(pixels, labels, released, released_labels)
    return BlackBoxResult.of_run(
        trained, data, epsilon, {"nearest": scores}, included, confidence, count, overrides,
        mode=MODE,
    )  # fmt: skip
