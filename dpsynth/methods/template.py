"""The backend template: what every neural backend shares, written once.

A backend's `Method` subclasses `StagedMethod` and declares two classes: `trainer_class` (a
`StagedTrainer`) and `generator_class` (a `Generator` with `from_state`). From them the
template makes
- `plan`: the backend's own plan step (`plan_own(facts)`, default the DP-SGD plan of
  `Method.plan_from`) with the shared stages around it (`blocks.plan_with_stages`: the frequency
  model in front, the DP teacher beside);
- `generator_from_state` (`Method`'s: `generator_class.from_state(state)`) behind the run's
  DP teacher, if it has one (`finish_generator`, `blocks.teacher_from_state`).
`Method.trainer` makes the `trainer_class(info, config, plan, device, seed, randomness)`.

A `StagedTrainer`'s `setup(randomness)` (called by `Trainer.__init__` once the run's public
facts are kept, with the secret randomness: a fresh OS secret when none is given) builds its
own seeded state (`seeded`) first and calls `start_stages(randomness)` after: the shared
stages, `Teacher` and `FrequencyStart`.
The template then owns the stages' part of the trainer: the frequency model's release before
step 0 (handed to `warm_start`), the teacher's training, its state in the checkpoint and its
filter around `generator()`. A trainer writes `own_state_tensors`, `load_own_state`,
`own_generator` and its `step`.

The marginal backends (aim, mst) have no stages and subclass `Method` and `Trainer` directly;
they use the same file names (`method.py`, `trainer.py`, `generator.py`, `presets.py`).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import ClassVar

import torch

from dpsynth.methods.base import (
    Generator,
    GeneratorState,
    Method,
    PlanFacts,
    PrivacyPlan,
    Trainer,
    saved_under,
)
from dpsynth.methods.blocks import FrequencyStart, Teacher, plan_with_stages, teacher_from_state
from dpsynth.privacy.mechanisms.randomness import PrivateRandomness

__all__ = ["StagedMethod", "StagedTrainer", "load_module_tensors", "module_tensors", "seeded"]


@contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Draw from the global torch RNG seeded with the public `seed` (initial weights), and
    leave the global RNG as it was afterwards."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def module_tensors(
    modules: Mapping[str, torch.nn.Module], optimizers: Mapping[str, torch.optim.Optimizer]
) -> dict[str, torch.Tensor]:
    """Copies on the CPU of the modules' weights and buffers (`<name>.<key>`) and of the
    optimisers' per-parameter state (`<name>.<index>.<slot>`), for a checkpoint."""
    out: dict[str, torch.Tensor] = {}
    for prefix, module in modules.items():
        for key, value in module.state_dict().items():
            out[f"{prefix}.{key}"] = value.detach().cpu().clone()
    for prefix, optimizer in optimizers.items():
        for index, state in optimizer.state_dict()["state"].items():
            for key, value in state.items():
                tensor = value if torch.is_tensor(value) else torch.tensor(value)
                out[f"{prefix}.{index}.{key}"] = tensor.detach().cpu().clone()
    return out


def load_module_tensors(
    tensors: Mapping[str, torch.Tensor],
    modules: Mapping[str, torch.nn.Module],
    optimizers: Mapping[str, torch.optim.Optimizer],
    device: torch.device,
) -> None:
    """Restore what `module_tensors` returned (optimiser state on `device`, Adam's step
    counts on the CPU, where torch keeps them)."""
    for prefix, module in modules.items():
        module.load_state_dict(saved_under(tensors, prefix + "."))
    for prefix, optimizer in optimizers.items():
        state: dict[int, dict[str, torch.Tensor]] = {}
        for name, value in saved_under(tensors, prefix + ".").items():
            index, key = name.split(".", 1)
            state.setdefault(int(index), {})[key] = value.to(device if key != "step" else "cpu")
        groups = optimizer.state_dict()["param_groups"]
        optimizer.load_state_dict({"state": state, "param_groups": groups})


class StagedTrainer(Trainer):
    """A trainer with the shared stages (the DP teacher, the frequency-model warm start)."""

    teacher: Teacher
    frequency: FrequencyStart

    def start_stages(self, randomness: PrivateRandomness) -> None:
        """Build the shared stages: the run's DP teacher and the frequency model's release,
        each inactive when the plan has none.

        Called after the backend's own seeded initialisation: the teacher's seeds the CUDA
        generators too (`torch.manual_seed`), so that order keeps GPU runs as they were.
        Secret streams are keyed by name: the order they are handed out in changes no draw.
        """
        self.teacher = Teacher(
            self.info, self.config, self.plan, self.device, self.seed, randomness
        )
        self.frequency = FrequencyStart(
            self.info, self.plan, randomness, str(self.config.get("frequency_denoise", "clip"))
        )

    @abstractmethod
    def own_generator(self) -> Generator:
        """The backend's sampler as of now, without the teacher's filter."""

    @abstractmethod
    def own_state_tensors(self) -> dict[str, torch.Tensor]:
        """The backend's own tensors to resume from (the teacher's are added to them)."""

    @abstractmethod
    def load_own_state(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Restore what `own_state_tensors` returned."""

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """The backend's tensors and the DP teacher's (none without one)."""
        return self.own_state_tensors() | self.teacher.state_tensors()

    def load_state_tensors(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Restore what `state_tensors` returned."""
        self.load_own_state(tensors)
        self.teacher.load_state_tensors(tensors)

    def release_whole_data(self, step: int, x: torch.Tensor, y: torch.Tensor) -> None:
        """The plan's shared stages: before step 0 the frequency model's release, handed to
        `warm_start`; the DP teacher's training at the step its plan says (none without)."""
        release = self.frequency.release(step, x, y)
        if release is not None:
            self.warm_start(release)
        self.teacher.release_whole_data(step, x, y, self.own_generator)

    def generator(self) -> Generator:
        """The backend's sampler, behind the DP teacher's filter once it is trained."""
        return self.teacher.wrap(self.own_generator(), self.config)


class StagedMethod(Method):
    """A backend made from the template: its classes, its own plan step, its checks."""

    trainer_class: ClassVar[type[StagedTrainer]]

    def plan_own(self, facts: PlanFacts) -> PrivacyPlan:
        """The backend's own mechanisms' plan for `facts.target` after `facts.prior_events`
        (default: `Method.plan_from`, DP-SGD steps with the optional central images)."""
        return Method.plan_from(self, facts)

    def plan_from(self, facts: PlanFacts) -> PrivacyPlan:
        """`plan_own` with the shared stages (`plan_with_stages`): the frequency model in
        front when `frequency_share` > 0, the DP teacher beside when `teacher_share` > 0."""
        return plan_with_stages(
            *facts.unpacked(), lambda goal, prior: self.plan_own(facts.after(goal, prior))
        )

    def finish_generator(self, sampler: Generator, state: GeneratorState) -> Generator:
        """The rebuilt generator behind the run's DP teacher when it has one."""
        return teacher_from_state(sampler, state.info, state.config, state.tensors)
