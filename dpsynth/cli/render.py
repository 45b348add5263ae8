"""The one place that renders: rich tables and progress bars for people, one JSON document
for `--json`, warnings on stderr. Command modules build their output and call these."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

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


def fmt_eps(value: Any) -> str:
    """An ε for people: four significant digits, or ∞ (not private)."""
    if value in (None, "inf") or (isinstance(value, float) and math.isinf(value)):
        return "∞ (not private)"
    return f"{float(value):.4g}"


def kv_table(title: str, rows: list[tuple[str, Any]]) -> Table:
    """A two-column key/value table."""
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    for key, value in rows:
        table.add_row(key, str(value))
    return table


def print_warnings(lines: list[str]) -> None:
    """Each line as `warning: ...` on stderr."""
    for line in lines:
        stderr.print(f"[yellow]warning:[/yellow] {escape(line)}", highlight=False)


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
