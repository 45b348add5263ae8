"""freq's trainer: one loop step that reads no Poisson batch; before it, the release of the DP
frequency model from the run's secret stream (and the DP teacher's training, if planned)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from dpsynth.data.images import DataInfo
from dpsynth.errors import DpsynthError
from dpsynth.methods.base import Generator, PrivacyPlan, Trainer, sample_truncation
from dpsynth.methods.blocks import FrequencyStart, Teacher
from dpsynth.methods.freq.generator import FreqGenerator
from dpsynth.privacy.frequency import FrequencyModel
from dpsynth.privacy.randomness import PrivateRandomness

RELEASED = "trainer.released"


class FreqTrainer(Trainer):
    """The released frequency model (public once released) and the optional DP teacher."""

    def __init__(
        self,
        info: DataInfo,
        config: Mapping[str, Any],
        plan: PrivacyPlan,
        device: torch.device,
        seed: int,
        randomness: PrivateRandomness | None = None,
    ) -> None:
        self.info = info
        self.config = dict(config)
        self.device = torch.device(device)
        randomness = randomness if randomness is not None else PrivateRandomness.fresh()
        # The release's secret stream ("frequency/noise") and its plan, read from the events.
        self.frequency = FrequencyStart(info, plan, randomness)
        if self.frequency.plan is None:
            raise DpsynthError("the plan has no frequency-model release")
        self.teacher = Teacher(info, config, plan, self.device, seed, randomness)
        self.model: FrequencyModel | None = None

    def reads_batch(self, step: int) -> bool:
        """Never: the one release reads the whole data in `release_whole_data`."""
        return False

    def release_whole_data(self, step: int, x: torch.Tensor, y: torch.Tensor) -> None:
        """Before step 0: the frequency model's release (once: a resumed run's checkpoint
        holds it); then the DP teacher at the step its plan says (none without one)."""
        if self.model is None:
            release = self.frequency.release(step, x, y)
            if release is not None:
                self.model = release.model
        self.teacher.release_whole_data(step, x, y, self._own_generator)

    def step(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
        """Nothing to update: the release before the step is the whole mechanism."""
        if self.model is None:
            raise DpsynthError("freq's step came before its frequency-model release")
        return {}

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """The released model (`frequency.*`, public), the teacher, and whether it was made."""
        out: dict[str, torch.Tensor] = {RELEASED: torch.tensor(int(self.model is not None))}
        if self.model is not None:
            out |= {k: v.detach().cpu().clone() for k, v in self.model.tensors().items()}
        return out | self.teacher.state_tensors()

    def load_state_tensors(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Restore what `state_tensors` returned."""
        self.model = FrequencyModel.from_tensors(tensors) if int(tensors[RELEASED]) else None
        self.teacher.load_state_tensors(tensors)

    def generator(self) -> Generator:
        """The model's sampler (behind the DP teacher once it is trained)."""
        return self.teacher.wrap(self._own_generator(), self.config)

    def _own_generator(self) -> FreqGenerator:
        if self.model is None:
            raise DpsynthError("freq has no generator before its frequency-model release")
        return FreqGenerator(
            self.model, self.info.classes, self.device, sample_truncation(self.config)
        )
