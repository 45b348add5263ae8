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
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.modules.utils import _pair, _single

__all__ = [
    "BatchLossFn",
    "GhostError",
    "ghost_clipped_sum",
    "unsupported_reasons",
]

BatchLossFn = Callable[..., Tensor]
"""`batch_loss_fn(*batch) -> Tensor [B]`: each record's loss, calling the module itself."""

_NORM_EPS = 1e-6  # the same slack as dpsgd's clip factor min(1, C / (norm + 1e-6))

CONV_PER_RECORD = "grouped"
"""How a convolution's per-record weight gradients are formed where they are needed:
"grouped" (the backward kernel with the batch folded into the groups; faster on the CPU and
no unfolded copy) or "unfold" (unfold + batched matmul, as Opacus does). A tuning knob for
the GPU measurement (`bench/dpsgd.py` variant `dpsynth-ghost-unfold`); both are exact."""
_NORMS = (nn.GroupNorm, nn.LayerNorm, nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d)

# Leaf module types whose output for a record depends on that record alone (with the
# argument checks of `_mixes_records`). A parameter-free operation that mixes the records of
# a batch (a batch mean, attention across the batch) would make ghost norms wrong without
# breaking any rule above, so `auto` takes ghost clipping only when every leaf is one of
# these; what a container's own forward does is checked by `privacy.ghost_check` instead.
PER_RECORD_MODULES: tuple[type[nn.Module], ...] = (
    nn.Linear, nn.Conv1d, nn.Conv2d, nn.Embedding, *_NORMS,
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


# --------------------------------------------------------------------------- per-layer rules


@dataclass
class _Layer:
    """One supported layer's inputs, outputs and per-record pieces for one forward pass."""

    module: nn.Module
    params: dict[str, Tensor]  # local name → trainable parameter
    calls: list[tuple[Tensor, Tensor, int, int]] = field(default_factory=list)
    per_record: dict[str, Tensor] = field(default_factory=dict)  # materialised grads [B, ...]


def _sq_norms(rows: Tensor) -> Tensor:
    """‖row_i‖² of each record's flattened tensor (no squared copy of a large tensor)."""
    return torch.linalg.vector_norm(rows.flatten(1), dim=1).square()


def _linear_norms(layer: _Layer, a: Tensor, g: Tensor) -> Tensor:
    """Squared per-record norms of a Linear's weight/bias gradients from a [B,*,d], g [B,*,p]."""
    batch = a.shape[0]
    a3 = a.reshape(batch, -1, a.shape[-1])
    g3 = g.reshape(batch, -1, g.shape[-1])
    sq = a.new_zeros(batch)
    if "weight" in layer.params:
        sq = sq + _product_sq_norms(layer, "weight", g3, a3)
    if "bias" in layer.params:
        bias = g3.sum(1)
        layer.per_record["bias"] = bias
        sq = sq + bias.pow(2).sum(1)
    return sq


def _product_sq_norms(layer: _Layer, name: str, g3: Tensor, a3: Tensor) -> Tensor:
    """‖g_i^T a_i‖_F² per record for g [B,T,p], a [B,T,d]: Gram trick or materialised.

    The Gram trick costs B·T²·(p+d) operations, forming g_i^T a_i costs B·T·p·d (and B·p·d
    memory); the cheaper one is taken. A materialised gradient is kept for the sum.
    """
    steps, out_dim, in_dim = g3.shape[1], g3.shape[2], a3.shape[2]
    if steps == 1:
        return a3.pow(2).sum((1, 2)) * g3.pow(2).sum((1, 2))
    if steps * (out_dim + in_dim) < out_dim * in_dim:
        gram_a = torch.bmm(a3, a3.transpose(1, 2))
        gram_g = torch.bmm(g3, g3.transpose(1, 2))
        return (gram_a * gram_g).sum((1, 2))
    per_record = torch.bmm(g3.transpose(1, 2), a3)  # [B, p, d]
    layer.per_record[name] = per_record
    return _sq_norms(per_record)


def _linear_sum(layer: _Layer, a: Tensor, g: Tensor, factors: Tensor) -> dict[str, Tensor]:
    """Σ_i c_i ∂ℓ_i/∂(weight, bias) of a Linear from a, g and the clip factors c."""
    out: dict[str, Tensor] = {}
    if "weight" in layer.params:
        if "weight" in layer.per_record:
            out["weight"] = torch.tensordot(factors, layer.per_record["weight"], dims=1)
        else:
            scaled = g * factors.view(-1, *([1] * (g.dim() - 1)))
            out["weight"] = scaled.reshape(-1, g.shape[-1]).T @ a.reshape(-1, a.shape[-1])
    if "bias" in layer.params:
        out["bias"] = factors @ layer.per_record["bias"]
    return out


def _conv_geometry(module: nn.Module, a: Tensor) -> tuple[Tensor, dict]:
    """The conv's input as a 2-d image with explicit padding, and its 2-d geometry.

    Conv1d becomes a 1×L image; padding modes other than zeros and string paddings ('same',
    'valid') are applied to the input here, so unfold and the weight gradient see padding 0.
    """
    one_d = isinstance(module, nn.Conv1d)
    expand = _single if one_d else _pair
    kernel, stride, dilation = (
        expand(v) for v in (module.kernel_size, module.stride, module.dilation)
    )
    if module.padding_mode != "zeros":
        a = F.pad(a, module._reversed_padding_repeated_twice, mode=module.padding_mode)
        padding = expand(0)
    elif isinstance(module.padding, str):
        if module.padding == "valid":
            padding = expand(0)
        else:  # 'same': total dilation·(k − 1), the extra one on the right (as torch does)
            pads: list[int] = []
            for k, d in zip(reversed(kernel), reversed(dilation), strict=True):
                total = d * (k - 1)
                pads += [total // 2, total - total // 2]
            a = F.pad(a, pads)
            padding = expand(0)
    else:
        padding = expand(module.padding)
    if one_d:  # as a 1×L image
        a = a.unsqueeze(2)
        kernel, stride, dilation = (1, kernel[0]), (1, stride[0]), (1, dilation[0])
        padding = (0, padding[0])
    return a, {"kernel": kernel, "stride": stride, "dilation": dilation, "padding": padding}


def _conv_norms(layer: _Layer, a: Tensor, g: Tensor) -> Tensor:
    """Squared per-record norms of a Conv1d/2d's gradients.

    Per group, a record's weight gradient is g_i [p, L] times its unfolded input [L, d]: the
    Gram trick over the L positions when T·(p+d) < p·d, else the per-record gradients
    themselves, from the framework's weight-gradient kernel with the batch folded into the
    groups (faster than unfold + bmm and without the unfolded copy).
    """
    module = layer.module
    batch, groups = a.shape[0], module.groups
    sq = a.new_zeros(batch)
    g_flat = g.reshape(batch, g.shape[1], -1)  # [B, Cout, L]
    if "weight" in layer.params:
        weight = layer.params["weight"]
        image, geo = _conv_geometry(module, a)
        positions = g_flat.shape[-1]
        out_dim = weight.shape[0] // groups
        in_dim = weight[0].numel()
        gram = positions * (out_dim + in_dim) < out_dim * in_dim
        if gram or CONV_PER_RECORD == "unfold":
            cols = F.unfold(
                image,
                geo["kernel"],
                dilation=geo["dilation"],
                padding=geo["padding"],
                stride=geo["stride"],
            ).view(batch, groups, in_dim, positions)
            grads = g_flat.view(batch, groups, out_dim, positions)
            if gram:
                gram_a = torch.matmul(cols.transpose(2, 3), cols)  # [B, G, L, L]
                gram_g = torch.matmul(grads.transpose(2, 3), grads)
                sq = sq + (gram_a * gram_g).sum((1, 2, 3))
            else:
                per_record = torch.matmul(grads, cols.transpose(2, 3))  # [B, G, p, d]
                per_record = per_record.reshape(batch, *weight.shape)
                layer.per_record["weight"] = per_record
                sq = sq + _sq_norms(per_record)
        else:
            g4 = g.unsqueeze(2) if g.dim() == 3 else g  # Conv1d: as a 1×L image
            per_record = _conv_weight_grad(
                image.reshape(1, -1, *image.shape[2:]),  # the batch folded into the channels
                g4.reshape(1, -1, *g4.shape[2:]),
                (batch * weight.shape[0], weight.shape[1], *geo["kernel"]),
                geo,
                batch * groups,
            )
            per_record = per_record.view(batch, *weight.shape)
            layer.per_record["weight"] = per_record
            sq = sq + _sq_norms(per_record)
    if "bias" in layer.params:
        bias = g_flat.sum(2)
        layer.per_record["bias"] = bias
        sq = sq + bias.pow(2).sum(1)
    return sq


def _conv_weight_grad(
    image: Tensor, g: Tensor, shape: tuple[int, ...], geo: dict, groups: int
) -> Tensor:
    """The weight gradient of a 2-d convolution (the framework's backward kernel)."""
    weight = g.new_empty(1).expand(shape)  # only its shape is read
    _, grad_weight, _ = torch.ops.aten.convolution_backward(
        g,
        image,
        weight,
        None,
        list(geo["stride"]),
        list(geo["padding"]),
        list(geo["dilation"]),
        False,
        [0, 0],
        groups,
        [False, True, False],
    )
    return grad_weight


def _conv_sum(layer: _Layer, a: Tensor, g: Tensor, factors: Tensor) -> dict[str, Tensor]:
    """Σ_i c_i ∂ℓ_i/∂(weight, bias) of a conv: the framework's weight-gradient kernel on c·g."""
    module = layer.module
    out: dict[str, Tensor] = {}
    if "weight" in layer.params:
        if "weight" in layer.per_record:
            out["weight"] = torch.tensordot(factors, layer.per_record["weight"], dims=1)
        else:
            image, geo = _conv_geometry(module, a)
            scaled = g * factors.view(-1, *([1] * (g.dim() - 1)))
            weight = layer.params["weight"]
            if scaled.dim() == 3:  # Conv1d: as a 1×L image
                scaled = scaled.unsqueeze(2)
            shape = (*weight.shape[:2], *geo["kernel"])
            out["weight"] = _conv_weight_grad(image, scaled, shape, geo, module.groups).view(
                weight.shape
            )
    if "bias" in layer.params:
        out["bias"] = factors @ layer.per_record["bias"]
    return out


def _normalised(module: nn.Module, a: Tensor) -> Tensor:
    """The norm layer's input normalised without its affine part (x̂)."""
    if isinstance(module, nn.GroupNorm):
        return F.group_norm(a, module.num_groups, eps=module.eps)
    if isinstance(module, nn.LayerNorm):
        return F.layer_norm(a, module.normalized_shape, eps=module.eps)
    return F.instance_norm(a, eps=module.eps)


def _norm_layer_norms(layer: _Layer, a: Tensor, g: Tensor) -> Tensor:
    """Per-record affine gradients of a normalisation layer, materialised (they are small)."""
    module = layer.module
    if isinstance(module, nn.LayerNorm):
        kept = len(module.normalized_shape)
        dims = tuple(range(1, g.dim() - kept))  # sum over the positions, keep the normalised shape
    else:
        dims = tuple(range(2, g.dim()))  # keep the channels
    sq = a.new_zeros(a.shape[0])
    if "weight" in layer.params:
        with torch.no_grad():
            x_hat = _normalised(module, a)
        layer.per_record["weight"] = (g * x_hat).sum(dims) if dims else g * x_hat
    if "bias" in layer.params:
        layer.per_record["bias"] = g.sum(dims) if dims else g
    for name in layer.params:
        sq = sq + _sq_norms(layer.per_record[name])
    return sq


def _materialised_sum(layer: _Layer, a: Tensor, g: Tensor, factors: Tensor) -> dict[str, Tensor]:
    return {name: torch.tensordot(factors, layer.per_record[name], dims=1) for name in layer.params}


def _embedding_parts(layer: _Layer, a: Tensor, g: Tensor) -> tuple[Tensor, Tensor]:
    """Indices [B, T] and output gradients [B, T, d], with padding_idx's rows zeroed."""
    batch = a.shape[0]
    idx = a.reshape(batch, -1)
    g3 = g.reshape(batch, idx.shape[1], -1)
    if layer.module.padding_idx is not None:  # torch never updates the padding row
        g3 = g3 * (idx != layer.module.padding_idx).unsqueeze(2).to(g3.dtype)
    return idx, g3


def _embedding_norms(layer: _Layer, a: Tensor, g: Tensor) -> Tensor:
    """‖Σ_t e_{idx_t} g_t^T‖² per record: Gram of g over equal indices (or a dense [B,V,d])."""
    idx, g3 = _embedding_parts(layer, a, g)
    batch, steps = idx.shape
    vocab = layer.module.num_embeddings
    if vocab <= steps * steps:
        dense = g3.new_zeros(batch * vocab, g3.shape[2])
        rows = (idx + vocab * torch.arange(batch, device=idx.device).unsqueeze(1)).flatten()
        dense.index_add_(0, rows, g3.reshape(-1, g3.shape[2]))
        layer.per_record["weight"] = dense.view(batch, vocab, -1)
        return _sq_norms(dense.view(batch, -1))
    same = (idx.unsqueeze(2) == idx.unsqueeze(1)).to(g3.dtype)
    return (torch.bmm(g3, g3.transpose(1, 2)) * same).sum((1, 2))


def _embedding_sum(layer: _Layer, a: Tensor, g: Tensor, factors: Tensor) -> dict[str, Tensor]:
    if "weight" in layer.per_record:
        return {"weight": torch.tensordot(factors, layer.per_record["weight"], dims=1)}
    idx, g3 = _embedding_parts(layer, a, g)
    weight = layer.params["weight"]
    scaled = (g3 * factors.view(-1, 1, 1)).reshape(-1, weight.shape[1])
    return {"weight": torch.zeros_like(weight).index_add_(0, idx.flatten(), scaled)}


def _rules(module: nn.Module):
    """(squared norms, clipped sum) functions of a supported layer."""
    if isinstance(module, nn.Linear):
        return _linear_norms, _linear_sum
    if isinstance(module, (nn.Conv1d, nn.Conv2d)):
        return _conv_norms, _conv_sum
    if isinstance(module, _NORMS):
        return _norm_layer_norms, _materialised_sum
    return _embedding_norms, _embedding_sum


# --------------------------------------------------------------------------- the pass


def _layers_of(model: nn.Module) -> dict[str, _Layer]:
    """Every module with trainable parameters (all supported: checked by the caller)."""
    layers: dict[str, _Layer] = {}
    for name, module in model.named_modules():
        own = _trainable_own(module)
        if own:
            layers[name] = _Layer(module, own)
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

    def record(layer: _Layer):
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
        norms_fn, _ = _rules(layer.module)
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
            _, sum_fn = _rules(layer.module)
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


def _check_parameter_uses(losses: Tensor, layers: Mapping[str, _Layer]) -> None:
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


def _param_dtype(layers: Mapping[str, _Layer]) -> torch.dtype:
    for layer in layers.values():
        for p in layer.params.values():
            return p.dtype
    return torch.float32


def _in_model_order(model: nn.Module, summed: dict[str, Tensor]) -> dict[str, Tensor]:
    """`summed` in the order of `model.named_parameters()` (the noise draw's order)."""
    return {name: summed[name] for name, _ in model.named_parameters() if name in summed}
