"""`dpsynth sample`: synthetic images from a trained run (post-processing)."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Annotated

import typer

from dpsynth.cli.app import app, handle_errors, threads_option
from dpsynth.cli.options import DeviceOpt, JsonOpt, LedgerOpt, QuietOpt
from dpsynth.cli.render import emit_json, progress_bar, show_progress, stderr, stdout
from dpsynth.errors import UsageError

_SCALES = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "b": 10**9}
_COUNT = re.compile(
    r"^(?P<number>[0-9][0-9_]*(?:\.[0-9_]*)?(?:e[+]?[0-9]{1,3})?)(?P<scale>[kmgb]?)$"
)


def parse_count(text: str, flag: str = "--n") -> int:
    """A record count as people write it: `1000000`, `1_000_000`, `1e6`, `2.5e6`, `10k`, `10M`,
    `1G` or `1B` (10⁹), case-insensitive; it must be a whole number (UsageError otherwise)."""
    found = _COUNT.match(text.strip().lower())
    value = None
    if found:
        try:
            value = Decimal(found["number"].replace("_", "")) * _SCALES[found["scale"]]
        except InvalidOperation:
            value = None
    if value is None or value != value.to_integral_value():
        raise UsageError(
            f"{flag} {text}: give a whole number of records, e.g. 1000000, 1_000_000, 1e6 or 1M"
        )
    return int(value)


def _count_option(text: str) -> int:
    """`--n` as click parses an option: a bad count is click's "Invalid value for '--n'"."""
    try:
        return parse_count(str(text))
    except UsageError:
        raise typer.BadParameter(
            f"{text!r} is not a whole number of records (e.g. 1000000, 1_000_000, 1e6 or 1M)"
        ) from None


@app.command()
@handle_errors
@threads_option
def sample(
    run: Annotated[Path, typer.Argument(help="A run directory written by `train`.")],
    n: Annotated[
        int,
        typer.Option(
            "--n",
            parser=_count_option,
            metavar="N",
            help="Number of records to generate: 1000000, 1_000_000, 1e6 or 1M (k, M, G/B).",
        ),
    ],
    out: Annotated[
        str,
        typer.Option(
            "--out",
            metavar="PATH",
            help="Output folder (images), or a table's file: CSV, or Parquet when it ends in "
            ".parquet; a folder (or more than a million Parquet rows) is a partitioned "
            "Parquet release.",
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
    batch_size: Annotated[
        int | None,
        typer.Option(
            help="Records generated at once [default: 500; in a partitioned table release "
            "65,536 for aim and mst, 10,000 for the others]."
        ),
    ] = None,
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
    partitions: Annotated[
        int | None,
        typer.Option(
            help="Tables: write a partitioned Parquet folder of this many part files "
            "[default: one per million rows]; with --seed it fixes the release's rows.",
        ),
    ] = None,
    workers: Annotated[
        int | None,
        typer.Option(
            help="Tables, partitioned Parquet: worker processes writing partitions, one "
            "thread each [default: the CPUs]; the rows do not depend on it.",
        ),
    ] = None,
    device: DeviceOpt = "auto",
    ledger: LedgerOpt = None,
    as_json: JsonOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Write synthetic images (or table rows as CSV or Parquet) from a trained run
    (post-processing: no privacy cost)."""
    from dpsynth.api import sample as sample_api

    show = show_progress(quiet, as_json)
    with progress_bar(show, "sample") as bar:
        task = bar.add_task("sample", total=n, info="") if bar is not None else None

        def on_progress(done: int, total: int) -> None:
            if bar is not None and task is not None:
                bar.update(task, completed=done)

        def on_partition(parts_done: int, parts: int, done: int, total: int) -> None:
            # A bar says which partition; without one (piped, a log) one line per partition.
            if bar is not None and task is not None:
                bar.update(task, info=f"partitions {parts_done}/{parts}")
            elif not quiet and not as_json:
                stderr.print(
                    f"sample: partition {parts_done}/{parts} written, {done:,} of {total:,} rows",
                    markup=False,
                    highlight=False,
                )

        result = sample_api(
            run,
            n,
            out,
            fmt=fmt,
            labels=labels,
            batch_size=batch_size,
            seed=seed,
            device=device,
            force=force,
            ledger=ledger,
            progress=on_progress,
            truncation=truncation,
            partial=partial,
            partitions=partitions,
            workers=workers,
            on_partition=on_partition,
        ).to_json()
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
    layout = result["format"]
    if isinstance(result.get("partitions"), list):
        layout = f"{layout}, {len(result['partitions'])} partitions, {result['workers']} workers"
    stdout.print(
        f"wrote {result['n']} {what} to {result['out']} ({layout}); "
        f"{result['privacy']}; sha256 {result['output_sha256']}",
        markup=False,
    )
