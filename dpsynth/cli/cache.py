"""`dpsynth cache show|clear`: the opt-in cache of real-set Inception features that `evaluate
--cache-real-features` fills (per-record features of the real data: the data owner's)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import typer

from dpsynth.cli.app import app, handle_errors
from dpsynth.cli.options import DebugOpt, JsonOpt
from dpsynth.cli.render import emit_json, print_kv
from dpsynth.data.limits import fmt_bytes

if TYPE_CHECKING:
    from dpsynth.evaluation.feature_cache import CacheContents

cache_app = typer.Typer(
    help="Show or clear the real-set features that `evaluate --cache-real-features` keeps."
)
app.add_typer(cache_app, name="cache", no_args_is_help=True)


@cache_app.command("show")
@handle_errors
def cache_show(as_json: JsonOpt = False, debug: DebugOpt = False) -> None:
    """Where the feature cache is ($DPSYNTH_CACHE_DIR/fid, else ~/.cache/dpsynth/fid), how
    many files it holds and their size."""
    from dpsynth.evaluation.feature_cache import show_cache

    _render(show_cache(), as_json, "feature cache", "files")


@cache_app.command("clear")
@handle_errors
def cache_clear(as_json: JsonOpt = False, debug: DebugOpt = False) -> None:
    """Remove every cached feature file (and the folder, when nothing else is in it); prints
    how many files and bytes it removed."""
    from dpsynth.evaluation.feature_cache import clear_cache

    _render(clear_cache(), as_json, "feature cache cleared", "removed")


def _render(contents: CacheContents, as_json: bool, title: str, what: str) -> None:
    """The folder and how many files and bytes (never the names: hashes of data digests), or
    with `--json` the contents' JSON document."""
    if as_json:
        emit_json(contents.to_json())
        return
    origin = "default" if contents.set_by == "default" else f"from ${contents.set_by}"
    size = f"{contents.bytes:,} bytes"
    if contents.bytes >= 1024:
        size = f"{fmt_bytes(contents.bytes)}, {size}"
    rows: list[tuple[str, Any]] = [
        ("folder", f"{contents.folder} ({origin})"),
        (what, f"{contents.count} ({size})"),
    ]
    print_kv(title, rows)
