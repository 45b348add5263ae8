"""`dpsynth calibrate`: the noise for a target (ε, δ), or the ε of a given noise."""

from __future__ import annotations

import math
from typing import Annotated, Any

import typer

from dpsynth.cli.app import DebugOpt, JsonOpt, LedgerOpt, app, handle_errors, resolve_ledger_path
from dpsynth.cli.render import emit_json, fmt_eps, print_kv, print_warnings, stderr
from dpsynth.errors import UsageError


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
    debug: DebugOpt = False,
) -> None:
    """Noise multiplier for a target (ε, δ), sampling rate and length; or ε for a given noise."""
    from dpsynth.privacy import accounting, calibration

    q, n = _sampling_rate(sampling_rate, batch_size, dataset_size)
    length = _length(steps, epochs, q)
    prior: tuple[dict, ...] = ()
    budget_info: dict[str, Any] | None = None
    if dataset is not None:
        from dpsynth.ledger import Ledger

        book = Ledger(resolve_ledger_path(ledger))
        prior = book.events_for(dataset)
        budget = book.budget_for(dataset)
        if budget is not None:
            if delta is None:
                delta = float(budget["delta"])
            if epsilon is None and noise_multiplier is None:
                epsilon = float(budget["epsilon"])
            spent = accounting.compose_epsilon(prior, float(budget["delta"])).epsilon
            budget_info = {
                "epsilon": float(budget["epsilon"]),
                "delta": float(budget["delta"]),
                "spent": spent,
                # Composition is not additive: the σ reported is what fits; this is a guide.
                "headroom": float(budget["epsilon"]) - spent,
            }
    delta = 1e-5 if delta is None else delta
    warnings: list[str] = []
    if n is not None and delta >= 1.0 / n:
        warnings.append(f"δ={delta:g} is not below 1/N = {1.0 / n:.3g}; use a smaller --delta")
    if epsilon is not None and noise_multiplier is not None:
        if length is not None:
            raise UsageError(
                "give at most two of --epsilon, --noise-multiplier and --steps/--epochs"
            )
        result = calibration.max_steps(noise_multiplier, epsilon, delta, q, prior)
        mode = "max_steps"
    elif noise_multiplier is not None:
        if length is None:
            raise UsageError("--noise-multiplier needs --steps or --epochs (or --epsilon)")
        result = accounting.epsilon_report(noise_multiplier, delta, q, length, prior)
        mode = "epsilon"
    elif epsilon is not None:
        if length is None:
            raise UsageError("--epsilon needs --steps or --epochs (or --noise-multiplier)")
        result = calibration.calibrate_noise(epsilon, delta, q, length, prior)
        mode = "noise_multiplier"
    else:
        raise UsageError("give --epsilon (to find the noise) or --noise-multiplier (to find ε)")
    out = {"mode": mode, **result.to_json(), "dataset": dataset, "warnings": warnings}
    if budget_info is not None:
        out["budget"] = budget_info
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
    if prior:
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


def _sampling_rate(
    sampling_rate: float | None, batch_size: int | None, dataset_size: int | None
) -> tuple[float, int | None]:
    if sampling_rate is not None:
        if batch_size is not None:
            raise UsageError("give either --sampling-rate or --batch-size with --dataset-size")
        return sampling_rate, dataset_size
    if batch_size is None or dataset_size is None:
        raise UsageError("give --sampling-rate, or --batch-size together with --dataset-size")
    if dataset_size < 1 or batch_size < 1:
        raise UsageError("--batch-size and --dataset-size must be positive")
    if batch_size > dataset_size:
        raise UsageError(
            f"--batch-size {batch_size} exceeds --dataset-size {dataset_size} (q would be > 1)"
        )
    return batch_size / dataset_size, dataset_size


def _length(steps: int | None, epochs: float | None, q: float) -> int | None:
    if steps is not None and epochs is not None:
        raise UsageError("give either --steps or --epochs, not both")
    if epochs is not None:
        if not (epochs > 0 and math.isfinite(epochs)):
            raise UsageError(f"--epochs must be positive, got {epochs}")
        if not (0 < q <= 1):
            raise UsageError(f"the sampling rate must be in (0, 1], got {q}")
        return max(1, math.ceil(epochs / q - 1e-9))
    if steps is not None and steps < 1:
        raise UsageError(f"--steps must be at least 1, got {steps}")
    return steps
