"""Data specs: turn `digits`, `mnist-5k:test`, `mnist:DIR`, `folder:DIR`, `npz:FILE` into images,
and `csv:FILE`, `parquet:FILE` and the built-in tables into tables.

Built-in data sets are named as they are (`NAME` is the train split, `NAME:test` the held-out
split); the user's own data is `KIND:PATH`, and `mnist:DIR:test` reads the `t10k-*` files.
The canonical spec and default dataset id of user data is `KIND:ABSOLUTE_PATH[:test]`, so the
same files reached through another relative path still compose in one ledger account.
`image_size` is a preprocessing choice and deliberately not part of the id: resized records
are still the same people.

The label set and the channel count are public and declared, never read off the records:
`classes` (`--classes a,b,...`) names the classes of an `npz:` without a stored list and must
match the format's own list elsewhere; `channels` (`--channels 1|3`) converts every image, and
is required for a class folder that mixes grayscale and colour files.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import TYPE_CHECKING, TypeAlias

import numpy as np
import torch

from dpsynth.data.builtin import BUILTINS, list_builtin
from dpsynth.data.builtin_tables import TABLE_BUILTINS
from dpsynth.data.frames import FRAME, FRAME_NAME, is_frame, read_frame, refuse_frame_spec
from dpsynth.data.image_folder import read_image_folder
from dpsynth.data.images import ImageData
from dpsynth.data.readers import (
    RawImages,
    class_name_problem,
    read_idx,
    read_npz,
    resize_uint8,
)
from dpsynth.data.schema import Schema
from dpsynth.data.table_codec import RawTable, TableData, encode_table
from dpsynth.errors import UsageError

if TYPE_CHECKING:
    import pandas as pd

DataInput: TypeAlias = "str | Path | pd.DataFrame"
"""What names data: a spec string, a path (its kind read off the name, `spec_of_path`), or (a
table) a pandas DataFrame in memory."""

__all__ = [
    "KINDS",
    "DataInput",
    "DataSpec",
    "inspect_data",
    "is_table_spec",
    "list_builtin",
    "list_builtin_tables",
    "load_data",
    "load_table",
    "parse_classes",
    "parse_spec",
    "read_table",
    "read_table_file",
    "spec_of_path",
]

KINDS: tuple[str, ...] = ("mnist", "folder", "npz", "csv", "parquet")
TABLE_KINDS = frozenset({"csv", "parquet"})
SPLIT_KINDS = frozenset({"builtin", "mnist"})


@dataclass(frozen=True)
class DataSpec:
    """A parsed data spec: kind (`builtin`, `mnist`, `folder`, `npz`), target and split.

    `target` is the built-in name or the absolute path; `given` is the path as the user wrote
    it (for error messages).
    """

    kind: str
    target: str
    split: str = "train"
    given: str = ""

    @property
    def is_table(self) -> bool:
        """True for `csv:FILE`, `parquet:FILE`, the built-in tables and a DataFrame."""
        builtin = self.kind == "builtin" and self.target in TABLE_BUILTINS
        return self.kind in TABLE_KINDS or builtin or self.kind == "frame"

    @property
    def canonical(self) -> str:
        """`NAME[:test]` for built-ins, `KIND:ABSOLUTE_PATH[:test]` for user data, `dataframe`
        for a pandas DataFrame."""
        if self.kind == "frame":
            return FRAME
        base = self.target if self.kind == "builtin" else f"{self.kind}:{self.target}"
        return f"{base}:test" if self.split == "test" else base


def list_builtin_tables() -> list[dict]:
    """The built-in tables (name, description, n, n_test, columns, target, classes)."""
    return [table.to_json() for table in TABLE_BUILTINS.values()]


def _usage_hint() -> str:
    names = ", ".join([*BUILTINS, *TABLE_BUILTINS])
    kinds = ", ".join(f"{kind}:PATH" for kind in KINDS)
    return f"built-in: {names} (NAME:test for the held-out split); your data: {kinds}"


def _split_suffix(text: str) -> tuple[str, str]:
    for split in ("test", "train"):
        if text.endswith(f":{split}"):
            return text[: -len(split) - 1], split
    return text, "train"


def parse_spec(spec: DataInput) -> DataSpec:
    """Parse a data spec without touching the file system beyond resolving the path; a pandas
    DataFrame is a table of kind `frame` (see `dpsynth.data.frames`)."""
    if is_frame(spec):
        return DataSpec("frame", FRAME, "train", FRAME_NAME)
    if isinstance(spec, PurePath):
        return parse_spec(spec_of_path(spec))
    assert isinstance(spec, str)
    text = spec.strip()
    refuse_frame_spec(text)
    name, split = _split_suffix(text)
    if name in BUILTINS or name in TABLE_BUILTINS:
        return DataSpec("builtin", name, split, name)
    kind, sep, rest = text.partition(":")
    if not sep:
        hint = ""
        if Path(text).expanduser().is_dir():
            hint = f"; did you mean folder:{text} or mnist:{text}?"
        elif Path(text).expanduser().is_file():
            suffix = Path(text).suffix.lower()
            kind = {".parquet": "parquet", ".csv": "csv"}.get(suffix, "npz")
            hint = f"; did you mean {kind}:{text}?"
        raise UsageError(f"unknown data set {text!r}{hint} ({_usage_hint()})")
    if kind not in KINDS:
        raise UsageError(f"unknown data kind {kind!r} in {text!r} ({_usage_hint()})")
    path_text, split = _split_suffix(rest) if kind == "mnist" else (rest, "train")
    if not path_text:
        raise UsageError(f"{text!r} names no path ({_usage_hint()})")
    absolute = Path(path_text).expanduser().resolve()
    return DataSpec(kind, str(absolute), split, path_text)


def spec_of_path(path: PurePath) -> str:
    """The spec of a path given as a `Path`: `parquet:` for a `.parquet` file or a folder of
    them, `npz:` for `.npz`, `mnist:` for a folder of IDX files, `folder:` for another folder,
    and `csv:` for any other file (plain or compressed)."""
    where = Path(path).expanduser()
    if where.is_dir():
        if next(where.rglob("*.parquet"), None) is not None:
            return f"parquet:{path}"
        idx = next(where.glob("*idx[13]-ubyte*"), None) is not None
        return f"{'mnist' if idx else 'folder'}:{path}"
    suffix = where.suffix.lower()
    kind = {".parquet": "parquet", ".npz": "npz"}.get(suffix, "csv")
    return f"{kind}:{path}"


def schema_needed(parsed: DataSpec) -> UsageError:
    """The error for a user's table (a file or a DataFrame) given without its schema."""
    if parsed.kind == "frame":
        return UsageError(
            "a DataFrame needs its public {schema}: a file, a Schema or its JSON as a dict "
            "(draft one with dpsynth.data.schema_draft.draft_table and review it)",
            parameter="schema",
        )
    spec = f"{parsed.kind}:{parsed.given}"
    return UsageError(
        f"{spec}: a {parsed.kind}: table needs --schema FILE.json (draft one with "
        f"`dpsynth data schema {spec} > schema.json` and review it)"
    )


