"""dpsynth: differentially private synthetic data release with a privacy ledger."""

__version__ = "0.2.0"
