"""`dpsynth data list|inspect`: the built-in data sets and the public facts of a spec."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from dpsynth.cli.app import app, handle_errors, resolve_ledger_path
from dpsynth.cli.options import ChannelsOpt, ClassesOpt, JsonOpt, LedgerOpt
from dpsynth.cli.render import emit_json, print_kv, print_remarks, print_rows, stdout
from dpsynth.errors import UsageError

if TYPE_CHECKING:
    from dpsynth.data.schema import Schema

data_app = typer.Typer(help="List built-in data sets and inspect data specs.")
app.add_typer(data_app, name="data", no_args_is_help=True)


@data_app.command("list")
@handle_errors
def data_list(as_json: JsonOpt = False) -> None:
    """Built-in real data sets (no download needed)."""
    from dpsynth.data.sources import list_builtin, list_builtin_tables

    items = list_builtin()
    tables = list_builtin_tables()
    if as_json:
        emit_json([*items, *tables])
        return
    print_rows(
        "built-in data sets",
        ["name", "records (train/test)", "shape", "classes", "description"],
        [
            [
                item["name"],
                f"{item['n']}/{item['n_test']}",
                "x".join(map(str, item["shape"])),
                str(len(item["classes"])),
                item.get("description", ""),
            ]
            for item in items
        ],
    )
    print_rows(
        "built-in tables",
        ["name", "rows (train/test)", "columns", "target (classes)", "description"],
        [
            [
                item["name"],
                f"{item['n']}/{item['n_test']}",
                str(item["columns"]),
                f"{item['target']} ({', '.join(item['classes'])})",
                item.get("description", ""),
            ]
            for item in tables
        ],
    )
    stdout.print(
        "Your own data: mnist:DIR[:test] (IDX files), folder:DIR (one sub-folder per class), "
        "npz:FILE (x, y arrays; a `classes` array or --classes a,b,...: the label set is public), "
        "csv:FILE or parquet:FILE with --schema FILE.json (draft one with "
        "`dpsynth data schema csv:FILE`).",
        markup=False,
    )


@data_app.command("inspect")
@handle_errors
def data_inspect(
    spec: Annotated[str, typer.Argument(help="A data spec, e.g. digits or folder:DIR.")],
    image_size: Annotated[int | None, typer.Option(help="Resize images to this size.")] = None,
    classes: ClassesOpt = None,
    channels: ChannelsOpt = None,
    schema: Annotated[Path | None, typer.Option(help="Tables: the schema JSON.")] = None,
    ledger: LedgerOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Public facts about a data set (size, shape, classes), and its fingerprint as the ledger
    keys it (when the ledger has a key); no statistics."""
    from dpsynth.data.schema_file import read_schema
    from dpsynth.data.sources import inspect_data, parse_classes
    from dpsynth.ledger import Ledger

    info = inspect_data(
        spec,
        image_size=image_size,
        classes=parse_classes(classes),
        channels=channels,
        schema=read_schema(schema) if schema is not None else None,
    )
    # The plain content digest is a membership test: only its keyed form is shown.
    digest = info.pop("content_digest")
    info["fingerprint"] = Ledger(resolve_ledger_path(ledger)).data_fingerprint(digest, create=False)
    if as_json:
        emit_json(info)
        return
    rows = [
        ("spec", info["spec"]),
        ("kind", info["kind"]),
        ("records", info["n"]),
        (
            "shape [D] (encoded)" if info.get("modality") == "table" else "shape [C,H,W]",
            info["shape"],
        ),
        ("classes", ", ".join(info["classes"])),
        ("dataset id", info["dataset_id"]),
        ("ledger fingerprint", info["fingerprint"] or "none yet (the ledger has no key)"),
    ]
    print_kv("data", rows)


