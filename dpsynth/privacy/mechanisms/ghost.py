"""Ghost-norm / book-keeping clipping: DP-SGD's clipped sum without per-record gradients.

For a network built from layers whose weight gradient is a product of the layer's input
activation `a` and the gradient `g` of the loss w.r.t. the layer's output (Linear, Conv1d/2d,
the affine parameters of GroupNorm/InstanceNorm/LayerNorm, Embedding), each record's gradient
norm follows from `a` and `g` alone, and so does the sum of the clipped gradients:

1. one forward pass of the whole batch records every supported layer's input and output
   (forward hooks), and the per-record losses come out of `batch_loss_fn`;
2. ONE backward pass gives the output gradients g (autograd w.r.t. the recorded outputs;
   no parameter gradient is formed);
3. per record and layer, ‖∂ℓ_i/∂W‖² from (a_i, g_i): for a Linear on a sequence (or a
   convolution over its unfolded input) either by the Gram trick Σ_ts (a a^T)_ts (g g^T)_ts
   ("ghost norm", Goodfellow 2015; Li et al. 2022) or by forming the record's layer gradient
   (for a convolution with the framework's weight-gradient kernel, the batch folded into the
   groups), whichever needs fewer operations; the record's norm is the root of the sum over
   all layers;
4. with c_i = min(1, C / (‖∂ℓ_i‖ + 1e-6)), each parameter's clipped sum Σ_i c_i ∂ℓ_i/∂W is
   formed from the stored a and c·g ("book-keeping", Bu et al. 2023): one weight-gradient
   kernel per layer, no second backward pass.

The result equals `dpsgd`'s vmap path (per-record gradients, clip, sum) up to float rounding;
this module adds no noise: `dpsgd.PrivateGradient` adds the one draw to what it returns.

What it needs (checked; `unsupported_reasons` and `GhostError` say what failed):
- every trainable parameter belongs to a supported layer (no shared parameters), and each
  such layer is called at most once per forward pass, and nothing it saw or produced is
  modified in place afterwards;
- `batch_loss_fn(*batch)` returns the per-record losses [B], each a function of its own
  record's network outputs only (no BatchNorm, no loss that differentiates w.r.t. the input
  such as score matching: those keep the vmap path).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch import Tensor, nn

from dpsynth.privacy.mechanisms.ghost_layers import NORM_LAYERS, Layer, rules_for

__all__ = [
    "BatchLossFn",
    "GhostError",
    "ghost_clipped_sum",
    "unsupported_reasons",
]

BatchLossFn = Callable[..., Tensor]
"""`batch_loss_fn(*batch) -> Tensor [B]`: each record's loss, calling the module itself."""

_NORM_EPS = 1e-6  # the same slack as dpsgd's clip factor min(1, C / (norm + 1e-6))


# Leaf module types whose output for a record depends on that record alone (with the
# argument checks of `_mixes_records`). A parameter-free operation that mixes the records of
# a batch (a batch mean, attention across the batch) would make ghost norms wrong without
# breaking any rule above, so `auto` takes ghost clipping only when every leaf is one of
# these; what a container's own forward does is checked by `privacy.ghost_check` instead.
PER_RECORD_MODULES: tuple[type[nn.Module], ...] = (
    nn.Linear, nn.Conv1d, nn.Conv2d, nn.Embedding, *NORM_LAYERS,
    nn.Identity, nn.Flatten, nn.Unflatten, nn.Sequential, nn.ModuleList, nn.ModuleDict,
    nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.ELU, nn.SELU, nn.CELU, nn.GELU, nn.SiLU, nn.Mish,
    nn.Sigmoid, nn.Tanh, nn.Hardtanh, nn.Hardswish, nn.Hardsigmoid, nn.Softplus,
    nn.Softsign, nn.Tanhshrink, nn.LogSigmoid, nn.Softmax, nn.LogSoftmax,
    nn.MaxPool1d, nn.MaxPool2d, nn.AvgPool1d, nn.AvgPool2d, nn.AdaptiveAvgPool1d,
    nn.AdaptiveAvgPool2d, nn.AdaptiveMaxPool1d, nn.AdaptiveMaxPool2d, nn.Upsample,
    nn.PixelShuffle, nn.PixelUnshuffle, nn.ZeroPad2d, nn.ConstantPad1d, nn.ConstantPad2d,
    nn.ReflectionPad1d, nn.ReflectionPad2d, nn.ReplicationPad1d, nn.ReplicationPad2d,
)  # fmt: skip


