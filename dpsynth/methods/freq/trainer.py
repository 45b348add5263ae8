"""freq's trainer: one loop step that reads no Poisson batch; before it, the release of the DP
frequency model from the run's secret stream (and the DP teacher's training, if planned)."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from dpsynth.errors import DpsynthError
from dpsynth.methods.base import sample_truncation
from dpsynth.methods.freq.generator import FreqGenerator
from dpsynth.methods.template import StagedTrainer
from dpsynth.privacy.mechanisms.randomness import PrivateRandomness
from dpsynth.privacy.releases.frequency import FrequencyModel

RELEASED = "trainer.released"


class FreqTrainer(StagedTrainer):
    """The released frequency model (public once released) and the optional DP teacher."""

    def setup(self, randomness: PrivateRandomness) -> None:
        """The frequency model's release (a shared stage) and the optional DP teacher."""
        # The release's secret stream ("frequency/noise") and its plan, read from the events.
        self.start_stages(randomness)
        if self.frequency.plan is None:
            raise DpsynthError("the plan has no frequency-model release")
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
        self.teacher.release_whole_data(step, x, y, self.own_generator)

    def step(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
        """Nothing to update: the release before the step is the whole mechanism."""
        if self.model is None:
            raise DpsynthError("freq's step came before its frequency-model release")
        return {}

    def own_state_tensors(self) -> dict[str, torch.Tensor]:
        """The released model (`frequency.*`, public) and whether it was made."""
        out: dict[str, torch.Tensor] = {RELEASED: torch.tensor(int(self.model is not None))}
        if self.model is not None:
            out |= {k: v.detach().cpu().clone() for k, v in self.model.tensors().items()}
        return out

    def load_own_state(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Restore what `own_state_tensors` returned."""
        self.model = FrequencyModel.from_tensors(tensors) if int(tensors[RELEASED]) else None

    def own_generator(self) -> FreqGenerator:
        """The released model's sampler."""
        if self.model is None:
            raise DpsynthError("freq has no generator before its frequency-model release")
        return FreqGenerator(
            self.model, self.info.classes, self.device, sample_truncation(self.config)
        )
