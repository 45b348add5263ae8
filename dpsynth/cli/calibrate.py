"""`dpsynth calibrate`: the noise for a target (ε, δ), or the ε of a given noise."""

from __future__ import annotations

from typing import Annotated

import typer

from dpsynth.cli.app import app, handle_errors, resolve_ledger_path
from dpsynth.cli.options import JsonOpt, LedgerOpt
from dpsynth.cli.render import emit_json, fmt_eps, print_kv, print_warnings, stderr


@app.command()
@handle_errors
def calibrate(
    epsilon: Annotated[
        float | None, typer.Option(help="Target ε (total for the dataset with --dataset).")
    ] = None,
    delta: Annotated[
        float | None, typer.Option(help="δ [default: the budget's δ, else 1e-5].")
    ] = None,
    sampling_rate: Annotated[float | None, typer.Option(help="Poisson sampling rate q.")] = None,
    batch_size: Annotated[int | None, typer.Option(help="Expected batch size B (q = B/N).")] = None,
    dataset_size: Annotated[int | None, typer.Option(help="Number of records N.")] = None,
    steps: Annotated[int | None, typer.Option(help="Number of steps T.")] = None,
    epochs: Annotated[float | None, typer.Option(help="Epochs E (T = ceil(E/q)).")] = None,
    noise_multiplier: Annotated[
        float | None, typer.Option(help="σ: report ε (or the most steps, with --epsilon).")
    ] = None,
    dataset: Annotated[
        str | None, typer.Option(help="Dataset id in the ledger whose earlier spends count.")
    ] = None,
    ledger: LedgerOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Noise multiplier for a target (ε, δ), sampling rate and length; or ε for a given noise."""
    from dpsynth.api import calibrate as calibrate_api

    result = calibrate_api(
        epsilon=epsilon,
        delta=delta,
        sampling_rate=sampling_rate,
        batch_size=batch_size,
        dataset_size=dataset_size,
        steps=steps,
        epochs=epochs,
        noise_multiplier=noise_multiplier,
        dataset=dataset,
        ledger=resolve_ledger_path(ledger) if dataset is not None else None,
    )
    out = result.to_json()
    mode = result.mode
    warnings = list(result.warnings)
    budget_info = result.budget
    if as_json:
        emit_json(out)
        return
    print_warnings(warnings)
    rows = [
        ("noise multiplier σ", f"{result.noise_multiplier:.4f}"),
        ("steps T", result.steps),
        ("sampling rate q", f"{result.sampling_rate:.6g}"),
        ("δ", f"{result.delta:g}"),
        ("ε (this run alone)", fmt_eps(result.epsilon)),
    ]
    if result.prior_events:
        rows += [
            ("ε already spent", fmt_eps(result.prior_epsilon)),
            ("ε total after this run", fmt_eps(result.total_epsilon)),
        ]
    if budget_info is not None:
        rows.append(
            (
                "budget cap",
                f"ε={budget_info['epsilon']:g} at δ={budget_info['delta']:g}, "
                f"spent {fmt_eps(budget_info['spent'])}, headroom {budget_info['headroom']:.4g}",
            )
        )
    rows.append(("accountant", result.accountant))
    print_kv(f"calibrate ({mode.replace('_', ' ')})", rows)
    for note in result.notes:
        stderr.print(f"note: {note}", highlight=False)
