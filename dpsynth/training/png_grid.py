"""Image grids written as PNG files (the run's preview, the leaderboard's sample sheets)."""

from __future__ import annotations

import io
from pathlib import Path

import torch
from PIL import Image
from torchvision.utils import make_grid

from dpsynth.rundir import write_bytes_atomic


def grid_image(images: torch.Tensor, nrow: int, upscale: int = 0) -> Image.Image:
    """A PIL image of uint8 images [N, C, H, W] laid out `nrow` per row (grayscale stays L).

    `upscale` (0 = automatic) enlarges small images with nearest-neighbour so 8x8 digits stay
    visible.
    """
    if images.numel() == 0:
        raise ValueError("no images to show")
    grid = make_grid(images.to(torch.uint8), nrow=nrow, padding=1, pad_value=128)
    array = grid.permute(1, 2, 0).numpy()
    picture = Image.fromarray(array[..., 0] if images.shape[1] == 1 else array)
    factor = upscale or max(1, 64 // int(images.shape[-1]))
    if factor > 1:
        picture = picture.resize(
            (picture.width * factor, picture.height * factor), Image.Resampling.NEAREST
        )
    return picture


def save_grid(images: torch.Tensor, path: Path, nrow: int, upscale: int = 0) -> None:
    """Write `grid_image(...)` to `path` as PNG, atomically."""
    buffer = io.BytesIO()
    grid_image(images, nrow, upscale).save(buffer, format="PNG")
    write_bytes_atomic(Path(path), buffer.getvalue())