def _check_path(parsed: DataSpec) -> Path:
    path = Path(parsed.target)
    if not path.exists():
        hint = ""
        base, split = _split_suffix(parsed.given)
        if split == "test" and Path(base).expanduser().exists():
            hint = " (:test applies to built-in data and mnist:DIR; give the test data's own path)"
        raise UsageError(f"no such file or folder: {parsed.given}{hint}")
    if parsed.kind in ("npz", "csv", "parquet") and not path.is_file():
        folder = (
            " (a folder of partitioned Parquet files is not read in memory; train --engine "
            "duckdb or dask://HOST:PORT counts it out of core)"
        ) * (parsed.kind == "parquet" and path.is_dir())
        raise UsageError(f"{parsed.kind}:{parsed.given}: not a file{folder}")
    if parsed.kind in ("mnist", "folder") and not path.is_dir():
        raise UsageError(f"{parsed.kind}:{parsed.given}: not a folder")
    return path


def _read(
    parsed: DataSpec,
    image_size: int | None,
    classes: tuple[str, ...] | None,
    channels: int | None,
) -> RawImages:
    if parsed.kind == "builtin":
        from dpsynth.data.builtin import load_builtin

        x, y = load_builtin(parsed.target, parsed.split)
        return RawImages(x, y, BUILTINS[parsed.target].classes)
    path = _check_path(parsed)
    if parsed.kind == "mnist":
        return read_idx(path, parsed.split)
    if parsed.kind == "folder":
        return read_image_folder(path, image_size, channels)
    return read_npz(path, classes)


