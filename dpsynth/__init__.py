"""dpsynth: differentially private synthetic data release with a privacy ledger."""

__version__ = "0.1.0"
