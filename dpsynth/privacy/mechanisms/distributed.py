"""Data-parallel mechanisms: one global Poisson batch split across ranks, one noise draw.

Under `torchrun` (an initialised `torch.distributed` process group of W ranks) every rank
holds the same model and draws the same global Poisson batch from the same secret stream
(the secret is drawn on rank 0 and broadcast). A mechanism then works on a share of it:

- each rank takes its strided share of the batch's records (`shard`: positions r, r+W, …),
  so every selected record is handled by exactly one rank;
- each rank clips its records and sums them; the partial sums are added by an all-reduce
  (`all_reduce_sum`), so the global sum is Σ over the whole batch, as in one process;
- the noise: every rank draws the same Gaussian from the same stream (so that every rank's
  streams stay in lockstep, which `--resume` relies on: only rank 0 saves them), but only
  rank 0 adds it to its partial sum before the all-reduce (`noisy_partial`). The global sum
  then carries exactly ONE draw of std σC, and every rank gets the same released value.

Without an initialised process group, or with one rank, every function here is the identity:
single-process behaviour does not change. This module holds no launcher logic (that is
`dpsynth.distributed`); it only asks torch which rank it is.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

__all__ = ["all_reduce_sum", "is_data_parallel", "noisy_partial", "shard", "shard_mask", "world"]


def world() -> tuple[int, int]:
    """(this rank, number of ranks) of the initialised process group; (0, 1) without one."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def is_data_parallel() -> bool:
    """True when more than one rank shares the work."""
    return world()[1] > 1


def shard(*tensors: Tensor) -> tuple[Tensor, ...]:
    """This rank's strided share of each tensor's leading dimension (all of it on one rank)."""
    rank, size = world()
    if size == 1:
        return tensors
    return tuple(t[rank::size] for t in tensors)


def shard_mask(count: int, device: torch.device | str = "cpu") -> Tensor:
    """Bool [count]: which of `count` records this rank handles (the same split as `shard`)."""
    rank, size = world()
    return torch.arange(count, device=device) % size == rank


def all_reduce_sum(tensors: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """The element-wise sum of `tensors` over all ranks (a copy; one collective per dtype).

    Every rank gets the same values. With one rank, the tensors are returned as they are.
    """
    if not is_data_parallel():
        return dict(tensors)
    out: dict[str, Tensor] = {}
    groups: dict[tuple[torch.dtype, torch.device], list[str]] = {}
    for name, t in tensors.items():
        groups.setdefault((t.dtype, t.device), []).append(name)
    for names in groups.values():
        flat = torch.cat([tensors[n].reshape(-1) for n in names])
        torch.distributed.all_reduce(flat, op=torch.distributed.ReduceOp.SUM)
        pieces = flat.split([tensors[n].numel() for n in names])
        for name, piece in zip(names, pieces, strict=True):
            out[name] = piece.view_as(tensors[name])
    return {name: out[name] for name in tensors}


def noisy_partial(partial: Tensor, noisy: Tensor) -> Tensor:
    """What this rank contributes to the all-reduce: `noisy` (its partial sum plus the one
    noise draw) on rank 0, the noise-free `partial` on every other rank."""
    return noisy if world()[0] == 0 else partial
