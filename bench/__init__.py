"""The benchmarks: scripts run from the repository root as `python -m bench.NAME`."""
