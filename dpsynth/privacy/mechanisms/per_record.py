"""Per-record gradients and their clipping, the first half of DP-SGD (`privacy/mechanisms/dpsgd.py`
adds the noise).

Per-record gradients use `torch.func` (vmap over grad), never a Python loop over records, so
losses that themselves differentiate w.r.t. the input (score matching) work too. Each
record's gradient is clipped as ONE vector over all trainable parameters: the L2 sensitivity
of the sum of clipped gradients is the clip norm C under add/remove of one record.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch import Tensor, nn
from torch.func import grad_and_value, vmap

__all__ = [
    "LossFn",
    "clip_per_sample",
    "clipped_sum",
    "compiled_per_sample_grads",
    "functional_state",
    "per_sample_grads",
    "per_sample_grads_and_losses",
    "per_sample_norms",
]

LossFn = Callable[..., Tensor]
"""`loss_fn(params, buffers, *record) -> scalar`: the loss of ONE record (no batch dim).

Call the model as `functional_call(model, (params, buffers), (x.unsqueeze(0),))`.
"""

_NORM_EPS = 1e-6  # the clip factor is min(1, C / (norm + 1e-6))


def functional_state(model: nn.Module) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """Split a model into (trainable params, everything else) as detached tensors.

    Frozen parameters go with the buffers so that `functional_call` still sees them while
    only trainable ones are differentiated (and clipped).
    """
    params: dict[str, Tensor] = {}
    fixed: dict[str, Tensor] = {}
    for name, p in model.named_parameters():
        (params if p.requires_grad else fixed)[name] = p.detach()
    for name, b in model.named_buffers():
        fixed[name] = b.detach()
    return params, fixed


def per_sample_grads_and_losses(
    loss_fn: LossFn,
    params: Mapping[str, Tensor],
    buffers: Mapping[str, Tensor],
    batch: tuple[Tensor, ...],
    chunk_size: int | None,
) -> tuple[dict[str, Tensor], Tensor]:
    """Per-record gradients (leading dim = batch) and per-record losses."""
    in_dims = (None, None, *([0] * len(batch)))
    fn = vmap(grad_and_value(loss_fn), in_dims=in_dims, chunk_size=chunk_size)
    grads, losses = fn(dict(params), dict(buffers), *batch)
    return grads, losses


def per_sample_grads(
    model: nn.Module,
    loss_fn: LossFn,
    batch: tuple[Tensor, ...],
    chunk_size: int | None = None,
) -> dict[str, Tensor]:
    """Each record's gradient of `loss_fn` w.r.t. every trainable parameter of `model`.

    Returns `{param name: tensor [B, *param.shape]}`. `chunk_size` bounds vmap's working
    memory (the result still holds all B gradients). Randomness the loss needs must be drawn
    by the caller from a seeded generator and passed in as batch tensors.
    """
    params, buffers = functional_state(model)
    grads, _ = per_sample_grads_and_losses(loss_fn, params, buffers, batch, chunk_size)
    return grads


def per_sample_norms(grads: Mapping[str, Tensor]) -> Tensor:
    """Each record's L2 norm over all parameters flattened together, shape [B]."""
    per_param = torch.stack([g.flatten(1).norm(dim=1) for g in grads.values()])
    return per_param.norm(dim=0)


def _clip_factors(norms: Tensor, max_norm: float) -> Tensor:
    """min(1, C / (norm + 1e-6)) per record."""
    return (max_norm / (norms + _NORM_EPS)).clamp(max=1.0)


def clip_per_sample(
    grads: Mapping[str, Tensor], max_norm: float
) -> tuple[dict[str, Tensor], Tensor]:
    """Scale each record's gradient so its flat L2 norm over all parameters is ≤ `max_norm`.

    Returns (clipped per-record gradients, the norms before clipping [B]).
    """
    norms = per_sample_norms(grads)
    factors = _clip_factors(norms, max_norm)
    clipped = {
        name: g * factors.view(-1, *([1] * (g.dim() - 1))).to(g.dtype) for name, g in grads.items()
    }
    return clipped, norms


def clipped_sum(grads: Mapping[str, Tensor], max_norm: float) -> tuple[dict[str, Tensor], Tensor]:
    """Σ_i clip(g_i) without materialising the clipped per-record copies; also the norms."""
    norms = per_sample_norms(grads)
    factors = _clip_factors(norms, max_norm)
    summed = {name: torch.tensordot(factors.to(g.dtype), g, dims=1) for name, g in grads.items()}
    return summed, norms


def compiled_per_sample_grads(loss_fn: LossFn) -> Callable[..., tuple[dict[str, Tensor], Tensor]]:
    """`torch.compile` of vmap(grad_and_value(loss_fn)) over the batch (params shared)."""

    def per_record(params: dict, buffers: dict, *batch: Tensor):
        in_dims = (None, None, *([0] * len(batch)))
        return vmap(grad_and_value(loss_fn), in_dims=in_dims)(params, buffers, *batch)

    return torch.compile(per_record, dynamic=True)