@data_app.command("schema")
@handle_errors
def data_schema(
    spec: Annotated[
        str,
        typer.Argument(
            help="A table: csv:FILE, parquet:FILE|FOLDER|GLOB (or a built-in table); a large "
            "one is drafted from a uniform sample of its rows."
        ),
    ],
    target: Annotated[
        str | None, typer.Option(help="The target (label) column [default: the last one].")
    ] = None,
    epsilon: Annotated[
        float,
        typer.Option(
            help="The --epsilon you plan to train at: the notes say which columns its default "
            "DP schema release (70% of it for mst and aim) would lose, and what keeps them."
        ),
    ] = 1.0,
    as_json: JsonOpt = False,
) -> None:
    """Draft a schema (JSON on stdout) for you to review: every bound, edge, category list and
    missing flag it read off the data is marked "source": "data (not private: review or
    replace)". One line on stderr per column typed as an identifier, free text, a shortened
    category list, a clock (HHMM times of day) or an empty column; for an identifier that
    repeats (a person with several rows), its rows per unit and a --max-rows-per-unit to start
    from, read off the data for your eyes only (never in the JSON)."""
    from dpsynth.data.engines.sample import draft_rows
    from dpsynth.data.schema_draft import draft_table

    if not (epsilon > 0 and epsilon != float("inf")):  # before the table is read
        raise UsageError(
            f"{{epsilon}} must be a positive number, got {epsilon}", parameter="epsilon"
        )

    # a large table (or a partitioned folder, a glob) is drafted from a uniform sample
    raw, sampled = draft_rows(spec)
    drafted, remarks = draft_table(raw.header, raw.columns, target or raw.header[-1])
    remarks = [*([sampled] if sampled else []), *remarks]
    if sampled and any(c.type == "id" for c in drafted.columns):
        # a uniform sample of rows keeps few of a unit's rows: its counts understate them
        remarks.append(
            "the identifiers' rows per unit above count the sample's rows: in the whole table "
            "a unit holds more (and a value unique in the sample may repeat); count them there "
            "before choosing --max-rows-per-unit"
        )
    if not sampled:  # a sample's size is not the table's: a large table needs no remark
        remarks += _release_remark(drafted, raw.n)
        remarks += _losses(raw, drafted, epsilon)
    # The draft is JSON either way (for `> schema.json`); --json is accepted for uniformity.
    del as_json
    print_remarks(remarks)
    emit_json(drafted.to_json())


def _release_remark(drafted: Schema, rows: int) -> list[str]:
    """One remark when `train`'s default DP release of the drafted entries would need a large
    ε at this size (a small table): what it needs, and the cheaper way (public entries)."""
    from dpsynth.privacy.accounting.calibration import default_delta
    from dpsynth.training.schema_entries import epsilon_needed
    from dpsynth.training.table_schema import REUSED_SCHEMA_SHARE

    needed = epsilon_needed(drafted, rows, default_delta(rows))
    # a remark when the release needs more than the default of mst and aim has at ε = 1
    if needed is None or needed <= REUSED_SCHEMA_SHARE:
        return []
    reach = f"--schema-epsilon {needed:.2g}" if needed != float("inf") else "no ε"
    return [
        f"{rows:,} rows: a DP release of the marked entries keeps the values held by a tenth "
        f"of the rows from {reach} at the default δ (train spends {REUSED_SCHEMA_SHARE:.0%} of "
        "--epsilon on it by default with mst and aim, and refuses a release too small to keep "
        "much): declare the entries you know from public sources (category lists, min and "
        "max) to spend less"
    ]


def _losses(raw: object, drafted: Schema, epsilon: float) -> list[str]:
    """The columns the default release at `epsilon` would lose (terminal only), headed."""
    from dpsynth.training.schema_foresight import losses_at
    from dpsynth.training.table_schema import REUSED_SCHEMA_SHARE

    lines = losses_at(raw, drafted, epsilon)  # type: ignore[arg-type]
    if not lines:
        return []
    head = (
        f"at --epsilon {epsilon:g} the default DP schema release of mst and aim "
        f"({REUSED_SCHEMA_SHARE * epsilon:.3g}) would lose {len(lines)} column(s) (counted on "
        "your rows, shown only here):"
    )
    return [head, *lines]
