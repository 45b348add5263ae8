"""The benchmarks: scripts run as `python bench/NAME.py` or `python -m bench.NAME`."""
