"""DP-SGD core: Poisson batches, per-record gradients, clipping and calibrated Gaussian noise.

The privacy argument of a training run rests on this module doing exactly what the
accountant assumes for a `poisson_gaussian` event:

- each record joins each step's batch independently with probability q (`PoissonSampler`);
  an empty batch is still a step;
- each record's gradient, flattened over ALL trainable parameters, is clipped to L2 norm
  ≤ C, so adding or removing one record moves the sum by at most C;
- ONE Gaussian draw of std σ·C per coordinate is added to the clipped sum;
- the result is divided by the expected batch size qN, a public constant (dividing by the
  realised size would leak it).

Per-record gradients (`privacy/mechanisms/per_record.py`) use `torch.func` (vmap over grad), never a
Python loop over records,
so losses that themselves differentiate w.r.t. the input (score matching) work too. Where
the loss is a plain function of the network's outputs and every trained layer has a
ghost-norm rule, `grad_mode="ghost"` (or `"auto"`) gets the same clipped sum from layer
activations and output gradients without forming per-record gradients
(`dpsynth.privacy.mechanisms.ghost`); the noise is added here either way.

Data-parallel (under `torchrun`, see `dpsynth.privacy.mechanisms.distributed`): every rank passes
the same global batch; each clips and sums its strided share, the partial sums are all-reduced
and rank 0's share alone carries the one noise draw, so the released gradient is the one of
a single process on the same batch and noise.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn
from torch.func import vmap

from dpsynth.errors import UsageError
from dpsynth.privacy.mechanisms.distributed import (
    all_reduce_sum,
    is_data_parallel,
    noisy_partial,
    shard,
)
from dpsynth.privacy.mechanisms.ghost import (
    BatchLossFn,
    GhostError,
    ghost_clipped_sum,
    unsupported_reasons,
)
from dpsynth.privacy.mechanisms.ghost_check import GhostFallbackWarning, ghost_disagreement
from dpsynth.privacy.mechanisms.per_record import (
    LossFn,
    clip_per_sample,
    clipped_sum,
    compiled_per_sample_grads,
    functional_state,
    per_sample_grads,
    per_sample_grads_and_losses,
    per_sample_norms,
)

__all__ = [
    "GRAD_MODES",
    "BatchLossFn",
    "LossFn",
    "PrivateGradient",
    "add_noise",
    "clip_per_sample",
    "functional_state",
    "noisy_global_sum",
    "per_sample_grads",
    "per_sample_norms",
]

GRAD_MODES = ("auto", "vmap", "ghost")
"""How `PrivateGradient` forms the clipped sum: `vmap` per-record gradients, `ghost` norms
from activations (needs `batch_loss_fn` and supported layers), `auto` ghost where it can."""


def add_noise(
    summed: Mapping[str, Tensor], std: float, generator: torch.Generator
) -> dict[str, Tensor]:
    """`summed` plus ONE N(0, std²) draw per coordinate from `generator`.

    All coordinates come from a single draw on the generator's device (moved to each
    tensor's device), in the order of `summed`, so a seed fixes the noise exactly.
    """
    if std < 0 or not math.isfinite(std):
        raise UsageError(f"noise std must be finite and ≥ 0, got {std}")
    tensors = list(summed.values())
    if not tensors:
        return {}
    dtype = _widest_float(tensors)
    total = sum(t.numel() for t in tensors)
    flat = torch.randn(total, generator=generator, device=generator.device, dtype=dtype)
    flat = flat * std
    out: dict[str, Tensor] = {}
    for (name, t), piece in zip(
        summed.items(), flat.split([t.numel() for t in tensors]), strict=True
    ):
        out[name] = t + piece.view_as(t).to(device=t.device, dtype=t.dtype)
    return out


def noisy_global_sum(
    partial: Mapping[str, Tensor], std: float, generator: torch.Generator
) -> dict[str, Tensor]:
    """The sum of `partial` over all ranks plus ONE N(0, std²) draw per coordinate.

    Every rank draws the same noise from its copy of the stream (keeping the streams in
    lockstep); only rank 0 adds it before the all-reduce. In one process: `add_noise`.
    """
    noisy = add_noise(partial, std, generator)
    if not is_data_parallel():
        return noisy
    return all_reduce_sum({name: noisy_partial(partial[name], noisy[name]) for name in partial})


def _widest_float(tensors: list[Tensor]) -> torch.dtype:
    """The widest floating dtype among `tensors` (float32 if none is floating)."""
    dtypes = [t.dtype for t in tensors if t.is_floating_point()]
    if not dtypes:
        return torch.float32
    return max(dtypes, key=lambda d: torch.finfo(d).bits)


class PrivateGradient:
    """Writes a DP-SGD gradient into each trainable parameter's `.grad`.

    `compute(*batch)` takes one Poisson batch (tensors with a common leading dim B ≥ 0),
    computes each record's gradient of `loss_fn`, clips it to `max_grad_norm`, sums, adds
    Gaussian noise of std `noise_multiplier * max_grad_norm` per coordinate from
    `generator`, and divides by `expected_batch_size`. Any torch optimizer can then step.

    `grad_mode` picks how the clipped sum is formed (`GRAD_MODES`): `vmap` (per-record
    gradients of `loss_fn`; any loss, including ones that differentiate w.r.t. the input),
    `ghost` (`dpsynth.privacy.mechanisms.ghost`: per-record norms from layer activations and output
    gradients, then the clipped sum from the same; needs `batch_loss_fn(*batch)` returning
    the per-record losses [B] from a plain call of `model`, and only supported layers
    holding trainable parameters; refused otherwise), or `auto` (default: ghost when
    `batch_loss_fn` is given and every trainable layer is supported, else vmap; a ghost
    requirement found broken at run time switches it to vmap for good). Both give the same
    clipped sum up to float rounding; `active_mode` says which one runs. `compile_vmap=True`
    wraps the vmap function in `torch.compile` (opt-in: compilation costs time up front).

    `micro_batch_size` processes the batch in chunks (each chunk's gradients are clipped and
    added to the sum right away), so memory is bounded by the chunk, not the batch; the
    result is the same. `private=False` is the non-private baseline: the plain mean gradient
    over the realised batch, no clipping and no noise.

    Under an initialised process group of W > 1 ranks every rank must call `compute` with
    the same global batch: each rank works on its strided share, and every rank gets the
    gradient (and the stats) of the whole batch with exactly one noise draw.
    """

    def __init__(
        self,
        model: nn.Module,
        loss_fn: LossFn,
        *,
        noise_multiplier: float,
        max_grad_norm: float,
        expected_batch_size: float,
        generator: torch.Generator,
        micro_batch_size: int | None = None,
        private: bool = True,
        batch_loss_fn: BatchLossFn | None = None,
        grad_mode: str = "auto",
        compile_vmap: bool = False,
    ) -> None:
        if private:
            if not (math.isfinite(noise_multiplier) and noise_multiplier >= 0):
                raise UsageError(f"noise multiplier must be finite and ≥ 0, got {noise_multiplier}")
            if not (math.isfinite(max_grad_norm) and max_grad_norm > 0):
                raise UsageError(f"max grad norm must be finite and > 0, got {max_grad_norm}")
            if not (math.isfinite(expected_batch_size) and expected_batch_size > 0):
                raise UsageError(
                    f"expected batch size must be finite and > 0, got {expected_batch_size}"
                )
        if micro_batch_size is not None and micro_batch_size < 1:
            raise UsageError(f"micro batch size must be ≥ 1, got {micro_batch_size}")
        self.model = model
        self.loss_fn = loss_fn
        self.noise_multiplier = float(noise_multiplier)
        self.max_grad_norm = float(max_grad_norm)
        self.expected_batch_size = float(expected_batch_size)
        self.generator = generator
        self.micro_batch_size = micro_batch_size
        self.private = private
        self.batch_loss_fn = batch_loss_fn
        self.grad_mode = grad_mode
        self.active_mode = _resolve_mode(model, batch_loss_fn, grad_mode)
        self._per_record_fn = compiled_per_sample_grads(loss_fn) if compile_vmap else None
        self._uses_checked = False
        # ghost norms are cross-checked against vmap once, on a batch of ≥ 2 records
        self._ghost_checked = False

    @property
    def noise_std(self) -> float:
        """Std of the noise added to the clipped SUM (before dividing by qN)."""
        return self.noise_multiplier * self.max_grad_norm

    def compute(self, *batch: Tensor) -> dict[str, float]:
        """Write the gradient of one batch into `.grad`; return monitoring stats.

        Stats (`batch_size`, `mean_loss`, `clip_fraction`, `mean_grad_norm`) are NOT
        differentially private: they are for the data owner's eyes and must not drive any
        decision (early stopping, tuning) or be released.
        """
        size = _batch_size(batch)  # the global batch's size: the stats are the whole batch's
        batch = shard(*batch)
        params, buffers = functional_state(self.model)
        if not self.private:
            grads, stats = self._mean_gradient(params, buffers, batch, size)
        else:
            grads, stats = self._private_gradient(params, buffers, batch, size)
        named = dict(self.model.named_parameters())
        for name, g in grads.items():
            named[name].grad = g.detach()
        return stats

    def _chunks(self, batch: tuple[Tensor, ...], size: int) -> list[tuple[Tensor, ...]]:
        step = self.micro_batch_size or max(size, 1)
        return [tuple(t[start : start + step] for t in batch) for start in range(0, size, step)]

    def _private_gradient(
        self,
        params: dict[str, Tensor],
        buffers: dict[str, Tensor],
        batch: tuple[Tensor, ...],
        size: int,
    ) -> tuple[dict[str, Tensor], dict[str, float]]:
        summed: dict[str, Tensor] | None = None
        # [loss sum, norm sum, clipped count], kept on the device: one sync per step, not per chunk
        totals = torch.zeros(3, dtype=torch.float64, device=_device_of(params))
        for chunk in self._chunks(batch, _batch_size(batch)):
            chunk_sum, norms, losses = self._clipped_chunk(params, buffers, chunk)
            if summed is None:  # the first chunk's sums are fresh tensors: no zeros + add
                summed = {name: chunk_sum[name] for name in params}
            else:
                for name, s in chunk_sum.items():
                    summed[name] += s
            totals += torch.stack(
                [losses.detach().sum(), norms.sum(), (norms > self.max_grad_norm).sum()]
            ).to(totals.dtype)
        if summed is None:  # an empty batch: the noise alone
            summed = {name: torch.zeros_like(p) for name, p in params.items()}
        noisy = noisy_global_sum(summed, self.noise_std, self.generator)
        grads_out = {name: g / self.expected_batch_size for name, g in noisy.items()}
        if is_data_parallel():
            totals = all_reduce_sum({"totals": totals})["totals"]
        loss_sum, norm_sum, clipped_count = totals.tolist()
        return grads_out, _stats(size, loss_sum, int(clipped_count), norm_sum)

    def _clipped_chunk(
        self, params: dict[str, Tensor], buffers: dict[str, Tensor], chunk: tuple[Tensor, ...]
    ) -> tuple[dict[str, Tensor], Tensor, Tensor]:
        """(Σ clipped gradients, per-record norms, per-record losses) of one chunk."""
        if self.active_mode == "ghost" and not self._ghost_checked:
            self._check_ghost(params, buffers, chunk)
        if self.active_mode == "ghost":
            try:
                out = ghost_clipped_sum(
                    self.model,
                    self.batch_loss_fn,
                    chunk,
                    self.max_grad_norm,
                    check_uses=not self._uses_checked,
                )
                self._uses_checked = True  # the graph walk once per PrivateGradient
                return out
            except GhostError as err:
                if self.grad_mode == "ghost":
                    raise UsageError(f"grad_mode ghost: {err}") from err
                self.active_mode = "vmap"  # auto: this model/loss needs per-record gradients
        if self._per_record_fn is not None:
            grads, losses = self._per_record_fn(dict(params), dict(buffers), *chunk)
        else:
            grads, losses = per_sample_grads_and_losses(self.loss_fn, params, buffers, chunk, None)
        chunk_sum, norms = clipped_sum(grads, self.max_grad_norm)
        return chunk_sum, norms, losses

    def _check_ghost(
        self, params: dict[str, Tensor], buffers: dict[str, Tensor], chunk: tuple[Tensor, ...]
    ) -> None:
        """The first-batch cross-check of ghost norms against vmap's (`privacy.ghost_check`):
        on a disagreement `auto` switches to vmap with a warning, `ghost` stops."""
        if _batch_size(chunk) < 2:
            return  # nothing can mix in a batch of one: check on a later batch

        def per_record_grads(records: tuple[Tensor, ...]) -> dict[str, Tensor]:
            return per_sample_grads_and_losses(self.loss_fn, params, buffers, records, None)[0]

        assert self.batch_loss_fn is not None
        try:
            problem = ghost_disagreement(self.model, self.batch_loss_fn, per_record_grads, chunk)
        except GhostError:
            problem = None  # the ghost pass itself refuses: handled where it runs
        self._ghost_checked = True
        if problem is None:
            return
        if self.grad_mode == "ghost":
            raise UsageError(f"grad_mode ghost: {problem}")
        warnings.warn(problem, GhostFallbackWarning, stacklevel=2)
        self.active_mode = "vmap"

    def _mean_gradient(
        self,
        params: dict[str, Tensor],
        buffers: dict[str, Tensor],
        batch: tuple[Tensor, ...],
        size: int,
    ) -> tuple[dict[str, Tensor], dict[str, float]]:
        summed = {name: torch.zeros_like(p) for name, p in params.items()}
        loss_sum = 0.0
        names = list(params)
        for chunk in self._chunks(batch, _batch_size(batch)):
            leaves = {name: p.detach().requires_grad_(True) for name, p in params.items()}
            in_dims = (None, None, *([0] * len(chunk)))
            losses = vmap(self.loss_fn, in_dims=in_dims)(leaves, buffers, *chunk)
            total = losses.sum()
            parts = torch.autograd.grad(
                total, [leaves[n] for n in names], allow_unused=True, materialize_grads=True
            )
            for name, g in zip(names, parts, strict=True):
                summed[name] += g
            loss_sum += float(total.detach())
        if is_data_parallel():  # the mean over the whole (global) batch
            loss = torch.tensor([loss_sum], dtype=torch.float64, device=_device_of(params))
            reduced = all_reduce_sum({**summed, "loss sum": loss})
            loss_sum = float(reduced.pop("loss sum"))
            summed = reduced
        scale = 1.0 / size if size else 0.0
        grads_out = {name: g * scale for name, g in summed.items()}
        return grads_out, _stats(size, loss_sum, 0, math.nan)


def _resolve_mode(model: nn.Module, batch_loss_fn: BatchLossFn | None, grad_mode: str) -> str:
    """The mode `PrivateGradient` starts in: "ghost" or "vmap" (see its doc)."""
    if grad_mode not in GRAD_MODES:
        raise UsageError(f"grad mode must be one of {', '.join(GRAD_MODES)}, got {grad_mode!r}")
    if grad_mode == "vmap":
        return "vmap"
    reasons = unsupported_reasons(model)
    if grad_mode == "ghost":
        if batch_loss_fn is None:
            raise UsageError("grad_mode ghost needs a batch_loss_fn (per-record losses [B])")
        if reasons:
            raise UsageError("grad_mode ghost cannot handle " + "; ".join(reasons))
        return "ghost"
    return "ghost" if batch_loss_fn is not None and not reasons else "vmap"


def _device_of(params: Mapping[str, Tensor]) -> torch.device:
    """The device of the first parameter (CPU for a model without trainable parameters)."""
    return next(iter(params.values())).device if params else torch.device("cpu")


def _batch_size(batch: tuple[Tensor, ...]) -> int:
    """The common leading dimension of the batch tensors."""
    if not batch:
        raise UsageError("a batch needs at least one tensor")
    sizes = {int(t.shape[0]) for t in batch}
    if len(sizes) != 1:
        raise UsageError(f"batch tensors disagree on the batch size: {sorted(sizes)}")
    return sizes.pop()


def _stats(size: int, loss_sum: float, clipped: int, norm_sum: float) -> dict[str, Any]:
    """Monitoring stats of one step (nan where the batch is empty)."""
    if size == 0:
        return {
            "batch_size": 0,
            "mean_loss": math.nan,
            "clip_fraction": math.nan,
            "mean_grad_norm": math.nan,
        }
    return {
        "batch_size": size,
        "mean_loss": loss_sum / size,
        "clip_fraction": clipped / size,
        "mean_grad_norm": norm_sum / size,
    }
