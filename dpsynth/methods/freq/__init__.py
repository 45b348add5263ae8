"""freq: the shared DP frequency model (`dpsynth.privacy.frequency`) alone, as a backend."""
