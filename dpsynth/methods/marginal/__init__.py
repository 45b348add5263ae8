"""Marginal-based table synthesizers built on mbi (private-pgm): AIM and MST."""

from dpsynth.methods.marginal.aim import AIMMethod
from dpsynth.methods.marginal.mst import MSTMethod

__all__ = ["AIMMethod", "MSTMethod"]
