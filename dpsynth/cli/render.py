"""The one place that renders: rich tables and progress bars for people, one JSON document
for `--json`, warnings on stderr. Command modules build their output and call these.

Tables go through `print_kv` and `print_rows`: on a terminal they are rich tables, fitted to
its width (a long value wraps inside its cell); when stdout is not a terminal (a pipe, a file,
a test's runner) they are plain text, never cut: `key: value` lines, or tab-separated rows
under a header line. rich would otherwise fit them to 80 columns and cut values with "…"
(`ledger show | cat` printed `relea…`)."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:  # the training package imports torch: only its types are needed here
    from dpsynth.data.engines import PassProgress
    from dpsynth.training.progress import StopNotice, TrainProgress

stdout = Console(soft_wrap=True)
stderr = Console(stderr=True, soft_wrap=True)


def emit_json(obj: Any) -> None:
    """Print `obj` as the one JSON document on stdout (`--json`)."""
    sys.stdout.write(json.dumps(json_ready(obj), indent=2) + "\n")


def json_ready(obj: Any) -> Any:
    """`obj` with paths as strings and non-finite floats as "inf"/"-inf"/"nan"."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return "inf" if obj > 0 else ("-inf" if obj < 0 else "nan")
    if isinstance(obj, dict):
        return {str(k): json_ready(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_ready(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    return obj


def show_progress(quiet: bool, as_json: bool) -> bool:
    """Whether to draw progress bars: not quiet, not --json, and both streams a terminal."""
    return not quiet and not as_json and sys.stdout.isatty() and sys.stderr.isatty()


def interactive() -> bool:
    """Whether stderr is a terminal: advice meant for a person watching (never in a log or a
    pipeline's captured stderr, whose lines stay the same on any machine)."""
    return sys.stderr.isatty()


def fmt_eps(value: Any) -> str:
    """An ε for people: four significant digits, or ∞ (not private)."""
    if value in (None, "inf") or (isinstance(value, float) and math.isinf(value)):
        return "∞ (not private)"
    return f"{float(value):.4g}"


def stdout_is_terminal() -> bool:
    """Whether stdout is a terminal (a pipe, a file or a test's runner is not)."""
    isatty = getattr(stdout.file, "isatty", None)
    return bool(isatty and isatty())


def print_kv(title: str, rows: list[tuple[str, Any]]) -> None:
    """A titled list of key/value pairs on stdout: a two-column rich table on a terminal,
    else the title and one `key: value` line per pair, in full."""
    if not stdout_is_terminal():
        _write_plain([title, *(f"{key}: {_one_line(value)}" for key, value in rows)])
        return
    table = Table(title=title, show_header=False, title_justify="left")
    # fold, not the default ellipsis: a long word wraps inside its cell instead of being cut.
    table.add_column(style="bold", overflow="fold")
    table.add_column(overflow="fold")
    for key, value in rows:
        # Text, not a str: a value is data (a path, an id), never rich markup.
        table.add_row(Text(str(key)), Text(str(value)))
    stdout.print(table)


def print_rows(title: str, columns: list[str], rows: list[list[Any]]) -> None:
    """A titled table on stdout: rich on a terminal, else the title, the header and one
    tab-separated line per row, in full (for `cut -f`, `grep`, `awk -F'\\t'`)."""
    if not stdout_is_terminal():
        lines = [title, "\t".join(columns)]
        lines += ["\t".join(_one_line(cell) for cell in row) for row in rows]
        _write_plain(lines)
        return
    table = Table(title=title, title_justify="left")
    for column in columns:
        # A value too long for its share of the width wraps inside its cell (never "…", which
        # made two ids that differ at the end look alike); short headers stay whole.
        table.add_column(column, overflow="fold", min_width=min(len(column), 7))
    for row in rows:
        table.add_row(*(Text(str(cell)) for cell in row))
    stdout.print(table)


def _one_line(value: Any) -> str:
    """A cell for a tab-separated line: tabs and line breaks become spaces."""
    return " ".join(str(value).replace("\t", " ").splitlines())


def _write_plain(lines: list[str]) -> None:
    stdout.file.write("".join(f"{line}\n" for line in lines))
    stdout.file.flush()


def print_warnings(lines: list[str]) -> None:
    """Each line as `warning: ...` on stderr."""
    for line in lines:
        stderr.print(f"[yellow]warning:[/yellow] {escape(line)}", highlight=False)


def print_remarks(lines: list[str]) -> None:
    """Each line as `note: ...` on stderr (what a command decided that the user should see)."""
    for line in lines:
        stderr.print(f"[cyan]note:[/cyan] {escape(line)}", highlight=False)


@contextmanager
def progress_bar(enabled: bool, description: str) -> Iterator[Progress | None]:
    """A rich progress bar on stderr while the block runs, or None when not `enabled`."""
    if not enabled:
        yield None
        return
    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=stderr,
        transient=False,
    )
    with progress:
        yield progress


class TrainProgressView:
    """What `train` shows while its loop runs: the bar's steps, ε (and the private loss when
    the owner asked for it), and one line on stderr as soon as a first SIGINT or SIGTERM
    arrives, since the loop stops only after the step in progress (minutes for an AIM round).
    The line goes to stderr (`--json` keeps stdout to its one document), and not at all with
    `tell_stops` False (`--quiet`: the interruption is then its one line at the end)."""

    def __init__(self, bar: Progress | None, tell_stops: bool = True) -> None:
        self.bar = bar
        self.tell_stops = tell_stops
        self.task: Any = None
        self.passes: dict[int, Any] = {}

    def __call__(self, report: TrainProgress) -> None:
        """One progress report of the loop: the bar moves (nothing without a bar)."""
        if self.bar is None:
            return
        if self.task is None:
            self.task = self.bar.add_task("train", total=report.total_steps, info="")
        eps = "ε=∞ (not private)" if math.isinf(report.epsilon) else f"ε≤{report.epsilon:.3g}"
        # The loss is shown only when the owner asked for it (--log-private-loss).
        loss = "" if report.loss is None else f"loss {report.loss:.4g}  "
        self.bar.update(self.task, completed=report.step, info=f"{loss}{eps}")

    def on_pass(self, report: PassProgress) -> None:
        """One report of a pass over a table by an out-of-core engine: a bar per pass on a
        terminal, one line per finished pass on stderr otherwise (not with `--quiet`)."""
        if self.bar is None:
            if report.done and self.tell_stops:
                what = report.what or (f"{report.cliques} marginals" if report.cliques else "check")
                stderr.print(
                    f"pass {report.index} ({report.engine}, {what}): {report.rows:,} rows in "
                    f"{report.seconds:.1f} s",
                    markup=False,
                    highlight=False,
                )
            return
        total = report.total_rows if report.total_rows >= 0 else None
        if report.index not in self.passes:
            label = f"pass {report.index}"
            self.passes[report.index] = self.bar.add_task(label, total=total, info=report.engine)
        self.bar.update(self.passes[report.index], completed=report.rows, total=total)

    def on_stop_request(self, notice: StopNotice) -> None:
        """Called from the signal handler (see `dpsynth.training.progress.stop_callback`)."""
        if not self.tell_stops:
            return
        stderr.print(
            f"{notice.signal}: stopping after the step in progress ({notice.steps_done} of "
            f"{notice.total_steps} done), then writing a checkpoint… (a second signal stops "
            "at once; the spend stays counted)",
            markup=False,
            highlight=False,
        )
