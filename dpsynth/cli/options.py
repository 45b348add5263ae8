"""The options that several commands share, as the `Annotated` types their parameters take
(`--json`, `--ledger`, `--quiet`, `--device`, `--classes`, `--channels`), and the two that
`app.handle_errors` and `app.threads_option` give a command themselves (`--debug`,
`--threads`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document, nothing else.")]
LedgerOpt = Annotated[
    Path | None,
    typer.Option(
        "--ledger",
        help="Ledger file [default: $DPSYNTH_LEDGER or ./dpsynth-ledger.jsonl].",
        show_default=False,
        # The ledger reports an unreadable file itself (exit 4, one line), as for data.
        readable=False,
    ),
]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="No progress bars.")]
DebugOpt = Annotated[bool, typer.Option("--debug", help="Show tracebacks on errors.")]
DeviceOpt = Annotated[str, typer.Option("--device", help="auto, cpu or cuda.")]


def _apply_threads(value: int | None) -> int | None:
    """`--threads` takes effect as soon as it is parsed, before the command imports its work."""
    if value is not None:
        from dpsynth.threads import limit_threads

        limit_threads(value)
    return value


ThreadsOpt = Annotated[
    int | None,
    typer.Option(
        "--threads",
        metavar="N",
        envvar="DPSYNTH_THREADS",
        min=1,
        callback=_apply_threads,
        show_default=False,
        help="CPU threads for the numeric work [default: $DPSYNTH_THREADS, else torch's one a "
        "core]; on a machine busy with other jobs, 1 is often several times faster.",
    ),
]
ClassesOpt = Annotated[
    str | None,
    typer.Option(
        "--classes",
        help="The public label set a,b,... (needed for an npz: file without a stored classes "
        "array).",
    ),
]
ChannelsOpt = Annotated[
    int | None,
    typer.Option(
        "--channels", help="Convert images to 1 or 3 channels (needed for mixed folders)."
    ),
]
