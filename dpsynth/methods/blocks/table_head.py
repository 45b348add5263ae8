"""`TableHead`: the output activation of a generator of table rows.

A table's encoding (`dpsynth.data.table_codec`) is a sequence of blocks, one per feature
column: a one-hot block of k categories (`softmax`: the head outputs a distribution over them,
which decoding samples) or one scaled number in [-1, 1] (`tanh`). A backend that opts into
tables (`Method.modalities` includes "table") ends its generator with
`TableHead(block_layout(info))` on D = info.shape[0] raw outputs.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn


class TableHead(nn.Module):
    """Raw outputs [b, D] → encoded rows: softmax per categorical block, tanh per number."""

    def __init__(self, layout: Sequence[tuple[str, int]], hard: bool = False) -> None:
        super().__init__()
        # hard: each categorical block is the one-hot of its argmax in the forward pass, with the
        # softmax's gradient in the backward pass (straight-through), so generated rows are
        # single categories like the data's, not averages of them.
        self.hard = bool(hard)
        self.layout = tuple((str(kind), int(size)) for kind, size in layout)
        self.dim = sum(size for _, size in self.layout)
        numeric = torch.zeros(self.dim, dtype=torch.bool)
        start = 0
        for kind, size in self.layout:
            if kind not in ("softmax", "tanh"):
                raise ValueError(f"unknown table block kind {kind!r}")
            if kind == "tanh":
                numeric[start : start + size] = True
            start += size
        self.register_buffer("numeric", numeric, persistent=False)

    def forward(self, raw: torch.Tensor) -> torch.Tensor:
        """Encoded rows [b, D] (blocks as the layout says)."""
        parts, start = [], 0
        for kind, size in self.layout:
            chunk = raw[:, start : start + size]
            start += size
            if kind == "tanh":
                parts.append(torch.tanh(chunk))
                continue
            soft = torch.softmax(chunk, dim=1)
            if self.hard:
                hard = torch.nn.functional.one_hot(soft.argmax(1), size).to(soft.dtype)
                soft = hard - soft.detach() + soft
            parts.append(soft)
        return torch.cat(parts, dim=1)