def _mixes_records(module: nn.Module) -> bool:
    """An allow-listed type configured to act across the batch dimension."""
    if isinstance(module, (nn.Softmax, nn.LogSoftmax)):
        return module.dim in (0, None)  # None: torch picks dim 0 for some ranks
    if isinstance(module, nn.Flatten):
        return module.start_dim == 0
    if isinstance(module, nn.Unflatten):
        return module.dim == 0
    return False


def unvouched_modules(model: nn.Module) -> list[str]:
    """Leaf modules not known to act record by record (`PER_RECORD_MODULES`), by name."""
    found = []
    for name, module in model.named_modules():
        if any(True for _ in module.children()):
            continue  # a container: its forward is checked empirically (ghost_check)
        if type(module) not in PER_RECORD_MODULES or _mixes_records(module):
            found.append(f"{name or '<model>'} ({type(module).__name__})")
    return found


class GhostError(RuntimeError):
    """The model or the loss does not meet what ghost clipping needs (see the module doc)."""


def _layer_problem(module: nn.Module) -> str | None:
    """Why ghost clipping cannot handle this layer's own parameters (None: it can)."""
    kind = type(module)  # exact types: a subclass may change what forward computes
    if kind is nn.Linear:
        return None
    if kind in (nn.Conv1d, nn.Conv2d):
        return None
    if kind in (nn.GroupNorm, nn.LayerNorm):
        return None
    if kind in (nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d):
        return "running statistics" if module.track_running_stats else None
    if kind is nn.Embedding:
        if module.max_norm is not None or module.scale_grad_by_freq or module.sparse:
            return "max_norm, scale_grad_by_freq or sparse"
        return None
    return "no ghost-norm rule for this layer"


def _trainable_own(module: nn.Module) -> dict[str, Tensor]:
    """The module's own (not its children's) trainable parameters."""
    return {n: p for n, p in module._parameters.items() if p is not None and p.requires_grad}


def unsupported_reasons(model: nn.Module) -> list[str]:
    """Why `model` cannot use ghost clipping, one line per problem (empty: it can)."""
    reasons: list[str] = []
    seen: dict[int, str] = {}
    for name, module in model.named_modules(remove_duplicate=False):
        own = _trainable_own(module)
        label = f"{name or '<model>'} ({type(module).__name__})"
        for pname, p in own.items():
            if id(p) in seen and seen[id(p)] != f"{name}.{pname}":
                reasons.append(f"{label}: parameter {pname} is shared with {seen[id(p)]}")
            seen.setdefault(id(p), f"{name}.{pname}")
        if own:
            problem = _layer_problem(module)
            if problem:
                reasons.append(f"{label}: {problem}")
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            # batch statistics mix the records even without trained parameters: a record's
            # output gradient would then depend on the others
            reasons.append(f"{label}: BatchNorm mixes the records of a batch")
    reasons += [f"{leaf}: not known to act record by record" for leaf in unvouched_modules(model)]
    return sorted(set(reasons))


# --------------------------------------------------------------------------- the pass


def _layers_of(model: nn.Module) -> dict[str, Layer]:
    """Every module with trainable parameters (all supported: checked by the caller)."""
    layers: dict[str, Layer] = {}
    for name, module in model.named_modules():
        own = _trainable_own(module)
        if own:
            layers[name] = Layer(module, own)
    return layers


