"""The first-step cross-check of ghost clipping against per-record gradients.

Ghost clipping (`dpsynth.privacy.mechanisms.ghost`) reads each record's gradient norm off ONE
batched forward and backward pass. That is the record's norm only if its loss depends on its own
record alone. The layer rules and the allow-list of leaf modules (`PER_RECORD_MODULES`)
cover what modules do, but a container's own `forward` is arbitrary code: `x - x.mean(0)`
or attention across the batch would mix the records, and the clipping would bound the wrong
quantity (so the noise would not cover one record's influence) without breaking any rule.

So `PrivateGradient` checks the batched pass once, on the first batch with at least two
records: ghost's per-layer norms of a few records computed together against each record's
own gradient (vmap, one record at a time, where nothing can mix). A disagreement beyond
float rounding means the batched pass mixes records: `auto` falls back to vmap for the rest
of the run (with a `GhostFallbackWarning` naming the layer), `ghost` stops with an error.
The check reads records the step reads anyway and releases nothing: it only chooses which
of two computations of the same clipped sum runs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch import Tensor, nn

from dpsynth.privacy.mechanisms.ghost import PER_RECORD_MODULES, BatchLossFn, ghost_clipped_sum

CHECK_RECORDS = 8
"""How many records of the first batch the check uses (at least 2 are needed)."""

_RTOL = 1e-3  # float32 rounding of the two computations is ~1e-5 relative
_ATOL = 1e-6


class GhostFallbackWarning(UserWarning):
    """Ghost clipping was found not to apply to a model; per-record gradients are used."""


def ghost_disagreement(
    model: nn.Module,
    batch_loss_fn: BatchLossFn,
    per_record_grads: Callable[[tuple[Tensor, ...]], Mapping[str, Tensor]],
    batch: tuple[Tensor, ...],
) -> str | None:
    """Why ghost norms cannot be trusted for `model` (None: they agree with vmap's).

    `per_record_grads(records)` returns each record's gradient by parameter name [B, ...],
    computed one record at a time. Uses the first `CHECK_RECORDS` records of `batch`.
    """
    records = tuple(t[:CHECK_RECORDS] for t in batch)
    ghost_sq: dict[str, Tensor] = {}
    ghost_clipped_sum(model, batch_loss_fn, records, max_norm=1.0, layer_sq_norms=ghost_sq)
    vmap_sq: dict[str, Tensor] = {}
    for name, grads in per_record_grads(records).items():
        layer = name.rpartition(".")[0]
        sq = grads.detach().flatten(1).double().pow(2).sum(1)
        vmap_sq[layer] = vmap_sq[layer] + sq if layer in vmap_sq else sq
    size = int(records[0].shape[0])
    scale = max((float(v.max()) for v in vmap_sq.values()), default=0.0) ** 0.5
    modules = dict(model.named_modules())
    for layer in sorted(set(ghost_sq) | set(vmap_sq), key=list(modules).index):
        zero = torch.zeros(size, dtype=torch.float64)
        ghost = ghost_sq.get(layer, zero).double().cpu().clamp(min=0).sqrt()
        vmap = vmap_sq.get(layer, zero).cpu().sqrt()
        slack = _RTOL * torch.maximum(ghost, vmap) + _ATOL * (1.0 + scale)
        if not torch.all((ghost - vmap).abs() <= slack):
            label = f"{layer or '<model>'} ({type(modules[layer]).__name__})"
            return (
                f"ghost clipping's gradient norms at layer {label} disagree with each record's "
                "own gradient: the batched forward pass mixes the records of a batch (in the "
                f"forward of {', '.join(_custom_modules(model)) or 'the loss'}); "
                "per-record gradients (vmap) are used instead"
            )
    return None


def _custom_modules(model: nn.Module) -> list[str]:
    """Modules whose forward is code dpsynth cannot vouch for (not in the allow-list)."""
    return [
        f"{name or '<model>'} ({type(module).__name__})"
        for name, module in model.named_modules()
        if type(module) not in PER_RECORD_MODULES
    ]
