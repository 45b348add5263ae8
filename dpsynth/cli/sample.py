"""`dpsynth sample`: synthetic images from a trained run (post-processing)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from dpsynth.cli.app import DebugOpt, DeviceOpt, JsonOpt, LedgerOpt, QuietOpt, app, handle_errors
from dpsynth.cli.render import emit_json, progress_bar, show_progress, stdout


@app.command()
@handle_errors
def sample(
    run: Annotated[Path, typer.Argument(help="A run directory written by `train`.")],
    n: Annotated[int, typer.Option("--n", help="Number of records to generate.")],
    out: Annotated[
        Path,
        typer.Option(
            "--out",
            help="Output folder (images), or a table's file: CSV, or Parquet when it ends in "
            ".parquet.",
        ),
    ],
    fmt: Annotated[
        str | None,
        typer.Option(
            "--format",
            help="png or npz for images [png]; csv or parquet for tables [by the --out name].",
        ),
    ] = None,
    labels: Annotated[
        str,
        typer.Option(
            help="auto (the default: model for aim and mst, else balanced), balanced, "
            "per-class counts a,b,c,... summing to --n, or (tables) weights: the target's "
            "class proportions in the run's schema (declared or DP-released), or (aim, mst) "
            "model: the class proportions the model fitted."
        ),
    ] = "auto",
    batch_size: Annotated[int, typer.Option(help="Images generated at once.")] = 500,
    seed: Annotated[int, typer.Option(help="Sampling seed.")] = 0,
    truncation: Annotated[
        float | None,
        typer.Option(
            help="Scale of the generator's latent z (dpkernel, dpaf, rdpgan, freq): below 1 "
            "fewer odd samples, less diversity. Default: the run's `sample_truncation`."
        ),
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace a non-empty --out.")] = False,
    partial: Annotated[
        bool,
        typer.Option(
            "--partial",
            help="Release the checkpoint of a run whose training did not finish (refused "
            "otherwise); the manifest and its privacy statement say it is a partial release.",
        ),
    ] = False,
    device: DeviceOpt = "auto",
    ledger: LedgerOpt = None,
    as_json: JsonOpt = False,
    quiet: QuietOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Write synthetic images (or table rows as CSV or Parquet) from a trained run
    (post-processing: no privacy cost)."""
    from dpsynth.sampling import sample_run

    show = show_progress(quiet, as_json)
    with progress_bar(show, "sample") as bar:
        task = bar.add_task("sample", total=n, info="") if bar is not None else None

        def on_progress(done: int, total: int) -> None:
            if bar is not None and task is not None:
                bar.update(task, completed=done)

        result = sample_run(
            run,
            n,
            out,
            fmt=fmt,
            labels=labels,
            batch_size=batch_size,
            seed=seed,
            device=device,
            force=force,
            ledger_path=ledger,
            progress=on_progress,
            truncation=truncation,
            partial=partial,
        )
    if as_json:
        emit_json(result)
        return
    what = "rows" if result.get("modality") == "table" else "images"
    if result.get("replaced"):
        earlier = (
            f"{result['out']} and {result['manifest']}"
            if result.get("manifest")
            else (result["out"])
        )
        stdout.print(f"replaced the earlier sample output {earlier} (--force)")
    stdout.print(
        f"wrote {result['n']} {what} to {result['out']} ({result['format']}); "
        f"{result['privacy']}; sha256 {result['output_sha256']}",
        markup=False,
    )
