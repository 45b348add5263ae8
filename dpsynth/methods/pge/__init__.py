"""PGE: sliced score matching under DP-SGD with Hamiltonian sampling.

`method.py` is the `Method`, `trainer.py` its trainer, `generator.py` its sampler, `build.py`
what a config builds (noise levels, working resolution, networks), `ssm.py` the score-matching
loss, `hmc.py` the sampler's HMC, `nets.py` the score U-Net and the frozen random-conv encoder,
and `presets.py` the presets (plain data).
"""

from dpsynth.methods.pge.generator import PGEGenerator
from dpsynth.methods.pge.method import PGEMethod
from dpsynth.methods.pge.trainer import PGETrainer

__all__ = ["PGEGenerator", "PGEMethod", "PGETrainer"]
