"""Unseen 28×28 data for issue 28's goal 5: the built-in 8×8 digits upscaled to 28×28.

    python -m bench.digits28 --out /tmp/digits28
    python -m bench.leaderboard --data npz:/tmp/digits28/train.npz \
        --test npz:/tmp/digits28/test.npz --methods pge rdpgan --epsilon 1 10 --no-fid

The 28×28 presets were designed on mnist-5k; this data set has the same record size (784
values, so `--preset auto` and `--method auto` take their 28×28 choices) but other records:
1,437 training and 360 test digits of another source (UCI's 8×8 scans, scikit-learn's split
that `digits` uses), bilinearly upscaled, so strokes are thick and blurred rather than MNIST's
thin pen strokes, and N is a third of mnist-5k's. Writes `train.npz` and `test.npz` (`x`
uint8 [N, 1, 28, 28], `y`, `classes`) under `--out`: a public transform of public data,
generated, never committed.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch
from torch.nn import functional as F

from dpsynth.data.sources import load_data

SIZE = 28


def upscaled(spec: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A built-in split's images at SIZE × SIZE (bilinear), its labels and class names."""
    data = load_data(spec)
    pixels = F.interpolate(data.x.float(), size=(SIZE, SIZE), mode="bilinear", align_corners=False)
    x = pixels.round().clamp(0, 255).to(torch.uint8).numpy()
    return x, data.y.numpy(), np.asarray(data.classes)


def main() -> None:
    """Write the two splits (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for split, spec in (("train", "digits"), ("test", "digits:test")):
        x, y, classes = upscaled(spec)
        np.savez_compressed(args.out / f"{split}.npz", x=x, y=y, classes=classes)
        print(f"{args.out / f'{split}.npz'}: {len(x)} images {tuple(x.shape[1:])}")


if __name__ == "__main__":
    main()
