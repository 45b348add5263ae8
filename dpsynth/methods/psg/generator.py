"""What PSG releases and how `sample --n N` draws from it (spec psg §9.5).

The artefact is the synthetic set S itself: M = L·spc float images in the training scale
([-1, 1] nominal, unclamped) with fixed balanced labels. Sampling N images cycles through S:
the j-th image asked for in class c is member j mod spc of class c, so N ≤ M gives a
stratified subset and N > M repeats each member. Every repeat beyond a member's first copy
gets a seeded random evaluation-time augmentation (by default; `augment_replicas=false` gives
exact repeats): one of a shift (pad-and-crop), an independent x/y rescale in [0.8, 1.2], or a
rotation in [−45°, 45°), the mean-filled augmentation a classifier trained on S would see
(spec §6.1). All of it is post-processing of S: no privacy cost.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import torch
from torch.nn import functional as F

from dpsynth.data.images import to_uint8
from dpsynth.methods.base import Generator, GeneratorState


def augment(images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One random shift, rescale or rotation per image (float [b, C, H, W]), mean-filled."""
    b, _, height, width = images.shape
    if b == 0:
        return images
    device = generator.device
    # Six uniforms per image, drawn in one call: the stream an image sees does not depend on
    # how a request is chunked into batches.
    u = torch.rand((b, 6), generator=generator, device=device, dtype=torch.float64)
    pad = max(1, round(min(height, width) / 7))  # 4 px on 28×28, as the reference code
    kind = (u[:, 0] * 3).floor().clamp(max=2)
    shift = (u[:, 1:3] * (2 * pad + 1)).floor().clamp(max=2 * pad) - pad
    scale = 0.8 + 0.4 * u[:, 3:5]
    angle = (u[:, 5] * 90).floor().clamp(max=89) - 45
    theta = torch.zeros(b, 2, 3, dtype=torch.float64, device=device)
    theta[:, 0, 0] = theta[:, 1, 1] = 1.0
    is_shift, is_scale, is_rotate = kind == 0, kind == 1, kind == 2
    # affine_grid maps output to input coordinates in [-1, 1]: a shift by s pixels is
    # −2s/size, a zoom by f divides the coordinates by f.
    theta[is_shift, 0, 2] = -2.0 * shift[is_shift, 0] / width
    theta[is_shift, 1, 2] = -2.0 * shift[is_shift, 1] / height
    theta[is_scale, 0, 0] = 1.0 / scale[is_scale, 0]
    theta[is_scale, 1, 1] = 1.0 / scale[is_scale, 1]
    radians = angle * math.pi / 180.0
    cos, sin = torch.cos(radians), torch.sin(radians)
    theta[is_rotate, 0, 0] = cos[is_rotate]
    theta[is_rotate, 0, 1] = -sin[is_rotate]
    theta[is_rotate, 1, 0] = sin[is_rotate]
    theta[is_rotate, 1, 1] = cos[is_rotate]
    theta = theta.to(device=images.device, dtype=images.dtype)
    grid = F.affine_grid(theta, list(images.shape), align_corners=False)
    mean = images.mean(dim=(2, 3), keepdim=True)
    moved = F.grid_sample(images - mean, grid, mode="bilinear", align_corners=False)
    return moved + mean


class PSGGenerator(Generator):
    """Cycles through the released synthetic set; repeats are augmented (seeded)."""

    def __init__(
        self,
        images: torch.Tensor,
        labels: torch.Tensor,
        classes: tuple[str, ...],
        device: torch.device,
        augment_replicas: bool = True,
    ) -> None:
        self.device = torch.device(device)
        self.images = images.detach().to(self.device, torch.float32)
        self.labels = labels.detach().to(torch.int64).cpu()
        self.classes = tuple(classes)
        self.shape = tuple(int(s) for s in images.shape[1:])  # type: ignore[assignment]
        self.augment_replicas = bool(augment_replicas)
        self.members = [
            torch.nonzero(self.labels == c).flatten().tolist() for c in range(len(self.classes))
        ]
        # How many images of each class this generator has emitted: `sample` may be called
        # once per chunk of a request, and the cycle continues across calls.
        self._emitted = [0] * len(self.classes)

    @classmethod
    def from_state(cls, state: GeneratorState) -> PSGGenerator:
        """The sampler over the saved synthetic set (`synthetic.images`, `.labels`)."""
        return cls(
            state.tensors["synthetic.images"],
            state.tensors["synthetic.labels"],
            state.info.classes,
            state.device,
            bool(state.config["augment_replicas"]),
        )

    def _plan_chunk(self, labels: torch.Tensor) -> tuple[list[int], list[bool]]:
        """Base index into S and "is a repeat" for each requested label, advancing the cycle."""
        bases, repeats = [], []
        for label in labels.tolist():
            members = self.members[label]
            if not members:
                raise ValueError(f"class {label} has no member in the synthetic set")
            count = self._emitted[label]
            bases.append(members[count % len(members)])
            repeats.append(count >= len(members))
            self._emitted[label] = count + 1
        return bases, repeats

    @torch.no_grad()
    def sample(
        self, labels: torch.Tensor, batch_size: int, generator: torch.Generator
    ) -> Iterator[torch.Tensor]:
        """uint8 images for `labels` in order, cycling per class; repeats augmented."""
        for start in range(0, int(labels.numel()), batch_size):
            chunk = labels[start : start + batch_size].cpu()
            bases, repeats = self._plan_chunk(chunk)
            images = self.images[torch.tensor(bases, dtype=torch.int64, device=self.device)]
            if self.augment_replicas:
                # Drawn for every image so the stream does not depend on which are repeats.
                moved = augment(images, generator)
                mask = torch.tensor(repeats, device=self.device)[:, None, None, None]
                images = torch.where(mask, moved, images)
            yield to_uint8(images).cpu()

    def release_details(self, counts: Sequence[int]) -> dict[str, object]:
        """How `counts[c]` records of each class c are served: unique base images, repeats,
        augmentation."""
        spc = [len(m) for m in self.members]
        replication = max(
            (math.ceil(int(n) / s) for n, s in zip(counts, spc, strict=True) if s),
            default=0,
        )
        repeats = replication > 1
        return {
            "mode": "cycle",
            "unique_base_samples": int(self.images.shape[0]),
            "spc": spc[0] if len(set(spc)) == 1 else spc,
            "replication_factor": replication,
            "augmented": bool(self.augment_replicas and repeats),
            "note": (
                "PSG releases a small synthetic set; images cycle through it per class"
                + (
                    ", repeats carry a seeded random shift/rescale/rotation"
                    if self.augment_replicas and repeats
                    else (", repeats are exact copies" if repeats else "")
                )
                + " (distribution metrics such as FID see at most unique_base_samples images)"
            ),
        }
