"""Empirical privacy audits: a measured lower bound on ε beside the accountant's upper bound.

`bound.py` holds the statistics (one-run auditing, Steinke, Nasr and Jagielski 2023);
`whitebox.py`, `functional.py`, `frequency.py` and `marginal.py` run canaries through the
privacy layer's own mechanisms; `blackbox.py` audits a whole table run from its release.
"""