def parse_classes(text: str | None) -> tuple[str, ...] | None:
    """`--classes a,b,...` as a tuple of class names (None when not given)."""
    if text is None:
        return None
    classes = tuple(name.strip() for name in text.split(","))
    problem = class_name_problem(classes)
    if problem:
        raise UsageError(f"--classes {text!r}: {problem}")
    return classes


def _check_channels(channels: int | None) -> None:
    if channels is not None and (isinstance(channels, bool) or channels not in (1, 3)):
        raise UsageError(f"--channels must be 1 or 3, got {channels!r}")


def _check_declared_classes(
    parsed: DataSpec, declared: tuple[str, ...] | None, found: tuple[str, ...]
) -> None:
    # npz checks its own; elsewhere the format fixes the list and a declaration must agree.
    if declared is None or parsed.kind == "npz" or tuple(declared) == tuple(found):
        return
    source = {
        "builtin": "the built-in data set's classes",
        "mnist": "the IDX format's classes",
        "folder": "its sub-folder names",
    }[parsed.kind]
    raise UsageError(
        f"--classes {','.join(declared)} differs from {parsed.given}: {source} are "
        f"{','.join(found)}"
    )


def _convert_channels(x: np.ndarray, channels: int | None) -> np.ndarray:
    """uint8 [N,C,H,W] with C converted to `channels` (ITU-R 601 luma, as PIL's convert("L"))."""
    if channels is None or x.shape[1] == channels:
        return x
    if channels == 3:
        return np.repeat(x, 3, axis=1)
    weights = np.array([0.299, 0.587, 0.114], dtype=np.float32).reshape(1, 3, 1, 1)
    luma = (x.astype(np.float32) * weights).sum(axis=1, keepdims=True)
    return np.clip(np.round(luma), 0, 255).astype(np.uint8)


# Largest --image-size: 1024 x 1024 is beyond every supported model; an unbounded size turned a
# typo into tens of GiB of resized images (N x C x S x S bytes).
MAX_IMAGE_SIZE = 1024


def _check_image_size(image_size: int | None) -> None:
    if image_size is None:
        return
    if isinstance(image_size, bool) or not isinstance(image_size, int) or image_size < 1:
        raise UsageError(f"image size must be a positive integer, got {image_size!r}")
    if image_size > MAX_IMAGE_SIZE:
        raise UsageError(f"--image-size must be at most {MAX_IMAGE_SIZE}, got {image_size}")


def load_data(
    spec: str,
    image_size: int | None = None,
    dataset_id: str | None = None,
    classes: tuple[str, ...] | list[str] | None = None,
    channels: int | None = None,
) -> ImageData:
    """Load a data spec as uint8 images [N, C, H, W] with int64 labels and class names.

    Specs: `digits`, `mnist-5k` (train splits; `NAME:test` held out), `mnist:DIR[:test]`,
    `folder:DIR`, `npz:FILE`. `image_size` resizes every image to image_size x image_size
    (bilinear, antialiased). `dataset_id` overrides the ledger id (default: the canonical spec).
    `classes` declares the public label set (required for an `npz:` without a stored
    `classes` array; elsewhere it must equal the format's list). `channels` (1 or 3) converts
    every image, and is required for a class folder mixing grayscale and colour.
    Raises UsageError for a bad spec, a missing path or a missing declaration, DataError for
    unreadable or malformed files and labels outside the declared set (one line naming the
    file).
    """
    _check_image_size(image_size)
    _check_channels(channels)
    declared = tuple(classes) if classes is not None else None
    parsed = parse_spec(spec)
    if parsed.is_table:
        raise UsageError(f"{spec!r} is a table; this command needs image data")
    raw = _read(parsed, image_size, declared, channels)
    _check_declared_classes(parsed, declared, tuple(raw.classes))
    pixels = _convert_channels(raw.x, channels)
    pixels = pixels if image_size is None else resize_uint8(pixels, image_size)
    return ImageData(
        # copy: builtin arrays are shared read-only cache entries
        x=torch.from_numpy(pixels.copy()),
        y=torch.from_numpy(raw.y.copy()),
        classes=tuple(raw.classes),
        spec=parsed.canonical,
        kind=parsed.kind,
        dataset_id=dataset_id or parsed.canonical,
    )


