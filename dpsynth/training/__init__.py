"""Training a backend under DP: the request, the start / resume / join of a run, the step loop.

`train(request)` (or `train_run(**fields)`) is the library entry the CLI calls. The modules,
in the order a run goes through them: `request` (what to train and its checks), `data` (the
run's data and its public description), `start` (plan, reserve, write a new run) or `resume`
(check the anchor and load a run; `join_run` for another torchrun rank), `session` (what the
loop needs, the warm-start release), `loop` (the all-or-nothing steps and checkpoints, with
`interrupts` for signals and `progress` for the ε shown), and `summary` (what a run returns).
"""

from dpsynth.methods.recommend import resolve_preset
from dpsynth.training.entry import train, train_run
from dpsynth.training.progress import ProgressCallback, TrainProgress
from dpsynth.training.request import TrainRequest, parse_epsilon, resolve_device

__all__ = [
    "ProgressCallback",
    "TrainProgress",
    "TrainRequest",
    "parse_epsilon",
    "resolve_device",
    "resolve_preset",
    "train",
    "train_run",
]
