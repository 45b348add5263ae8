"""PSG's gradient-matching distance: layer-wise, per-output-row cosine (spec psg §2.2).

    L_dis(G^S, G^D) = Σ_layers Σ_rows ( 1 − ⟨A_i, B_i⟩ / (‖A_i‖·‖B_i‖ + 1e-6) )

A conv weight (out, in, h, w) is read as `out` rows of length in·h·w, a linear weight as its
`out` rows, a 3-D tensor (C, h, w) as C rows of h·w; 1-D tensors (biases, norm affines)
contribute nothing. The distance is invariant to a positive rescaling of each row of either
side, so how the released noisy gradient is normalised does not change the update of S.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

_EPS = 1e-6


def _rows(tensor: Tensor) -> Tensor | None:
    """The tensor as rows (one per output unit), or None for a 1-D tensor (not matched)."""
    if tensor.dim() <= 1:
        return None
    return tensor.reshape(tensor.shape[0], -1)


def layer_distance(synthetic: Tensor, real: Tensor) -> Tensor:
    """Σ_rows (1 − cos(row of `synthetic`, row of `real`)) for one parameter's gradients."""
    a, b = _rows(synthetic), _rows(real)
    if a is None or b is None:
        return torch.zeros((), dtype=synthetic.dtype, device=synthetic.device)
    dots = (a * b).sum(-1)
    norms = a.norm(dim=-1) * b.norm(dim=-1)
    return (1.0 - dots / (norms + _EPS)).sum()


def match_loss(synthetic: Sequence[Tensor], real: Sequence[Tensor]) -> Tensor:
    """L_dis: the sum of `layer_distance` over corresponding parameter gradients."""
    if len(synthetic) != len(real):
        raise ValueError("match_loss needs one real gradient per synthetic gradient")
    total = torch.zeros((), dtype=synthetic[0].dtype, device=synthetic[0].device)
    for a, b in zip(synthetic, real, strict=True):
        total = total + layer_distance(a, b)
    return total
