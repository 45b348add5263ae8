"""`TeacherFilter`: a generator's samples chosen (and with `relabel` labelled) by a DP teacher.

Post-processing only: the teacher is a released DP model and the candidates come from the
backend's generator, so no record is read and nothing is charged. The caller asks for labels
in any order (`sample` asks for them sorted by class, so a batch is often one class): both
modes give every requested label c an image the teacher rates as c, whatever the batch holds.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import nn

from dpsynth.methods.base import Generator

# `relabel` draws rounds of candidates until each requested class has enough the teacher
# assigns to it, at most this many × classes / oversample rounds a batch (what a teacher that
# spreads its labels evenly needs); then `rank` fills the rest. A class the teacher seldom
# predicts must not multiply the sampling time (pge on digits28: 3.5× with 4).
RELABEL_ROUNDS_PER_CLASS = 1
# Candidates the teacher assigns to a class not asked for yet wait in that class's pool; all
# pools together hold at most this many bytes of images (least confident dropped first), so
# that nearly every candidate drawn is used and `relabel` costs about `teacher_oversample` ×
# the draws of the generator alone.
RELABEL_POOL_BYTES = 256 * 2**20


class TeacherFilter(Generator):
    """Post-processing of a generator's samples by a DP teacher (no data is read).

    `rank`: for each requested batch it draws `teacher_oversample` times as many candidates
    with the requested labels and keeps, for every label c, those with the highest teacher
    probability p(c | x): the teacher re-ranks what the generator made for c.

    `relabel`: candidates are drawn with labels spread over all classes and each is given the
    teacher's label (its argmax); every requested c is filled with candidates the teacher
    assigns to c, most confident first. Candidates assigned to a class not in the current
    batch wait in that class's pool for a later batch, also of a later `sample` call with the
    same random stream (`RELABEL_POOL_BYTES` in all, the most confident kept). If a class is
    still short after `RELABEL_ROUNDS_PER_CLASS` × classes / oversample rounds, `rank` fills
    the rest.
    """

    def __init__(self, base: Generator, teacher: nn.Module, config: Mapping[str, Any]) -> None:
        self.base = base
        self.teacher = teacher
        self.mode = str(config["teacher_filter"])
        self.oversample = float(config["teacher_oversample"])
        self.classes = base.classes
        self.shape = base.shape
        self.device = base.device
        # `relabel`'s pools live as long as the random stream they were drawn from: the
        # sampler calls `sample` once per chunk of labels with the same stream, and a chunk is
        # mostly one class, so what the teacher assigned to later classes must carry over.
        self._pools: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._pool_stream: torch.Generator | None = None

    @property  # type: ignore[override]
    def truncation(self) -> float | None:  # the base's latent scale (sample --truncation)
        return self.base.truncation

    @truncation.setter
    def truncation(self, value: float | None) -> None:
        self.base.truncation = value

    def sample(
        self, labels: torch.Tensor, batch_size: int, generator: torch.Generator
    ) -> Iterator[torch.Tensor]:
        """uint8 images for `labels`, in order, chosen by the teacher among candidates."""
        if generator is not self._pool_stream:  # a new stream: a new sampling session
            self._pools, self._pool_stream = {}, generator
        for start in range(0, len(labels), batch_size):
            wanted = labels[start : start + batch_size]
            if self.mode == "rank":
                yield self._ranked(wanted, batch_size, generator)
            else:
                yield self._relabelled(wanted, batch_size, generator)

    def _count(self, n: int) -> int:
        return max(n, math.ceil(self.oversample * n))

    def _ranked(
        self, wanted: torch.Tensor, batch_size: int, generator: torch.Generator
    ) -> torch.Tensor:
        count = self._count(len(wanted))
        candidates = wanted.repeat(math.ceil(count / len(wanted)))[:count]
        images = torch.cat(list(self.base.sample(candidates, batch_size, generator)))
        prob = self._probabilities(images)
        taken = torch.zeros(len(images), dtype=torch.bool, device=prob.device)
        out = torch.empty(len(wanted), *images.shape[1:], dtype=images.dtype)
        for c in wanted.unique().tolist():
            slots = (wanted == c).nonzero().flatten().cpu()
            score = prob[:, c].masked_fill(taken, -1.0)
            best = score.argsort(descending=True)[: len(slots)]
            taken[best] = True
            out[slots] = images[best.cpu()].cpu()
        return out

    def _relabelled(
        self, wanted: torch.Tensor, batch_size: int, generator: torch.Generator
    ) -> torch.Tensor:
        pools, k = self._pools, len(self.classes)
        need = {c: int((wanted == c).sum()) for c in wanted.unique().tolist()}
        image_bytes = math.prod(self.shape)
        cap = max(self._count(batch_size), RELABEL_POOL_BYTES // (k * image_bytes))
        rounds = math.ceil(RELABEL_ROUNDS_PER_CLASS * k / self.oversample)
        for _ in range(rounds):
            if all(len(pools.get(c, ((), ()))[1]) >= n for c, n in need.items()):
                break
            count = self._count(len(wanted))
            offset = int(torch.randint(k, (1,), generator=generator, device=generator.device))
            candidates = (torch.arange(count, device=wanted.device) + offset) % k
            images = torch.cat(list(self.base.sample(candidates, batch_size, generator)))
            confidence, assigned = self._probabilities(images).max(dim=1)
            for c in range(k):
                mine = (assigned == c).cpu()
                if bool(mine.any()):
                    _add_to_pool(pools, c, images[mine], confidence[mine].cpu(), cap)
        out = torch.empty(len(wanted), *self.shape, dtype=torch.uint8)
        for c, n in need.items():
            slots = (wanted == c).nonzero().flatten().cpu()
            images, confidence = pools.pop(c, (out[:0], torch.empty(0)))
            have = min(n, len(confidence))
            out[slots[:have]] = images[:have]
            if have < len(confidence):
                pools[c] = (images[have:], confidence[have:])
            if have < n:  # the teacher rarely calls anything c: the generator's own c's
                short = wanted[slots[have:].to(wanted.device)]
                out[slots[have:]] = self._ranked(short, batch_size, generator)
        return out

    @torch.inference_mode()
    def _probabilities(self, images: torch.Tensor) -> torch.Tensor:
        scores = []
        for start in range(0, len(images), 1024):
            chunk = images[start : start + 1024].to(self.device).float() / 127.5 - 1.0
            scores.append(torch.softmax(self.teacher(chunk), dim=1))
        return torch.cat(scores)  # [M, K]


def _add_to_pool(
    pools: dict[int, tuple[torch.Tensor, torch.Tensor]],
    c: int,
    images: torch.Tensor,
    confidence: torch.Tensor,
    cap: int,
) -> None:
    """Merge candidates the teacher assigns to class c into its pool, most confident first,
    keeping at most `cap` of them."""
    if c in pools:
        images = torch.cat([pools[c][0], images.cpu()])
        confidence = torch.cat([pools[c][1], confidence])
    order = confidence.argsort(descending=True)[:cap]
    pools[c] = (images.cpu()[order], confidence[order])
