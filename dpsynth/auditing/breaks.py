"""The audit's deliberate errors: `dpsynth audit --break MODE[:FACTOR]`, a user option.

A break makes one error inside the audit's own copy of the mechanism's call, `FACTOR` times
over (default `DEFAULT_FACTOR`): "noise" divides σ by it, "clip" clips that many times too
loosely with the noise unchanged, "sensitivity" understates the plan's Δ by it (a canary moves
the release that many times further: a clipping bound that many times too loose, a counter
that counts every record that many times). The audit should then fail; whoever changes a
preset or writes a backend checks with it that the audit sees an error of their size. The
mechanisms, the plan and the accountant are never changed: a real `train` is never touched.
"""

from __future__ import annotations

from collections.abc import Sequence

from dpsynth.errors import UsageError

__all__ = ["DEFAULT_FACTOR", "break_mode_of", "check_break", "read_break"]

# The target: a 2× error at ε = 1 is caught.
DEFAULT_FACTOR = 2.0


def _split(break_mode: str) -> tuple[str, float]:
    mode, _, factor_text = break_mode.partition(":")
    if not factor_text:
        return mode, DEFAULT_FACTOR
    try:
        factor = float(factor_text)
    except ValueError:
        raise UsageError(
            f"--break {break_mode}: the factor must be a number, e.g. noise:2"
        ) from None
    if not factor > 1.0 or factor != factor or factor == float("inf"):
        raise UsageError(f"--break {break_mode}: the factor must be a finite number above 1")
    return mode, factor


def break_mode_of(break_mode: str | None) -> str | None:
    """The mode part of `break_mode` ("noise" of "noise:4")."""
    return None if break_mode is None else _split(break_mode)[0]


def check_break(break_mode: str | None, allowed: Sequence[str]) -> None:
    """UsageError unless `break_mode` is None or one of `allowed`, with an optional factor > 1."""
    if break_mode is None:
        return
    mode, _ = _split(break_mode)
    if mode not in allowed:
        raise UsageError(
            f"--break must be one of {', '.join(allowed)} (optionally MODE:FACTOR), got "
            f"{break_mode!r}"
        )


def read_break(break_mode: str | None, modes: Sequence[str]) -> tuple[str | None, float]:
    """(mode, factor) when `break_mode`'s mode is one of `modes`; (None, 1.0) otherwise (a
    break another part of the plan applies, or none)."""
    if break_mode is None:
        return None, 1.0
    mode, factor = _split(break_mode)
    return (mode, factor) if mode in modes else (None, 1.0)