def ghost_clipped_sum(
    model: nn.Module,
    batch_loss_fn: BatchLossFn,
    batch: tuple[Tensor, ...],
    max_norm: float,
    check_uses: bool = True,
    layer_sq_norms: dict[str, Tensor] | None = None,
) -> tuple[dict[str, Tensor], Tensor, Tensor]:
    """Σ_i clip(∂ℓ_i/∂θ) over the batch, without per-record gradients of the whole model.

    `check_uses` walks the autograd graph to check that each trained parameter enters it only
    through its own layer's (hooked) call; a caller may skip it once a model passed it.
    `layer_sq_norms`, when given, receives each called layer's squared per-record norms [B]
    by module name (for `privacy.ghost_check`).

    Returns (clipped sums keyed like `model.named_parameters()`, trainable ones only; the
    per-record norms before clipping [B]; the per-record losses [B], detached). Raises
    `GhostError` when the model or the loss breaks a requirement of the module doc.
    """
    layers = _layers_of(model)
    handles = []

    def record(layer: Layer):
        def hook(module: nn.Module, inputs: tuple, output: Tensor) -> None:
            a = inputs[0]
            layer.calls.append((a, output, a._version, output._version))

        return hook

    try:
        for layer in layers.values():
            handles.append(layer.module.register_forward_hook(record(layer)))
        with torch.enable_grad():  # the output gradients need the graph, even under no_grad
            losses = batch_loss_fn(*batch)
    finally:
        for handle in handles:
            handle.remove()
    size = int(batch[0].shape[0])
    if losses.shape != (size,):
        raise GhostError(
            f"batch_loss_fn must return one loss per record, shape ({size},), "
            f"got {tuple(losses.shape)}"
        )
    used = {name: layer for name, layer in layers.items() if layer.calls}
    for name, layer in used.items():
        if len(layer.calls) > 1:
            raise GhostError(f"{name} is called {len(layer.calls)} times in one forward pass")
        a, out, a_version, out_version = layer.calls[0]
        if a._version != a_version or out._version != out_version:
            raise GhostError(f"the input or output of {name} is modified in place")
    if check_uses:
        _check_parameter_uses(losses, layers)
    outputs = [layer.calls[0][1] for layer in used.values()]
    grads = (
        torch.autograd.grad(losses.sum(), outputs, allow_unused=True, materialize_grads=True)
        if outputs
        else []
    )
    sq = losses.new_zeros(size, dtype=_param_dtype(layers))
    for (name, layer), g in zip(used.items(), grads, strict=True):
        norms_fn, _ = rules_for(layer.module)
        layer_sq = norms_fn(layer, layer.calls[0][0].detach(), g.detach())
        if layer_sq_norms is not None:
            layer_sq_norms[name] = layer_sq.detach()
        sq = sq + layer_sq
    norms = sq.clamp(min=0).sqrt()
    factors = (max_norm / (norms + _NORM_EPS)).clamp(max=1.0)
    grad_of = dict(zip(used, grads, strict=True))
    summed: dict[str, Tensor] = {}
    for name, layer in layers.items():
        if layer.calls:
            _, sum_fn = rules_for(layer.module)
            g = grad_of[name].detach()
            parts = sum_fn(layer, layer.calls[0][0].detach(), g, factors.to(g.dtype))
        else:  # a layer this loss never calls: its gradient is zero
            parts = {}
        for pname, p in layer.params.items():
            part = parts.get(pname)
            summed[f"{name}.{pname}" if name else pname] = (
                part.to(p.dtype) if part is not None else torch.zeros_like(p)
            )
    return _in_model_order(model, summed), norms.detach(), losses.detach()


def _check_parameter_uses(losses: Tensor, layers: Mapping[str, Layer]) -> None:
    """Each trained parameter must enter the graph once per call of its layer and no other
    way (e.g. `F.linear(x, self.lin.weight)` in a parent's forward would escape the hooks)."""
    uses: dict[int, int] = {}
    seen: set = set()
    stack = [losses.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        for child, _ in node.next_functions:
            if child is None:
                continue
            variable = getattr(child, "variable", None)  # an AccumulateGrad: a leaf's use
            if variable is not None:
                uses[id(variable)] = uses.get(id(variable), 0) + 1
            else:
                stack.append(child)
    for name, layer in layers.items():
        for pname, p in layer.params.items():
            if uses.get(id(p), 0) != len(layer.calls):
                raise GhostError(
                    f"parameter {name}.{pname} is used outside its layer's forward "
                    f"({uses.get(id(p), 0)} uses, {len(layer.calls)} calls)"
                )


def _param_dtype(layers: Mapping[str, Layer]) -> torch.dtype:
    for layer in layers.values():
        for p in layer.params.values():
            return p.dtype
    return torch.float32


def _in_model_order(model: nn.Module, summed: dict[str, Tensor]) -> dict[str, Tensor]:
    """`summed` in the order of `model.named_parameters()` (the noise draw's order)."""
    return {name: summed[name] for name, _ in model.named_parameters() if name in summed}
