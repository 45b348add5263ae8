"""`dpsynth train`: the flags, which are the training request's fields by name, handed to
`dpsynth.api.train`; the result rendered."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from dpsynth.cli.app import app, handle_errors, resolve_ledger_path, threads_option
from dpsynth.cli.options import ChannelsOpt, ClassesOpt, DeviceOpt, JsonOpt, LedgerOpt, QuietOpt
from dpsynth.cli.render import (
    TrainProgressView,
    emit_json,
    fmt_eps,
    interactive,
    print_kv,
    print_remarks,
    print_warnings,
    progress_bar,
    show_progress,
    stdout,
)
from dpsynth.errors import UsageError
from dpsynth.methods.registry import methods_summary

_STAGE_NAMES = {
    "own": "the method's own mechanism",
    "frequency_model": "the shared frequency model",
    "central_images": "the central images",
    "dp_teacher": "the DP teacher",
}


def _stage_rows(stages: dict[str, float] | None) -> list[tuple[str, str]]:
    """One 'ε split' line when shared stages take part of the budget (none otherwise)."""
    if not stages or set(stages) == {"own"}:
        return []
    parts = [f"{_STAGE_NAMES.get(name, name)} {share:.0%}" for name, share in stages.items()]
    return [("ε split", ", ".join(parts))]


def _thread_advice(device: str) -> list[str]:
    """Advice to use one thread when training on a CPU that other work already keeps busy."""
    import torch

    from dpsynth.threads import busy_machine_advice

    if device == "cuda" or (device == "auto" and torch.cuda.is_available()):
        return []
    advice = busy_machine_advice(torch.get_num_threads())
    return [advice] if advice else []


def parse_sets(items: list[str] | None) -> dict[str, str]:
    """`--set key=value` items as a dict (UsageError for an item without "=")."""
    out: dict[str, str] = {}
    for item in items or []:
        if "=" not in item:
            raise UsageError(f"--set takes key=value, got {item!r}")
        key, value = item.split("=", 1)
        out[key.strip()] = value.strip()
    return out


@app.command()
@handle_errors
@threads_option
def train(
    out: Annotated[Path, typer.Option("--out", help="Run directory to create (or resume).")],
    method: Annotated[
        str | None,
        typer.Option(
            help=f"Backend: {methods_summary()}; or auto: the recommendation for the data's "
            "public shape and ε (see docs/methods/)."
        ),
    ] = None,
    data: Annotated[str | None, typer.Option(help="Data spec (see `dpsynth data list`).")] = None,
    epsilon: Annotated[
        str | None,
        typer.Option(help="Total ε for the dataset after this run, or 'inf' (not private)."),
    ] = None,
    delta: Annotated[
        float | None, typer.Option(help="δ [default: the largest power of ten ≤ 1/(10N)].")
    ] = None,
    preset: Annotated[
        str,
        typer.Option(
            help="A preset of the method (see docs/methods/), or a tier: auto, the method's "
            "recommendation for the data's public shape and size at the target ε (minutes); "
            "quality, its slower preset where it has one (within an hour on 2 cores)."
        ),
    ] = "auto",
    seed: Annotated[
        int,
        typer.Option(
            help="Seed for public randomness only (weight initialisation, preview). Batches "
            "and DP noise come from a fresh secret seed kept in RUN/private/."
        ),
    ] = 0,
    resume: Annotated[bool, typer.Option("--resume", help="Continue the run in --out.")] = False,
    log_private_loss: Annotated[
        bool,
        typer.Option(
            "--log-private-loss",
            help="Write the losses of private batches (computed without noise) to "
            "train-loss.jsonl in RUN/private/ and show them in the progress bar. Not private: "
            "never publish them.",
        ),
    ] = False,
    overrides: Annotated[
        list[str] | None, typer.Option("--set", help="Override a preset value: key=value.")
    ] = None,
    image_size: Annotated[int | None, typer.Option(help="Resize images to this size.")] = None,
    dataset_id: Annotated[
        str | None, typer.Option(help="Ledger id of the data [default: from the spec].")
    ] = None,
    public_size: Annotated[
        int | None,
        typer.Option(
            "--public-size",
            help="A public upper bound N' on the record count, used instead of the count "
            "itself for the sampling rate, the default δ and everything written (for when the "
            "number of records is itself sensitive).",
        ),
    ] = None,
    classes: ClassesOpt = None,
    channels: ChannelsOpt = None,
    schema: Annotated[
        Path | None,
        typer.Option(help="Tables: the schema JSON [default: a built-in table's own]."),
    ] = None,
    schema_public: Annotated[
        bool,
        typer.Option(
            "--schema-public",
            help="Tables: declare the schema's entries read off the data public (your statement).",
        ),
    ] = False,
    schema_epsilon: Annotated[
        float | None,
        typer.Option(
            "--schema-epsilon",
            help="Tables: release the schema's entries read off the data with DP, spending this "
            "ε (part of --epsilon, recorded in the ledger before training) [default, when there "
            "are such entries: 50% of --epsilon for mst, aim and auto, whose 1-way marginals are "
            "the release's own; 25% for other methods].",
        ),
    ] = None,
    class_weights_epsilon: Annotated[
        float | None,
        typer.Option(
            "--class-weights-epsilon",
            help="Tables: release the target's class proportions (its 'weights') with DP, "
            "spending this ε (part of --epsilon, recorded in the ledger before training).",
        ),
    ] = None,
    privacy_unit: Annotated[
        str | None,
        typer.Option(
            "--privacy-unit",
            help="Tables: the column that names a person (patient, customer); the guarantee "
            "is then per person with all their rows, not per row. Needs --max-rows-per-unit.",
        ),
    ] = None,
    max_rows_per_unit: Annotated[
        int | None,
        typer.Option(
            "--max-rows-per-unit",
            help="Tables: the most rows one --privacy-unit keeps (public; drawn at random with "
            "secret randomness; every mechanism's noise is scaled for this many rows).",
        ),
    ] = None,
    public: Annotated[
        str | None,
        typer.Option(
            "--public",
            help="Images you declare public and non-sensitive (a data spec, as --data), "
            "brought to the data's channels and size and pretrained on before any private "
            "step, at no privacy cost (pge, dpkernel, the DP teacher). Recorded in config.json "
            "and the ledger; refused when it is the private data.",
        ),
    ] = None,
    engine: Annotated[
        str,
        typer.Option(
            help="Tables (mst, aim): where the marginals are counted: memory, duckdb (out of "
            "core: CSV or Parquet, a partitioned folder or a glob), dask://HOST:PORT (a Dask "
            "cluster), dask+tls://HOST:PORT (one over TLS: see --tls-ca-file), or auto: "
            "memory when the table fits the memory budget, else duckdb.",
        ),
    ] = "auto",
    memory_budget: Annotated[
        str | None,
        typer.Option(
            "--memory-budget",
            help="Tables: the memory that --engine auto and duckdb keep to (bytes, or 512M, "
            "4G) [default: $DPSYNTH_MEMORY_BUDGET, else half the machine's memory].",
        ),
    ] = None,
    workers: Annotated[
        int | None,
        typer.Option(
            help="Tables counted out of core: the processes counting a Parquet source's parts "
            "(duckdb; a CSV is read by one) or the most counting tasks in flight on a Dask "
            "cluster [default: the CPUs; every task]. The counts, and the release, do not "
            "depend on it.",
        ),
    ] = None,
    tls_ca_file: Annotated[
        Path | None,
        typer.Option(
            "--tls-ca-file",
            help="--engine dask+tls://: the cluster's CA certificate (PEM), as `dask "
            "scheduler --tls-ca-file` [default: Dask's TLS configuration].",
        ),
    ] = None,
    tls_cert: Annotated[
        Path | None,
        typer.Option(
            "--tls-cert",
            help="--engine dask+tls://: this client's certificate (PEM; Dask's TLS is mutual) "
            "[default: Dask's TLS configuration].",
        ),
    ] = None,
    tls_key: Annotated[
        Path | None,
        typer.Option(
            "--tls-key",
            help="--engine dask+tls://: the certificate's private key, unless it is in "
            "--tls-cert's file [default: Dask's TLS configuration].",
        ),
    ] = None,
    checkpoint_every_s: Annotated[
        float, typer.Option("--checkpoint-every", help="Seconds between checkpoints.")
    ] = 120.0,
    device: DeviceOpt = "auto",
    ledger: LedgerOpt = None,
    as_json: JsonOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Train a generator under DP; the spend is reserved in the ledger before any data is read.

    Under torchrun (`torchrun --nproc-per-node N --no-python dpsynth train ...`) it trains
    data-parallel with the same mechanism and accounting; rank 0 alone writes and prints.
    """
    # The parameters are the request's fields by name (tests/training/test_request_surface.py),
    # and the two that say how to show the result.
    fields = dict(locals())
    from dpsynth.api import train as train_api
    from dpsynth.distributed import is_main_process

    del fields["as_json"], fields["quiet"]
    fields["overrides"] = parse_sets(overrides)
    # --resume without --ledger (or $DPSYNTH_LEDGER): the run's recorded ledger.
    recorded = resume and ledger is None and not os.environ.get("DPSYNTH_LEDGER")
    fields["ledger"] = None if recorded else resolve_ledger_path(ledger)
    # Under torchrun only rank 0 shows progress and the result; the other ranks are quiet.
    main_rank = is_main_process()
    show = show_progress(quiet, as_json) and main_rank
    if main_rank and not as_json and interactive():
        print_remarks(_thread_advice(device))
    with progress_bar(show, "train") as bar:
        # The bar, and (unless --quiet) a line on stderr as soon as a first signal asks for a
        # stop: the loop honours it only after the step in progress.
        view = TrainProgressView(bar, tell_stops=not quiet and main_rank)
        trained = train_api(**fields, progress=view)
    if not main_rank or trained is None:
        return
    result = trained.to_json()
    if as_json:
        emit_json(result)
        return
    print_warnings(list(result.get("warnings", [])))
    print_remarks(list((result.get("public") or {}).get("notes", [])))
    if result.get("already_finished"):
        stdout.print(
            f"{out}: this run already finished ({result['steps']} steps); nothing to do",
            markup=False,
        )
    if result.get("privacy_label"):
        privacy = f"NOT PRIVATE ({result['privacy_label']})"
    elif not result["private"]:
        privacy = "NOT PRIVATE (--epsilon inf: no clipping, no noise)"
    else:
        privacy = f"(ε ≤ {fmt_eps(result['epsilon'])}, δ = {result['delta']:g})-DP"
        from dpsynth.ledger.anchors import unit_phrase

        privacy += unit_phrase(result.get("privacy_unit"))
    rows = [
        ("run", result["run"]),
        ("method / preset", f"{result['method']} / {result['preset']}"),
        ("privacy", privacy),
        ("steps", f"{result['steps']} of {result['total_steps']}"),
        ("mechanisms", "; ".join(result["mechanisms"])),
        ("dataset total ε", fmt_eps(result["dataset_total_epsilon"])),
        ("accountant", result["accountant"]),
        *_stage_rows(result.get("stages")),
        ("ledger entry", f"seq {result['ledger_seq']} ({result['ledger_status']})"),
    ]
    if result.get("privacy_unit") and result["privacy_unit"].get("unit_sizes"):
        shares = result["privacy_unit"]["unit_sizes"]
        rows.append(
            (
                "rows per unit (DP)",
                ", ".join(f"{k + 1}: {share:.0%}" for k, share in enumerate(shares)),
            )
        )
    if result.get("schema_release"):
        release = result["schema_release"]
        columns = len(release["released_columns"])
        parts = [f"{columns} column(s)"] if columns else []
        if release.get("class_weights"):
            shares = ", ".join(f"{w:.3g}" for w in release["class_weights"]["weights"])
            parts.append(f"class weights ({shares})")
        if release.get("unit_sizes"):
            parts.append("rows per unit")
        default = (
            f"; the default, {release['default_share']:.0%} of --epsilon: --schema-epsilon E "
            "sets it, --schema-public declares the entries public instead"
            if release.get("default_share")
            else ""
        )
        rows.append(
            (
                "schema release",
                f"{' + '.join(parts)}, ε ≤ {release['epsilon']:.4g} "
                f"(ledger seq {release['ledger_seq']}{default})",
            )
        )
        # what the release kept, merged or dropped, one line a column
        rows.extend(("  released", line) for line in release.get("columns", ()))
    if result.get("public"):
        used = result["public"]
        labels = "labelled" if used["labelled"] else "unlabelled"
        rows.append(
            (
                "public input (no ε)",
                f"{used['spec']}: {used['n']} images, {labels}, {used['transform']}; "
                f"pretrained: {', '.join(used['used_by'])}",
            )
        )
    if result.get("pass_names"):  # an engine's passes, each named (`check, N marginals`, …)
        names = "; ".join(result["pass_names"])
        rows.append(("passes over the data", f"{result['passes']} ({result['engine']}): {names}"))
    elif result.get("passes") is not None:
        rows.append(("passes over the data", f"{result['passes']} counting ({result['engine']})"))
    if result.get("preview"):
        rows.append(("preview", result["preview"]))
    print_kv("train", rows)
