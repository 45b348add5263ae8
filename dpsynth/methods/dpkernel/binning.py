"""DP-Kernel's binned numbers: a public per-record re-encoding of a table for the kernel.

In the table encoding (`dpsynth.data.table_codec`) a number is one value in [-1, 1]. Under the MMD
with a Gaussian kernel as wide as that whole range, the repulsion between the few generated
points drives generated numbers to the bounds: half of them at their min or max without any
noise, against 1% of real values (bench/results/2026-11-23-tuning-logs/tuning-tables.md). With
`number_bins` = K, the kernel sees each number as the one-hot of K equal-width bins of [-1, 1]
instead (the public [min, max] cut into K equal bins), like a categorical column: all bins are
equally far apart. The generator then outputs a softmax block per number, and sampling draws a
bin from that block and a value uniformly inside it.

Privacy: the re-encoding is a fixed public function applied to each record on its own, so the
kernel of any two records is still at most 1 and the mechanism's sensitivity is unchanged;
sampling is post-processing with the public sampling seed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from dpsynth.data.images import DataInfo
from dpsynth.data.table_codec import block_layout


class NumberBins:
    """The map between a table's encoded rows [b, D] and the kernel's binned rows [b, D']."""

    def __init__(self, layout: Sequence[tuple[str, int]], bins: int) -> None:
        self.bins = int(bins)
        keep_source, keep_target, number_source, number_target = [], [], [], []
        binned: list[tuple[str, int]] = []
        source = target = 0
        for kind, size in layout:
            if kind == "tanh":  # one number per tanh column
                number_source.append(source)
                number_target.append(target)
                binned.append(("softmax", self.bins))
                target += self.bins
            else:
                keep_source.extend(range(source, source + size))
                keep_target.extend(range(target, target + size))
                binned.append((kind, size))
                target += size
            source += size
        self.layout: tuple[tuple[str, int], ...] = tuple(binned)
        self.source_dim, self.dim = source, target
        self.keep_source = torch.tensor(keep_source, dtype=torch.int64)
        self.keep_target = torch.tensor(keep_target, dtype=torch.int64)
        self.number_source = torch.tensor(number_source, dtype=torch.int64)
        # [numbers, K]: the binned columns of each number's block
        self.number_blocks = torch.tensor(number_target, dtype=torch.int64)[:, None] + torch.arange(
            self.bins
        )
        self._indices: dict[torch.device, tuple[torch.Tensor, ...]] = {}

    def _on(self, device: torch.device) -> tuple[torch.Tensor, ...]:
        """The index tensors on `device`, copied once per device (encode runs every step)."""
        if device not in self._indices:
            tensors = (self.keep_source, self.keep_target, self.number_source, self.number_blocks)
            self._indices[device] = tuple(t.to(device) for t in tensors)
        return self._indices[device]

    def encode(self, rows: torch.Tensor) -> torch.Tensor:
        """Encoded rows [b, D] → binned rows [b, D'] (numbers as one-hot bins)."""
        device = rows.device
        keep_source, keep_target, number_source, blocks = self._on(device)
        out = torch.zeros(rows.shape[0], self.dim, dtype=rows.dtype, device=device)
        out[:, keep_target] = rows[:, keep_source]
        numbers = rows[:, number_source]
        index = ((numbers + 1.0) / 2.0 * self.bins).floor().clamp(0, self.bins - 1).long()
        # blocks [numbers, K]: the binned column of each number's bin
        out.scatter_(1, blocks[torch.arange(len(blocks), device=device), index], 1.0)
        return out

    def decode(self, rows: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Generated binned rows [b, D'] → encoded rows [b, D]: each number's bin drawn from
        its block (read as a distribution) and its value uniform inside the bin, from
        `generator` (the public sampling stream)."""
        rows = rows.detach().float().cpu()
        out = torch.zeros(rows.shape[0], self.source_dim)
        out[:, self.keep_source] = rows[:, self.keep_target]
        if not len(self.number_source):
            return out
        weights = rows[:, self.number_blocks].clamp_min(0.0)  # [b, numbers, K]
        totals = weights.sum(-1, keepdim=True)
        weights = torch.where(totals > 0, weights / totals.clamp_min(1e-30), 1.0 / self.bins)
        # drawn on the generator's own device (a CUDA generator cannot fill a CPU tensor)
        draws = torch.rand((*weights.shape[:2], 2), generator=generator, device=generator.device)
        draws = draws.cpu()
        chosen = (weights.cumsum(-1) < draws[..., :1]).sum(-1).clamp_max(self.bins - 1)
        inside = draws[..., 1]
        out[:, self.number_source] = -1.0 + (chosen + inside) * (2.0 / self.bins)
        return out


def number_bins(info: DataInfo, config: Mapping[str, Any]) -> NumberBins | None:
    """The run's binned re-encoding (None for images, or `number_bins` 0: numbers as values)."""
    bins = int(config.get("number_bins", 0))
    if info.modality != "table" or bins <= 0:
        return None
    return NumberBins(block_layout(info), bins)
