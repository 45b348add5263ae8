"""A public 28×28 digit set rendered from the system's fonts, for `train --public` (issue 45).

    python -m bench.fonts28 --out /tmp/fonts28
    python -m bench.leaderboard --data mnist-5k --methods dpkernel --epsilon 1 --seeds 3 \
        --no-real --no-dpsgd --preset mnist-eps1-teacher --public npz:/tmp/fonts28/train.npz

Typeset digits are public and unlike MNIST's handwriting, so they test what declared-public
data adds without touching the private set. Each image is one digit from one of the TrueType
fonts found (`--fonts`, default every `.ttf` under /usr/share/fonts: DejaVu's 22 faces here),
drawn with a random size, stroke width, rotation and shear, then framed as MNIST frames its
digits: the glyph scaled to fit a 20 × 20 box and placed so that its centre of mass is at the
centre of the 28 × 28 image (white on black). Writes `train.npz` (`x` uint8 [N, 1, 28, 28],
`y`, `classes` "0"–"9") under `--out`: generated from a public seed, never committed.
"""

from __future__ import annotations

import argparse
import glob
import math
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

SIZE, BOX = 28, 20
CLASSES = [str(d) for d in range(10)]


def font_files(pattern: str) -> list[str]:
    """The TrueType files matching `pattern` (recursive glob), sorted for a stable order."""
    return sorted(glob.glob(pattern, recursive=True))


def render(digit: str, font: ImageFont.FreeTypeFont, rng: np.random.Generator) -> np.ndarray:
    """One digit, white on black, on a 28 × 28 uint8 canvas framed as MNIST is."""
    canvas = Image.new("L", (96, 96), 0)
    stroke = int(rng.integers(0, 3))
    ImageDraw.Draw(canvas).text((48, 48), digit, fill=255, font=font, anchor="mm",
                                stroke_width=stroke, stroke_fill=255)  # fmt: skip
    shear = math.tan(math.radians(rng.uniform(-15, 15)))
    canvas = canvas.transform(
        canvas.size, Image.Transform.AFFINE, (1, shear, -shear * 48, 0, 1, 0), Image.BILINEAR
    ).rotate(rng.uniform(-12, 12), resample=Image.BILINEAR, center=(48, 48))
    glyph = canvas.crop(canvas.getbbox())
    scale = BOX / max(glyph.size)
    width, height = (max(1, round(side * scale)) for side in glyph.size)
    glyph = np.asarray(glyph.resize((width, height), Image.LANCZOS), dtype=np.float64)
    rows, cols = np.indices(glyph.shape)
    mass = glyph.sum()
    top = round(SIZE / 2 - (rows * glyph).sum() / mass)
    left = round(SIZE / 2 - (cols * glyph).sum() / mass)
    top = min(max(top, 0), SIZE - height)
    left = min(max(left, 0), SIZE - width)
    out = np.zeros((SIZE, SIZE))
    out[top : top + height, left : left + width] = glyph
    return out.clip(0, 255).round().astype(np.uint8)


def make(n: int, fonts: list[str], seed: int) -> tuple[np.ndarray, np.ndarray]:
    """`n` rendered digits (balanced classes, fonts drawn at random) and their labels."""
    rng = np.random.default_rng(seed)
    loaded: dict[tuple[str, int], ImageFont.FreeTypeFont] = {}
    x = np.zeros((n, 1, SIZE, SIZE), dtype=np.uint8)
    y = np.arange(n) % len(CLASSES)
    rng.shuffle(y)
    for i, label in enumerate(y):
        key = (fonts[int(rng.integers(len(fonts)))], int(rng.integers(40, 64)))
        if key not in loaded:
            loaded[key] = ImageFont.truetype(*key)
        x[i, 0] = render(CLASSES[label], loaded[key], rng)
    return x, y.astype(np.int64)


def main() -> None:
    """Write the set (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--n", type=int, default=5000)
    parser.add_argument("--fonts", default="/usr/share/fonts/**/*.ttf")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    fonts = font_files(args.fonts)
    if not fonts:
        raise SystemExit(f"no TrueType fonts match {args.fonts!r}: pass --fonts GLOB")
    args.out.mkdir(parents=True, exist_ok=True)
    x, y = make(args.n, fonts, args.seed)
    np.savez_compressed(args.out / "train.npz", x=x, y=y, classes=np.asarray(CLASSES))
    print(f"{args.out / 'train.npz'}: {len(x)} images {tuple(x.shape[1:])} from {len(fonts)} fonts")


if __name__ == "__main__":
    main()
