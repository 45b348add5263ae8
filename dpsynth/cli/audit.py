"""`dpsynth audit`: an empirical lower bound on ε beside the claimed one (exit 1 if above)."""

from __future__ import annotations

from typing import Annotated

import typer

from dpsynth.cli.app import DebugOpt, JsonOpt, app, handle_errors
from dpsynth.cli.render import emit_json, fmt_eps, print_kv, stderr
from dpsynth.errors import UsageError


@app.command()
@handle_errors
def audit(
    method: Annotated[
        str, typer.Option(help="Backend to audit (any registered --method, or auto).")
    ],
    epsilon: Annotated[float, typer.Option(help="Target ε the backend plans for.")],
    preset: Annotated[
        str, typer.Option(help="The backend's preset (tiny, small, ..., or auto).")
    ] = "tiny",
    canaries: Annotated[int, typer.Option(help="Number of canaries m.")] = 5000,
    confidence: Annotated[
        float, typer.Option(help="Confidence of the lower bound (1 − β).")
    ] = 0.95,
    data: Annotated[
        str, typer.Option(help="Built-in data set whose public description (N, shape) plans.")
    ] = "digits",
    seed: Annotated[
        int | None, typer.Option(help="Seed of the audit's own randomness (default: a fresh one).")
    ] = None,
    black_box: Annotated[
        bool, typer.Option("--black-box", help="Canary records through train → sample.")
    ] = False,
    break_mode: Annotated[str | None, typer.Option("--break", hidden=True)] = None,
    as_json: JsonOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Audit a backend's privacy mechanism empirically (one-run auditing, white-box).

    m synthetic canaries run through the backend's mechanism with its planned σ, q, T and
    clipping, and how well one can guess which canaries were in gives a lower bound on ε. It
    never reads your data or ledger. Exit 0: the lower bound is at most the claimed ε; exit 1:
    it exceeds it.
    """
    from dpsynth.audit.run import run_audit

    if black_box:
        raise UsageError("--black-box is not implemented yet; the white-box audit is the default")
    result = run_audit(
        method,
        preset,
        epsilon,
        canaries=canaries,
        confidence=confidence,
        data=data,
        seed=seed,
        break_mode=break_mode,
    )
    if as_json:
        emit_json(result.to_json())
    else:
        rows = [
            ("method / preset", f"{result.method} / {result.preset} (planned on {result.data})"),
            ("claimed ε (accountant)", f"{fmt_eps(result.claimed_epsilon)} at δ={result.delta:g}"),
            ("empirical lower bound", f"{result.lower_bound:.4g}"),
            ("canaries m", result.canaries),
            (
                "guesses (in + out)",
                f"{result.guesses} ({result.guesses_in} + {result.guesses_out})",
            ),
            ("correct", result.correct),
            ("confidence", f"{result.confidence:g}"),
            (
                "mode",
                result.mode + (f" (BROKEN: {result.broken}, test only)" if result.broken else ""),
            ),
            ("verdict", result.verdict),
        ]
        print_kv("privacy audit", rows)
        stderr.print(f"note: {result.note}", highlight=False)
    if result.leaks:
        raise typer.Exit(1)
