"""freq: the shared DP frequency model (`dpsynth.privacy.releases.frequency`) alone, as a
backend."""

from dpsynth.methods.freq.method import FreqMethod

__all__ = ["FreqMethod"]
