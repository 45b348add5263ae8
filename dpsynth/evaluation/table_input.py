"""The tables a table evaluation reads, in memory or out of core.

`--synthetic` is a CSV (plain or compressed), a pandas DataFrame, or Parquet: one file (a name
ending in `.parquet`), a folder of part files (every `*.parquet` below it, as `sample --out
DIR/` writes a partitioned release) or a glob (`synth/part-*.parquet`). `--real` (and
`--real-train`) is a data spec; `parquet:DIR` and `parquet:GLOB` are read like a partitioned
release. A CSV, a DataFrame, a built-in table and a `parquet:FILE` spec are read in memory as
before (`dpsynth.data.sources.read_table`); the rest is read batch by batch with the engines'
readers (`dpsynth.data.engines.chunks.table_files`, `parquet_rows`: every footer checked, the
same columns and types in every part; `parts.part_chunks`), so that nothing holds the table.

A release's manifest (its run, privacy statement and schema) is `FILE.manifest.json` beside
a file, and `DIR/_manifest.json` in a partitioned release's folder: it is used when it lists
exactly the part files read (a glob that picks every part of one release included).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dpsynth.data.csvtable import RawTable
from dpsynth.data.engines.chunks import TableFiles, parquet_rows, table_files
from dpsynth.data.engines.parts import parquet_parts, part_chunks
from dpsynth.data.frames import is_frame, read_frame
from dpsynth.data.schema import Schema
from dpsynth.data.sources import DataInput, parse_spec, read_table, read_table_file
from dpsynth.errors import DataError, UsageError
from dpsynth.evaluation.table_provenance import read_manifest

if TYPE_CHECKING:
    import pandas as pd

PARTS_MANIFEST = "_manifest.json"  # a partitioned release's manifest (`sampling.dataset`)
_GLOB_CHARS = frozenset("*?[")
_WHAT = {
    "synthetic": "a table release is a CSV, a Parquet file, a folder of Parquet parts or a glob",
    "real": "parquet: reads a file, a folder of Parquet parts or a glob",
}


@dataclass(frozen=True)
class TableInput:
    """A table to read: `raw` (in memory), or Parquet `files` read batch by batch under
    `schema` (their `header` and `n` from the footers)."""

    name: str  # as the report shows it
    layout: str  # "DataFrame", "CSV", "Parquet file", "Parquet folder (3 files)", …
    header: tuple[str, ...]
    n: int
    raw: RawTable | None = None
    files: TableFiles | None = None
    schema: Schema | None = None

    @property
    def streamed(self) -> bool:
        """True when the rows are read batch by batch (Parquet files)."""
        return self.files is not None

    @property
    def head(self) -> RawTable:
        """The header alone, as a table without rows (for the column checks)."""
        return self.raw if self.raw is not None else RawTable(self.header, (), self.name)

    def chunks(self) -> Iterator[RawTable]:
        """The rows: the table in memory as one chunk, or each Parquet batch in file order."""
        if self.raw is not None:
            yield self.raw
            return
        assert self.files is not None
        for part in parquet_parts(self.files):
            yield from part_chunks(part.path, part.groups, self.name, self.schema)


def _is_glob(text: str) -> bool:
    return bool(_GLOB_CHARS & set(text)) and not Path(text).expanduser().exists()


def _parquet(given: str, flag: str, schema: Schema | None) -> TableInput:
    """A Parquet file, folder or glob `given`, its footers checked (UsageError when there is
    no Parquet file to read; DataError for parts that differ or hold no row)."""
    path = Path(given).expanduser()
    what = _WHAT.get(flag, _WHAT["real"])
    if path.is_dir():
        if next(path.iterdir(), None) is None:
            raise UsageError(
                f"{{{flag}}} {given}: the folder is empty; {what}",
                parameter=flag,
            )
        if next((p for p in path.rglob("*.parquet") if p.is_file()), None) is None:
            raise UsageError(
                f"{{{flag}}} {given}: no Parquet file (*.parquet) in this folder; {what}",
                parameter=flag,
            )
    elif _is_glob(given):
        try:
            table_files(f"parquet:{given}")
        except UsageError:
            raise UsageError(
                f"{{{flag}}} {given}: the glob matches no file; {what}",
                parameter=flag,
            ) from None
    elif not path.is_file():
        raise UsageError(f"{{{flag}}} {given}: no such file or folder", parameter=flag)
    files = table_files(f"parquet:{given}")
    named = f"--{flag.replace('_', '-')} {given}"
    try:
        header, rows = parquet_rows(files)
    except DataError as exc:  # named by the flag; a part also by its own path
        text = str(exc)
        one = files.paths[0]
        if len(files.paths) == 1 and text.startswith(f"{one}: "):
            text = text[len(one) + 2 :]
        raise DataError(f"{named}: {text}") from None
    if rows < 1:
        raise DataError(f"{named}: the table has no rows ({len(files.paths)} Parquet file(s))")
    if path.is_file():
        layout = "Parquet file"
    else:
        kind = "folder" if path.is_dir() else "glob"
        layout = f"Parquet {kind} ({len(files.paths)} file{'s' * (len(files.paths) > 1)})"
    return TableInput(given, layout, header, rows, files=files, schema=schema)


def _is_parquet_name(path: Path) -> bool:
    return path.suffix.lower() == ".parquet"


def synthetic_manifest(synthetic: str | os.PathLike[str]) -> tuple[dict[str, Any], str | None]:
    """The manifest of a synthetic release ({} without one) and a warning when a partitioned
    release's manifest lists other part files than those read (it is then not used)."""
    text = os.fspath(synthetic)
    path = Path(text).expanduser()
    if path.is_file():
        return read_manifest(path), None
    if path.is_dir():
        folder, read = path, None
    elif _is_glob(text):
        try:
            read = {Path(p) for p in table_files(f"parquet:{text}").paths}
        except UsageError:
            return {}, None
        parents = {p.parent for p in read}
        if len(parents) != 1:
            return {}, None
        folder = parents.pop()
    else:
        return {}, None
    try:
        manifest = json.loads((folder / PARTS_MANIFEST).read_text())
    except (OSError, ValueError):
        return {}, None
    if not isinstance(manifest, dict):
        return {}, None
    listed = manifest.get("partitions")
    parts = {
        (folder / str(p.get("file"))).resolve()
        for p in (listed if isinstance(listed, list) else [])
        if isinstance(p, dict)
    }
    found = read if read is not None else {p.resolve() for p in folder.rglob("*.parquet")}
    if parts and parts == {p.resolve() for p in found}:
        return manifest, None
    if read is not None:
        return {}, None  # a glob picking some parts: not the release the manifest describes
    return {}, (
        f"{text}: its {PARTS_MANIFEST} lists other part files than the folder holds: the "
        "manifest (run, privacy statement, schema) is not used"
    )


