"""Releases: whole DP statistics a run publishes once, built on the mechanisms.

The central images (`central`), the frequency model (`frequency`), the DP classifier used as a
teacher (`classifier`), and the DP release of a table's schema (`schema_release`).
"""
