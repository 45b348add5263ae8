"""Ghost clipping's per-layer rules: each supported layer's per-record squared gradient
norms and clipped gradient sum, from its recorded input activations `a` and output gradients
`g` (see `privacy/mechanisms/ghost.py` for the pass that records them and the conditions it checks).

Linear and convolutions use the Gram trick or the record's materialised layer gradient,
whichever costs fewer operations; normalisation layers' affine parameters and embeddings
materialise their small per-record gradients.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.modules.utils import _pair, _single

NORM_LAYERS = (nn.GroupNorm, nn.LayerNorm, nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d)
"""Normalisation layers whose affine parameters ghost clipping supports."""

CONV_PER_RECORD = "grouped"
"""How a convolution's per-record weight gradients are formed where they are needed:
"grouped" (the backward kernel with the batch folded into the groups; faster on the CPU and
no unfolded copy) or "unfold" (unfold + batched matmul, as Opacus does). A tuning knob for
the GPU measurement (`bench/dpsgd.py` variant `dpsynth-ghost-unfold`); both are exact."""


@dataclass
class Layer:
    """One supported layer's inputs, outputs and per-record pieces for one forward pass."""

    module: nn.Module
    params: dict[str, Tensor]  # local name → trainable parameter
    calls: list[tuple[Tensor, Tensor, int, int]] = field(default_factory=list)
    per_record: dict[str, Tensor] = field(default_factory=dict)  # materialised grads [B, ...]


def _sq_norms(rows: Tensor) -> Tensor:
    """‖row_i‖² of each record's flattened tensor (no squared copy of a large tensor)."""
    return torch.linalg.vector_norm(rows.flatten(1), dim=1).square()


def _linear_norms(layer: Layer, a: Tensor, g: Tensor) -> Tensor:
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


def _product_sq_norms(layer: Layer, name: str, g3: Tensor, a3: Tensor) -> Tensor:
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


def _linear_sum(layer: Layer, a: Tensor, g: Tensor, factors: Tensor) -> dict[str, Tensor]:
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


def _conv_norms(layer: Layer, a: Tensor, g: Tensor) -> Tensor:
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


def _conv_sum(layer: Layer, a: Tensor, g: Tensor, factors: Tensor) -> dict[str, Tensor]:
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


def _norm_layer_norms(layer: Layer, a: Tensor, g: Tensor) -> Tensor:
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


def _materialised_sum(layer: Layer, a: Tensor, g: Tensor, factors: Tensor) -> dict[str, Tensor]:
    return {name: torch.tensordot(factors, layer.per_record[name], dims=1) for name in layer.params}


def _embedding_parts(layer: Layer, a: Tensor, g: Tensor) -> tuple[Tensor, Tensor]:
    """Indices [B, T] and output gradients [B, T, d], with padding_idx's rows zeroed."""
    batch = a.shape[0]
    idx = a.reshape(batch, -1)
    g3 = g.reshape(batch, idx.shape[1], -1)
    if layer.module.padding_idx is not None:  # torch never updates the padding row
        g3 = g3 * (idx != layer.module.padding_idx).unsqueeze(2).to(g3.dtype)
    return idx, g3


def _embedding_norms(layer: Layer, a: Tensor, g: Tensor) -> Tensor:
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


def _embedding_sum(layer: Layer, a: Tensor, g: Tensor, factors: Tensor) -> dict[str, Tensor]:
    if "weight" in layer.per_record:
        return {"weight": torch.tensordot(factors, layer.per_record["weight"], dims=1)}
    idx, g3 = _embedding_parts(layer, a, g)
    weight = layer.params["weight"]
    scaled = (g3 * factors.view(-1, 1, 1)).reshape(-1, weight.shape[1])
    return {"weight": torch.zeros_like(weight).index_add_(0, idx.flatten(), scaled)}


def rules_for(module: nn.Module):
    """(squared norms, clipped sum) functions of a supported layer."""
    if isinstance(module, nn.Linear):
        return _linear_norms, _linear_sum
    if isinstance(module, (nn.Conv1d, nn.Conv2d)):
        return _conv_norms, _conv_sum
    if isinstance(module, NORM_LAYERS):
        return _norm_layer_norms, _materialised_sum
    return _embedding_norms, _embedding_sum