def inspect_data(
    spec: str,
    image_size: int | None = None,
    classes: tuple[str, ...] | None = None,
    channels: int | None = None,
    schema: Schema | None = None,
) -> dict:
    """The public description of a data spec: spec, kind, n, shape [C,H,W], classes,
    dataset_id, and `content_digest` (private: for the caller to key, never to show).

    Per-class counts and pixel statistics are deliberately absent: this runs on private data
    and its output is not differentially private, so it shows only what the privacy model
    treats as public (record count, shape, label set). The content digest is a membership
    test for anyone who knows the other records: only its keyed form may be shown (see
    `dpsynth.ledger.key`).
    """
    if is_table_spec(spec):
        records: ImageData | TableData = load_table(spec, schema)
    else:
        records = load_data(spec, image_size=image_size, classes=classes, channels=channels)
    description = records.info().to_json()
    del description["fingerprint"]
    return {**description, "content_digest": records.content_digest}


def is_table_spec(spec: DataInput) -> bool:
    """True when a data spec names a table (`csv:FILE`, `parquet:FILE`, a built-in table) or is
    a pandas DataFrame."""
    return parse_spec(spec).is_table


def read_table(
    spec: DataInput, schema: Schema | None = None
) -> tuple[RawTable, DataSpec, Schema | None]:
    """A table spec's rows as read (strings), its parsed spec and its bundled schema (None for
    a user's `csv:`, `parquet:` or DataFrame, whose schema the user gives). `schema`, when
    known before the read, gives a Parquet file's (or frame's) time columns their formats."""
    from dpsynth.data.builtin_tables import load_builtin_table

    parsed = parse_spec(spec)
    if parsed.kind == "frame":
        return read_frame(spec, schema), parsed, None  # type: ignore[arg-type]
    if not parsed.is_table:
        raise UsageError(
            f"{spec!r} is image data; a table is csv:FILE, parquet:FILE or "
            f"{', '.join(TABLE_BUILTINS)}"
        )
    if parsed.kind == "builtin":
        raw = load_builtin_table(parsed.target, parsed.split)
        return raw, parsed, TABLE_BUILTINS[parsed.target].schema()
    path = _check_path(parsed)
    raw = read_table_file(path, f"{parsed.kind}:{parsed.given}", parsed.kind, schema)
    return raw, parsed, None


def read_table_file(
    path: Path | str, source: str, kind: str | None = None, schema: Schema | None = None
) -> RawTable:
    """A table file's rows as strings: Parquet for `kind` "parquet" (or, without a kind, a name
    ending in `.parquet`; its time columns in `schema`'s formats when given, see
    `dpsynth.data.parquetfile`), else CSV (plain or compressed). `source` names it in errors."""
    from dpsynth.data.parquetfile import read_parquet_table
    from dpsynth.data.table_codec import read_csv_table

    if kind is None:
        kind = "parquet" if Path(path).suffix.lower() == ".parquet" else "csv"
    if kind == "parquet":
        return read_parquet_table(path, source=source, schema=schema)
    return read_csv_table(path, source=source)


def load_table(
    spec: DataInput, schema: Schema | None = None, dataset_id: str | None = None
) -> TableData:
    """A table spec encoded under `schema` (default: the built-in table's bundled schema).

    The schema's entries must all be public here (declared or released): the caller checks
    the `source` marks (see `dpsynth.data.schema`). UsageError without a schema for `csv:`.
    """
    raw, parsed, bundled = read_table(spec)
    schema = schema or bundled
    if schema is None:
        raise schema_needed(parsed)
    return encode_table(raw, schema, parsed.canonical, parsed.kind, dataset_id)
