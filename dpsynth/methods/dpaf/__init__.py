"""DPAF: differentially private aggregation in the discriminator's forward phase (strict mode)."""

from dpsynth.methods.dpaf.method import DPAFMethod

__all__ = ["DPAFMethod"]
