"""Empirical privacy audits: a measured lower bound on ε beside the accountant's upper bound.

`bound.py` holds the statistics (one-run auditing, Steinke, Nasr and Jagielski 2023);
`whitebox.py` runs canaries through the privacy layer's own DP-SGD step.
"""
