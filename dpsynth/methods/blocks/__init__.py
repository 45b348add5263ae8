"""Pieces that more than one backend may use (never imported from a method's module).

- `table_head`: `TableHead`, the output activation of a generator of table rows;
- `latent_generator`: `LatentGenerator`, the sampler of a conditional generator G(z, y)
  (dpaf, rdpgan, dpkernel; their networks are `ConditionalNet`s), and `one_hot_labels`, G's
  label input;
- `layers`: `mlp_layers` (the vector generators' MLP) and `dcgan_init`;
- `loop_plan`: the plan of a private training loop once its events are calibrated.

Two optional stages any image backend can put around its own mechanisms, each a share of ε
with its own event in the run's plan, composed by PRV (`stages.plan_with_stages`):
- `stages`: the DP frequency model (`dpsynth.privacy.releases.frequency`), released before loop step
  0 and used as the backend's warm start (`FrequencyStart`);
- `teacher`: the DP teacher, a classifier trained once with DP-SGD whose only use is choosing
  the backend's samples (`Teacher` in the trainer, `TeacherFilter` around the generator).
With the frequency stage, `fit_penalty.FitPenalty` (`frequency_anchor` > 0) holds a GAN's
generator near its fit to the model (post-processing).
"""

from __future__ import annotations

from dpsynth.methods.blocks.fit_penalty import FitPenalty, check_fit_penalty_config
from dpsynth.methods.blocks.latent_generator import ConditionalNet, LatentGenerator, one_hot_labels
from dpsynth.methods.blocks.layers import dcgan_init, mlp_layers
from dpsynth.methods.blocks.loop_plan import loop_plan
from dpsynth.methods.blocks.stages import (
    FREQUENCY_DEFAULTS,
    FrequencyStart,
    fit_generator_to_model,
    frequency_plan,
    mmd_fit,
    plan_with_stages,
    stage_shares,
)
from dpsynth.methods.blocks.table_head import TableHead
from dpsynth.methods.blocks.teacher import (
    HALF_BUDGET_TEACHER,
    NO_TEACHER,
    RELABELLING_TEACHER,
    TEACHER_DEFAULTS,
    TEACHER_FILTERS,
    Teacher,
    TeacherNet,
    check_teacher_config,
    teacher_from_state,
    teacher_schedule,
)
from dpsynth.methods.blocks.teacher_filter import TeacherFilter

__all__ = [
    "FREQUENCY_DEFAULTS",
    "HALF_BUDGET_TEACHER",
    "NO_TEACHER",
    "RELABELLING_TEACHER",
    "TEACHER_DEFAULTS",
    "TEACHER_FILTERS",
    "ConditionalNet",
    "FitPenalty",
    "FrequencyStart",
    "LatentGenerator",
    "TableHead",
    "Teacher",
    "TeacherFilter",
    "TeacherNet",
    "check_fit_penalty_config",
    "check_teacher_config",
    "dcgan_init",
    "fit_generator_to_model",
    "frequency_plan",
    "loop_plan",
    "mlp_layers",
    "mmd_fit",
    "one_hot_labels",
    "plan_with_stages",
    "stage_shares",
    "teacher_from_state",
    "teacher_schedule",
]
