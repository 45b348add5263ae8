"""PGE: sliced score matching under DP-SGD with Hamiltonian sampling.

`method.py` is the backend (Method, Trainer, Generator), `ssm.py` the score-matching loss,
`hmc.py` the sampler, `nets.py` the score U-Net and the frozen random-conv encoder, and
`presets.py` the presets (plain data).
"""

from dpsynth.methods.pge.method import PGEGenerator, PGEMethod, PGETrainer

__all__ = ["PGEGenerator", "PGEMethod", "PGETrainer"]
