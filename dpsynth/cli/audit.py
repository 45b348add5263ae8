"""`dpsynth audit`: an empirical lower bound on ε beside the claimed one (exit 1 if above)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from dpsynth.cli.app import app, handle_errors
from dpsynth.cli.options import DebugOpt, JsonOpt, ThreadsOpt
from dpsynth.cli.render import emit_json, fmt_eps, print_kv, stderr
from dpsynth.cli.train import parse_sets
from dpsynth.errors import UsageError

if TYPE_CHECKING:
    from dpsynth.auditing.planned_audit import AuditResult


@app.command()
@handle_errors
def audit(
    method: Annotated[
        str, typer.Option(help="Backend to audit (any registered --method, or auto).")
    ],
    epsilon: Annotated[float, typer.Option(help="Target ε the backend plans for.")],
    preset: Annotated[
        str,
        typer.Option(help="The backend's preset (tiny, small, ..., or a tier: auto or quality)."),
    ] = "tiny",
    canaries: Annotated[
        int | None,
        typer.Option(
            help="Canaries m per run [default: 5000; on a table 20000 or as many as its "
            "cells allow; 100 black-box]."
        ),
    ] = None,
    runs: Annotated[
        int,
        typer.Option(
            help="Independent runs of the mechanism's own release, each on --canaries canaries "
            "of its own (white-box; the trials test pools them: more runs, a tighter bound)."
        ),
    ] = 1,
    confidence: Annotated[
        float, typer.Option(help="Confidence of the lower bound (1 − β).")
    ] = 0.95,
    data: Annotated[
        str,
        typer.Option(
            help="Built-in data set, or csv:PATH with --schema, whose public description plans."
        ),
    ] = "digits",
    schema: Annotated[
        str | None, typer.Option(help="Tables: the schema JSON [default: a built-in's own].")
    ] = None,
    seed: Annotated[
        int | None, typer.Option(help="Seed of the audit's own randomness (default: a fresh one).")
    ] = None,
    set_: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            help="Override a preset value as train does (key=value): audit the plan (or, with "
            "--black-box, the run) you train.",
        ),
    ] = None,
    black_box: Annotated[
        bool,
        typer.Option(
            "--black-box",
            help="Canaries in a built-in table or image set through train → sample, scored "
            "from the release only.",
        ),
    ] = False,
    break_mode: Annotated[
        str | None,
        typer.Option(
            "--break",
            metavar="MODE:FACTOR",
            help="Audit a deliberately broken copy of the mechanism (the audit's own copy only; "
            "train is never touched): noise:F divides σ by F, sensitivity:F multiplies the "
            "canary's contribution (the clipping bound, the counts) by F, clip:F clips F× "
            "too loosely (DP-SGD). The audit should then fail (exit 1): check that it sees an "
            "error of your size.",
        ),
    ] = None,
    threads: ThreadsOpt = None,
    as_json: JsonOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Audit a backend's privacy mechanism empirically.

    White-box (default): m synthetic canaries run through the backend's mechanism with its
    planned σ, q, T and clipping, and how well one can guess which canaries were in gives a
    lower bound on ε. --runs R repeats the mechanism's own release R times on fresh canaries:
    from 10,000 canaries in all two tests judge the likelihood-ratio scores with
    Clopper-Pearson bounds: the trials test, which assumes only independent canaries (at
    ε = 1 about 0.8 of the claim from 4 million canaries for a Gaussian release), and the
    family test, which judges against the plan's own noise family with its scale unknown
    (about 0.8 from 100,000). It never reads your data or ledger.
    --break MODE:FACTOR audits a deliberately broken copy (the audit should then fail).
    --black-box: canaries in a built-in table (rows) or image set (images), a whole train →
    sample run, and guesses from the synthetic release only.
    Exit 0: the lower bound is at most the claimed ε; exit 1: it exceeds it.
    """
    from dpsynth.auditing.planned_audit import run_audit

    if black_box:
        if runs != 1:
            raise UsageError("--runs applies to the white-box audit only")
        _black_box(
            method, preset, epsilon, canaries, confidence, data, seed, break_mode, as_json,
            parse_sets(set_),
        )  # fmt: skip
        return
    result = run_audit(
        method,
        preset,
        epsilon,
        canaries=canaries,
        confidence=confidence,
        data=data,
        seed=seed,
        break_mode=break_mode,
        schema=schema,
        runs=runs,
        overrides=parse_sets(set_),
    )
    if as_json:
        emit_json(result.to_json())
    else:
        rows = [
            (
                "method / preset",
                f"{result.method} / {result.preset}"
                + "".join(f" --set {item}" for item in result.overrides)
                + f" (planned on {result.data})",
            ),
            ("claimed ε (accountant)", f"{fmt_eps(result.claimed_epsilon)} at δ={result.delta:g}"),
            ("empirical lower bound", f"{result.lower_bound:.4g} (the {result.test} test)"),
            (
                "canaries m",
                f"{result.canaries}" + (f" × {result.runs} runs" if result.runs > 1 else ""),
            ),
            *_test_row(result),
            ("confidence", f"{result.confidence:g}"),
            (
                "mode",
                result.mode
                + (f" (BROKEN on purpose: --break {result.broken})" if result.broken else ""),
            ),
            *(
                (
                    f"  {part['mechanism']}",
                    f"lower bound {part['lower_bound']:.4g} vs its own claim "
                    f"{fmt_eps(part['claimed_epsilon'])}: {part['verdict']}",
                )
                for part in result.parts
            ),
            *_composition_row(result),
            ("verdict", result.verdict),
        ]
        print_kv("privacy audit", rows)
        stderr.print(f"note: {result.note}", highlight=False)
    if result.leaks:
        raise typer.Exit(1)


