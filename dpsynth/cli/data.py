"""`dpsynth data list|inspect`: the built-in data sets and the public facts of a spec."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from dpsynth.cli.app import ChannelsOpt, ClassesOpt, DebugOpt, JsonOpt, app, handle_errors
from dpsynth.cli.render import emit_json, kv_table, stdout

data_app = typer.Typer(help="List built-in data sets and inspect data specs.")
app.add_typer(data_app, name="data", no_args_is_help=True)


@data_app.command("list")
@handle_errors
def data_list(as_json: JsonOpt = False, debug: DebugOpt = False) -> None:
    """Built-in real data sets (no download needed)."""
    from dpsynth.data.sources import list_builtin

    items = list_builtin()
    if as_json:
        emit_json(items)
        return
    table = Table(title="built-in data sets", title_justify="left")
    for column in ("name", "records (train/test)", "shape", "classes", "description"):
        table.add_column(column)
    for item in items:
        table.add_row(
            item["name"],
            f"{item['n']}/{item['n_test']}",
            "x".join(map(str, item["shape"])),
            str(len(item["classes"])),
            item.get("description", ""),
        )
    stdout.print(table)
    stdout.print(
        "Your own data: mnist:DIR[:test] (IDX files), folder:DIR (one sub-folder per class), "
        "npz:FILE (x, y arrays; a `classes` array or --classes a,b,...: the label set is public)."
    )


@data_app.command("inspect")
@handle_errors
def data_inspect(
    spec: Annotated[str, typer.Argument(help="A data spec, e.g. digits or folder:DIR.")],
    image_size: Annotated[int | None, typer.Option(help="Resize images to this size.")] = None,
    classes: ClassesOpt = None,
    channels: ChannelsOpt = None,
    as_json: JsonOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Public facts about a data set (size, shape, classes, fingerprint); no statistics."""
    from dpsynth.data.sources import inspect_data, parse_classes

    info = inspect_data(
        spec, image_size=image_size, classes=parse_classes(classes), channels=channels
    )
    if as_json:
        emit_json(info)
        return
    rows = [
        ("spec", info["spec"]),
        ("kind", info["kind"]),
        ("records", info["n"]),
        ("shape [C,H,W]", info["shape"]),
        ("classes", ", ".join(info["classes"])),
        ("dataset id", info["dataset_id"]),
        ("fingerprint", info["fingerprint"]),
    ]
    stdout.print(kv_table("data", rows))
