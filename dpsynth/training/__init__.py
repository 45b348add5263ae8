"""Training a backend under DP: the request, the start / resume / join of a run, the step loop.

`train(request)` is the library entry `dpsynth.api.train` (and so the CLI) calls with a
`TrainRequest` built once (`TrainRequest.build(**fields)`); `train_run(**fields)` is the same
with the fields by name, test-only ones included. The modules, in the order a run goes through
them: `request` (the request's typed parts and their checks), `data` (the run's data and its
public description), `start` (open the data, plan, build, reserve, write a new run) or `resume`
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