def _composition_row(result: AuditResult) -> list[tuple[str, str]]:
    """The parts' bounds composed, with the copies of each part's region it used."""
    composed = result.composition
    if composed is None:
        return []
    used = [
        f"{part['copies']} × {name.split(' (')[0]}"
        for name, part in composed["parts"].items()
        if part["copies"]
    ]
    rows = [
        (
            "  parts composed",
            f"lower bound {composed['lower_bound']:.4g} vs the plan's claim "
            f"{fmt_eps(result.claimed_epsilon)}" + (f" ({', '.join(used)})" if used else ""),
        )
    ]
    factors = composed.get("family_factors")
    if factors:
        each = ", ".join(f"{name.split(' (')[0]} ≥ {k:.3g}" for name, k in factors.items())
        rows.append(
            (
                "  parts' families composed",
                f"lower bound {composed['family_lower_bound']:.4g} vs the plan's claim "
                f"{fmt_eps(result.claimed_epsilon)} (factors: {each})",
            )
        )
    return rows


def _test_row(result: AuditResult) -> list[tuple[str, str]]:
    """What the judging test saw: the guesses (one-run) or the judged region (trials)."""
    trials = result.trials
    if trials is None:
        return [
            (
                "one-run test: guesses (in + out)",
                f"{result.guesses} ({result.guesses_in} + {result.guesses_out}), "
                f"{result.correct} correct",
            )
        ]
    rows = [
        (
            "trials test (assumes independence only)",
            f"{_region(trials)}: ε ≥ {trials['lower_bound']:.4g}",
        )
    ]
    family = result.family
    if family is not None:
        rows.append(
            (
                "family test (the plan's noise, its scale unknown)",
                f"{_region(family)}; sensitivity/noise ≥ {family['factor']:.4g} × the claim's: "
                f"ε ≥ {family['lower_bound']:.4g}",
            )
        )
    return rows


def _region(test: dict[str, Any]) -> str:
    """A judged region and its counts, with the bound of the test that judged it."""
    side = "≥" if test["direction"] == "high" else "≤"
    return (
        f"{test['score']} {side} {test['threshold']:.4g}: {test['hits_in']} of "
        f"{test['trials_in']} in, {test['hits_out']} of {test['trials_out']} out"
    )


def _black_box(
    method: str,
    preset: str,
    epsilon: float,
    canaries: int | None,
    confidence: float,
    data: str,
    seed: int | None,
    break_mode: str | None,
    as_json: bool,
    overrides: dict[str, str],
) -> None:
    """`audit --black-box`: one whole run (with `train`'s `--set` overrides) on a built-in
    table (canary rows) or image set (canary images)."""
    from dpsynth.auditing.blackbox import run_blackbox
    from dpsynth.auditing.blackbox_images import run_image_blackbox
    from dpsynth.auditing.planned_audit import check_audit_values
    from dpsynth.data.builtin import BUILTINS
    from dpsynth.methods.registry import get_method

    if break_mode is not None:
        raise UsageError("--break applies to the white-box audit only")
    count = 100 if canaries is None else canaries
    check_audit_values(count, confidence)
    # a method of both modalities (dpkernel, rdpgan) is audited on the data it is given
    modalities = get_method(method).modalities
    if "table" in modalities and not ("image" in modalities and data in BUILTINS):
        result = run_blackbox(
            method, preset, epsilon, canaries=count, confidence=confidence, data=data, seed=seed,
            overrides=overrides,
        )  # fmt: skip
    else:
        result = run_image_blackbox(
            method, preset, epsilon, canaries=count, confidence=confidence, data=data, seed=seed,
            overrides=overrides,
        )  # fmt: skip
    if as_json:
        emit_json(result.to_json())
    else:
        rows = [
            (
                "method / preset",
                f"{result.method} / {result.preset}"
                + "".join(f" --set {item}" for item in result.overrides)
                + f" (trained on {result.data})",
            ),
            ("claimed ε (accountant)", f"{fmt_eps(result.claimed_epsilon)} at δ={result.delta:g}"),
            ("empirical lower bound", f"{result.lower_bound:.4g}"),
            ("canaries m (in)", f"{result.canaries} ({result.canaries_in})"),
            ("guesses / correct", f"{result.guesses} / {result.correct}"),
            ("synthetic records", result.synthetic_rows),
            ("confidence", f"{result.confidence:g}"),
            ("mode", result.mode),
            ("verdict", "FAIL" if result.leaks else "pass"),
        ]
        print_kv("privacy audit", rows)
        stderr.print(
            "note: a black-box bound is usually far below the claim; it shows what this attack "
            "on the release finds, not that ε is tight",
            highlight=False,
        )
    if result.leaks:
        raise typer.Exit(1)
