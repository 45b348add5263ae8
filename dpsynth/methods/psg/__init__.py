"""PSG backend (`--method psg`): private set generation by gradient matching."""

from dpsynth.methods.psg.method import PSGMethod

__all__ = ["PSGMethod"]
