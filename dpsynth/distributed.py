"""Running `train` under `torchrun`: the launch's ranks, the process group, broadcasts.

`torchrun` starts one process per GPU (or per CPU worker) and tells each its place through
environment variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT). Without them
dpsynth runs in one process as always. With them, `process_group` joins the group: NCCL on
CUDA (rank r on `cuda:LOCAL_RANK`), gloo on the CPU. What the ranks do together is in
`dpsynth.training` (who reads and writes what) and `dpsynth.privacy.mechanisms.distributed` (the
mechanisms on a share of the batch); this module is the plumbing only.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch

from dpsynth.errors import DpsynthError, UsageError

__all__ = [
    "Launch",
    "PeerFailed",
    "broadcast",
    "is_main_process",
    "launch_from_env",
    "process_group",
]

# Rank 0 plans (the accountant may take a minute on a long run) and reserves while the
# others wait in a broadcast; torch's default timeout (10 min for gloo) is the bound.
_TIMEOUT = timedelta(minutes=30)


class PeerFailed(DpsynthError):
    """Rank 0 stopped with an error that it reports itself; another rank exits quietly with
    the same exit code."""

    quiet = True

    def __init__(self, exit_code: int) -> None:
        super().__init__("rank 0 failed (see its error)")
        self.exit_code = exit_code


@dataclass(frozen=True)
class Launch:
    """This process's place in a `torchrun` launch."""

    rank: int
    world_size: int
    local_rank: int

    @property
    def is_main(self) -> bool:
        """Rank 0: the only rank that touches the ledger, the run dir and the terminal."""
        return self.rank == 0


def launch_from_env() -> Launch | None:
    """The launch torchrun describes in the environment, or None outside torchrun."""
    if "WORLD_SIZE" not in os.environ:
        return None
    try:
        launch = Launch(
            rank=int(os.environ.get("RANK", "0")),
            world_size=int(os.environ["WORLD_SIZE"]),
            local_rank=int(os.environ.get("LOCAL_RANK", "0")),
        )
    except ValueError:
        raise UsageError(
            "RANK, WORLD_SIZE and LOCAL_RANK must be integers (set by torchrun)"
        ) from None
    if not 0 <= launch.rank < launch.world_size or launch.local_rank < 0:
        raise UsageError(
            f"RANK={launch.rank} does not fit WORLD_SIZE={launch.world_size} (set by torchrun)"
        )
    return launch


def is_main_process() -> bool:
    """False only on a torchrun rank other than 0 (those stay quiet)."""
    return "WORLD_SIZE" not in os.environ or os.environ.get("RANK", "0").strip() == "0"


def _device(launch: Launch, requested: str) -> torch.device:
    """`cuda:LOCAL_RANK` for --device auto (with CUDA) or cuda; the CPU for --device cpu."""
    if requested == "cpu":
        return torch.device("cpu")
    if requested not in ("auto", "cuda"):
        raise UsageError(
            f"under torchrun --device must be auto, cpu or cuda (each rank takes "
            f"cuda:LOCAL_RANK), got {requested!r}"
        )
    if not torch.cuda.is_available():
        if requested == "cuda":
            raise UsageError("--device cuda was asked for, but no CUDA device is available")
        return torch.device("cpu")
    if launch.local_rank >= torch.cuda.device_count():
        raise UsageError(
            f"LOCAL_RANK {launch.local_rank} has no GPU: this machine has "
            f"{torch.cuda.device_count()} (use --nproc-per-node ≤ the GPU count)"
        )
    return torch.device("cuda", launch.local_rank)


@contextmanager
def process_group(launch: Launch, requested_device: str) -> Iterator[torch.device]:
    """Join the launch's process group for the block; yields this rank's device."""
    device = _device(launch, requested_device)
    dist = torch.distributed
    if not dist.is_available():
        raise UsageError("this torch build has no torch.distributed: run without torchrun")
    if device.type == "cuda":
        torch.cuda.set_device(device)
        # Every rank updates its copy of the model from the same released values; cuDNN's
        # non-deterministic kernels could make the copies drift apart.
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
        dist.init_process_group("nccl", timeout=_TIMEOUT, device_id=device)
    else:
        dist.init_process_group("gloo", timeout=_TIMEOUT)
    try:
        yield device
    finally:
        dist.destroy_process_group()


def broadcast(obj: Any, device: torch.device) -> Any:
    """Rank 0's `obj` on every rank (pickled; the ranks of one launch trust each other)."""
    box = [obj]
    torch.distributed.broadcast_object_list(
        box, src=0, device=device if device.type == "cuda" else None
    )
    return box[0]
