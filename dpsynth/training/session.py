"""What the loop needs to run a started, resumed or joined run (`Session`), and the one
release every run may make before its first step: the central images of a DP warm start.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from dpsynth.data.images import DataInfo, ImageData
from dpsynth.data.public import PublicImages
from dpsynth.ledger import Ledger
from dpsynth.methods.base import Method, Trainer
from dpsynth.privacy.accounting.plan import PrivacyPlan
from dpsynth.privacy.mechanisms.poisson import PoissonSampler
from dpsynth.privacy.mechanisms.randomness import PrivateRandomness
from dpsynth.privacy.releases.central import central_plan_in, release_central_images
from dpsynth.rundir import RunDir


@dataclass
class Session:
    """What the loop needs to run: built by rank 0 (or one process) from the request or the
    run dir, by another rank from rank 0's start message."""

    run: RunDir | None  # None on ranks other than 0: they write nothing
    ledger: Ledger | None
    backend: Method
    records: ImageData
    info: DataInfo
    config: Mapping[str, Any]
    plan: PrivacyPlan
    trainer: Trainer
    sampler: PoissonSampler
    randomness: PrivateRandomness
    run_config: dict[str, Any]
    start_step: int
    warnings: list[str]
    # The restored trainer tensors of a resumed run (None for a new one), for the other ranks.
    restored: dict[str, torch.Tensor] | None = None
    # The secret stream of the plan's central-images release (None when it has none).
    central_rng: torch.Generator | None = None
    # Declared-public images to pretrain on before step 0 (`--public`; None when there are
    # none, or when the run resumes from a checkpoint that already holds the pretraining).
    public: PublicImages | None = None

    def start_message(self) -> dict[str, Any]:
        """What the other ranks need to join: settings, the secret, the streams' states."""
        return {
            "run_config": self.run_config,
            "secret": self.randomness.to_json(),
            "generators": self.randomness.state(),
            "tensors": self.restored,
            "start_step": self.start_step,
            "warnings": self.warnings,
            "content_digest": self.records.content_digest,
        }


def central_generator(plan: PrivacyPlan, randomness: PrivateRandomness) -> torch.Generator | None:
    """The secret stream of the plan's central-images release, handed out with the loop's
    other streams (so that a checkpoint saves and restores it with them)."""
    if central_plan_in(plan.events) is None:
        return None
    return randomness.generator("loop/central-images")


def warm_start(session: Session, pixels: torch.Tensor, labels: torch.Tensor) -> None:
    """Release the plan's central images and hand them to the trainer, once per run.

    Only a run that starts from scratch does it: a resumed run's checkpoint already holds the
    warm-started weights (and the stream's state after the release). A run resumed before its
    first checkpoint redoes it from the fresh secret stream, which draws the same noise, so
    the release is the same one the plan accounted for.
    """
    release_plan = central_plan_in(session.plan.events)
    if release_plan is None or session.start_step > 0 or session.restored is not None:
        return
    assert session.central_rng is not None
    release = release_central_images(
        pixels.cpu(), labels.cpu(), len(session.info.classes), release_plan, session.central_rng
    )
    session.trainer.warm_start(release)