def open_synthetic(
    synthetic: str | os.PathLike[str] | pd.DataFrame, schema: Schema | None
) -> TableInput:
    """The synthetic table: a DataFrame or a CSV in memory, Parquet (a file, a folder of parts
    or a glob) read batch by batch (see the module docstring)."""
    if is_frame(synthetic):
        raw = read_frame(synthetic, schema)  # type: ignore[arg-type]
        return TableInput("a DataFrame", "DataFrame", raw.header, raw.n, raw=raw)
    text = os.fspath(synthetic)  # type: ignore[arg-type]
    path = Path(text).expanduser()
    if path.is_dir() or _is_glob(text) or (path.is_file() and _is_parquet_name(path)):
        return _parquet(text, "synthetic", schema)
    if not path.is_file():
        raise UsageError(f"{{synthetic}} {text}: no such file or folder", parameter="synthetic")
    raw = read_table_file(path, source=f"--synthetic {text}", schema=schema)
    return TableInput(text, "CSV", raw.header, raw.n, raw=raw)


def real_is_streamed(spec: DataInput) -> bool:
    """True for `parquet:DIR` and `parquet:GLOB`: read batch by batch."""
    if is_frame(spec) or not isinstance(spec, str | os.PathLike):
        return False
    parsed = parse_spec(spec)
    return parsed.kind == "parquet" and (Path(parsed.target).is_dir() or _is_glob(parsed.given))


def open_real(
    spec: DataInput, schema: Schema | None, flag: str = "real"
) -> tuple[TableInput, Schema | None, str, str]:
    """A real table spec: the table, the schema that reads it (`schema`, else a built-in
    table's own; None when neither), its canonical spec and its kind."""
    parsed = parse_spec(spec)
    if real_is_streamed(spec):
        return _parquet(parsed.given, flag, schema), schema, parsed.canonical, parsed.kind
    raw, parsed, bundled = read_table(spec, schema)
    chosen = schema or bundled
    layout = {"builtin": "built-in table", "frame": "DataFrame"}.get(parsed.kind, parsed.kind)
    table = TableInput(parsed.canonical, layout, raw.header, raw.n, raw=raw)
    return table, chosen, parsed.canonical, parsed.kind
