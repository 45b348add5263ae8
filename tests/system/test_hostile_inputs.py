"""Hostile inputs (issue 30): broken compressed files, oversized lines and images, link loops,
malformed schemas, absurd counts. Each must end in one `error:` line with the right exit code,
spend no budget, lose no file and stay within memory, across every command.

The table runs in a fresh copy of one prepared folder (a tiny image run and a tiny table run,
their ledger, a sample folder, a sampled CSV, and the hostile files) with that copy as the
current directory; the whole tree, the ledger included, is compared before and after, so a
case that writes a spend, a run directory or deletes anything fails.
Memory: a child process runs the heaviest cases and reports its peak RSS, VmHWM (RLIMIT_AS cannot be
used: torch reserves gigabytes of address space at import).
"""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
import os
import shlex
import shutil
import signal
import struct
import subprocess
import sys
import time
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image
from typer.testing import CliRunner

from dpsynth.cli import app
from dpsynth.data.limits import MAX_CSV_LINE_BYTES
from dpsynth.data.sources import read_table
from dpsynth.errors import UsageError
from dpsynth.sampling import sample_run
from dpsynth.training import train_run
from tests.system.test_bad_inputs import snapshot

runner = CliRunner()
LEDGER = "--ledger ledger.jsonl"
GERMAN_ROWS = 60
TRAIN_CSV = f"train --method dpkernel --epsilon 5 --preset tiny --out newrun --device cpu {LEDGER}"
TRAIN_IMG = f"train --method dpkernel --epsilon 5 --preset tiny --out newrun --device cpu {LEDGER}"
TABLE_EVAL = f"evaluate --synthetic rows.csv --metrics accuracy --seeds 1 {LEDGER}"
IMAGE_EVAL = (
    f"evaluate --synthetic samples --metrics accuracy --classifier logreg --seeds 1 --device cpu "
    f"{LEDGER}"
)
AUDIT = "audit --method pge --epsilon 1 --seed 1"


def _png_header(width: int, height: int) -> bytes:
    """A PNG whose header declares width x height and whose pixels are missing: enough for
    every check that must run before decoding."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = zlib.crc32(kind + body) & 0xFFFFFFFF
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IEND", b"")


def _png(path: Path, value: int, size: int = 4) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((size, size), value, np.uint8)).save(path)


def _schema_variant(base: dict, path: Path, change) -> None:
    schema = json.loads(json.dumps(base))
    change(schema)
    path.write_text(json.dumps(schema))


def _first_numeric(schema: dict) -> dict:
    return next(c for c in schema["columns"] if c["type"] in ("numeric", "integer"))


def _first_categorical(schema: dict) -> dict:
    return next(
        c for c in schema["columns"] if c["type"] == "categorical" and c["name"] != schema["target"]
    )


MESSY_SCHEMA = {
    "target": "label",
    "columns": [
        {"name": "id", "type": "id"},
        {"name": "when", "type": "datetime", "min": "2020-01-01T00:00:00",
         "max": "2021-01-01T00:00:00", "format": "%Y-%m-%d %H:%M"},
        {"name": "n", "type": "numeric", "min": 0, "max": 10, "missing": True},
        {"name": "flag", "type": "boolean", "true": "yes", "false": "no"},
        {"name": "label", "type": "categorical", "categories": ["a", "b"]},
    ],
}  # fmt: skip


def make_messy_files(base: Path) -> None:
    """A table with the types real tables hold, and one bad cell of each new kind."""
    rows = [
        [f"P{i}", f"2020-03-{1 + i % 28:02d} 10:{i % 60:02d}", "" if i % 7 == 0 else f"{i % 10}.5",
         "yes" if i % 3 else "no", "ab"[i % 2]]
        for i in range(GERMAN_ROWS)
    ]  # fmt: skip
    header = "id,when,n,flag,label"

    def write(name: str, column: int | None = None, value: str = "", every: bool = False) -> None:
        table = [list(r) for r in rows]
        for i, row in enumerate(table):
            if column is not None and (every or i == 3):
                row[column] = value
        (base / name).write_text("\n".join([header, *(",".join(r) for r in table)]) + "\n")

    write("m.csv")
    write("m_baddate.csv", 1, "2020-02-31 10:00")  # no such day
    write("m_farday.csv", 1, "99999-01-01 10:00")  # beyond any calendar a file holds
    write("m_mixed.csv", 2, "lots")  # a word among numbers
    write("m_allmissing.csv", 2, "", every=True)
    write("m_bool.csv", 3, "maybe")
    (base / "m.schema.json").write_text(json.dumps(MESSY_SCHEMA))


def make_hostile_files(base: Path) -> None:
    """Every hostile file the table below refers to, small enough to build in a second."""
    raw, _, bundled = read_table("german-credit")
    lines = [",".join(raw.header)] + [
        ",".join(str(raw.columns[j][i]) for j in range(len(raw.header))) for i in range(GERMAN_ROWS)
    ]
    text = ("\n".join(lines) + "\n").encode()
    schema = bundled.to_json()
    schema.pop("notes", None)
    (base / "g.csv").write_bytes(text)
    (base / "g.schema.json").write_text(json.dumps(schema))
    # compressed, then cut short or corrupted
    (base / "trunc.csv.gz").write_bytes(gzip.compress(text)[: len(gzip.compress(text)) // 2])
    (base / "trunc.csv.bz2").write_bytes(bz2.compress(text)[:-40])
    (base / "trunc.csv.xz").write_bytes(lzma.compress(text)[: len(lzma.compress(text)) // 2])
    with zipfile.ZipFile(base / "good.csv.zip", "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("g.csv", text)
    corrupt = bytearray((base / "good.csv.zip").read_bytes())
    corrupt[60:100] = b"x" * 40
    (base / "bad.csv.zip").write_bytes(bytes(corrupt))
    with zipfile.ZipFile(base / "two.csv.zip", "w") as archive:
        archive.writestr("a.csv", text)
        archive.writestr("b.csv", text)
    (base / "notzip.csv.zip").write_bytes(text)
    (base / "gzipped.csv").write_bytes(gzip.compress(text))
    # sizes, encodings, headers
    header = lines[0].encode()
    (base / "longline.csv").write_bytes(header + b"\n" + b"x" * (MAX_CSV_LINE_BYTES + 10) + b"\n")
    (base / "nonewline.csv").write_bytes(header + b"\n" + b"1," * (MAX_CSV_LINE_BYTES // 2 + 10))
    field = '"' + ("y" * 1000 + "\n") * 6 + '"'
    long_row = field + "," + ",".join(lines[1].split(",")[1:])
    (base / "longfield.csv").write_text(lines[0] + "\n" + long_row + "\n")
    (base / "latin1.csv").write_bytes(header + b"\n" + lines[1].encode() + b"\xe9\n")
    (base / "nul.csv").write_bytes(text[:200] + b"\0" + text[200:])
    names = lines[0].split(",")
    names[3] = names[1]
    (base / "dup.csv").write_text(",".join(names) + "\n" + "\n".join(lines[1:]) + "\n")
    (base / "header_only.csv").write_text(lines[0] + "\n")
    (base / "empty.csv").write_bytes(b"")
    (base / "ragged.csv").write_text(lines[0] + "\n" + lines[1] + ",extra,fields\n")
    outside = lines[1].split(",")
    outside[0] = "A99"  # not one of the first column's categories
    (base / "outside.csv").write_text("\n".join([lines[0], ",".join(outside), *lines[2:]]) + "\n")
    target = lines[1].split(",")
    target[-1] = "7"  # not one of the target's classes
    (base / "badtarget.csv").write_text("\n".join([lines[0], ",".join(target), *lines[2:]]) + "\n")
    word = lines[1].split(",")
    word[1] = "twelve"  # a word in an integer column
    (base / "word.csv").write_text("\n".join([lines[0], ",".join(word), *lines[2:]]) + "\n")
    (base / "constant.csv").write_text("a,b\n1,x\n2,x\n")
    cut = ["\t".join(line.split(",")[:1] + line.split(",")[2:]) for line in lines]
    (base / "lacks.csv").write_text("\n".join(cut).replace("\t", ",") + "\n")
    make_hostile_parquet(base, raw)
    make_messy_files(base)
    # schemas
    variant = _schema_variant
    variant(schema, base / "s_overflow.json", lambda s: _first_numeric(s).update(max=10**400))
    variant(
        schema, base / "s_range.json", lambda s: _first_numeric(s).update(min=-1.7e308, max=1.7e308)
    )
    variant(
        schema,
        base / "s_wide.json",
        lambda s: _first_numeric(s).update(min=-1e300, max=1e300),
    )
    variant(schema, base / "s_notes.json", lambda s: s.update(notes=5))
    variant(schema, base / "s_colint.json", lambda s: s["columns"].__setitem__(0, 5))
    variant(schema, base / "s_cats.json", lambda s: _first_categorical(s).update(categories=7))
    variant(schema, base / "s_nomin.json", lambda s: _first_numeric(s).pop("min"))
    variant(schema, base / "s_boolmax.json", lambda s: _first_numeric(s).update(max=True))
    variant(
        schema,
        base / "s_weights.json",
        lambda s: next(c for c in s["columns"] if c["name"] == s["target"]).update(
            weights=[10**400, 1]
        ),
    )
    variant(
        schema,
        base / "s_data.json",
        lambda s: _first_numeric(s).update(source="data (not private: review or replace)"),
    )
    variant(
        schema,
        base / "s_long.json",
        lambda s: _first_categorical(s).update(
            categories=[f"K{i}" for i in range(25)], source="data (not private: review or replace)"
        ),
    )
    variant(schema, base / "s_lacks.json", lambda s: s["columns"].pop(1))
    (base / "s_deep.json").write_text("[" * 100_000 + "]" * 100_000)
    (base / "s_deepobj.json").write_text('{"columns": ' + "[" * 50_000 + "]" * 50_000 + "}")
    (base / "s_list.json").write_text("[1, 2, 3]")
    (base / "s_binary.json").write_bytes(b"\xff\xfe\x00garbage")
    # images
    for name in ("a", "b"):
        for i in range(3):
            _png(base / "loop" / name / f"{i}.png", 40 * i + (name == "b"))
            _png(base / "cross" / name / f"{i}.png", 40 * i + (name == "b"))
            _png(base / "selfloop" / name / f"{i}.png", 40 * i + (name == "b"))
    os.symlink("..", base / "loop" / "a" / "up")  # a loop through the root: b's files in a
    os.symlink("../b", base / "cross" / "a" / "linked")  # class b's files also in class a
    os.symlink(".", base / "selfloop" / "a" / "again")  # a loop within class a: harmless
    for name in ("a", "b"):
        (base / "huge" / name).mkdir(parents=True)
        (base / "huge" / name / "0.png").write_bytes(_png_header(10000, 10000))
        (base / "large" / name).mkdir(parents=True)
        (base / "large" / name / "0.png").write_bytes(_png_header(5000, 5000))
    (base / "noclasses").mkdir()
    _png(base / "noclasses" / "0.png", 1)
    for name in ("a", "b"):
        (base / "broken" / name).mkdir(parents=True)
        (base / "broken" / name / "0.png").write_bytes(b"\x89PNG\r\n\x1a\nnot really")
    classes = np.array(["a", "b"])
    np.savez(base / "zero.npz", x=np.zeros((0, 8, 8), np.uint8), y=np.zeros(0, np.int64),
             classes=classes)  # fmt: skip
    np.savez(base / "nopixels.npz", x=np.zeros((5, 0, 8), np.uint8), y=np.zeros(5, np.int64),
             classes=classes)  # fmt: skip
    np.savez(base / "floats.npz", x=np.zeros((5, 8, 8), np.float32), y=np.zeros(5, np.int64),
             classes=classes)  # fmt: skip
    np.savez(base / "badlabel.npz", x=np.zeros((5, 8, 8), np.uint8), y=np.full(5, 9, np.int64),
             classes=classes)  # fmt: skip
    declared = {"descr": "|u1", "fortran_order": False, "shape": (10**6, 1, 1000, 1000)}
    with zipfile.ZipFile(base / "bomb.npz", "w") as archive:
        import io

        buffer = io.BytesIO()
        np.lib.format.write_array_header_1_0(buffer, declared)
        archive.writestr("x.npy", buffer.getvalue())
        labels = io.BytesIO()
        np.save(labels, np.zeros(3, np.int64))
        archive.writestr("y.npy", labels.getvalue())
    truncated = (base / "floats.npz").read_bytes()
    (base / "cut.npz").write_bytes(truncated[: len(truncated) // 2])
    (base / "idx").mkdir()
    images = struct.pack(">BBBBIII", 0, 0, 8, 3, 2, 4, 4) + bytes(32)
    labels_idx = struct.pack(">BBBBI", 0, 0, 8, 1, 2) + bytes(2)
    (base / "idx" / "train-images-idx3-ubyte.gz").write_bytes(gzip.compress(images)[:-12])
    (base / "idx" / "train-labels-idx1-ubyte").write_bytes(labels_idx)
    # a run whose config.json is nested beyond Python's recursion limit
    shutil.copytree(base / "run", base / "deeprun")
    (base / "deeprun" / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    # ledgers
    (base / "locked").mkdir()
    shutil.copy(base / "ledger.jsonl", base / "locked" / "ledger.jsonl")
    (base / "locked" / "ledger.jsonl.lock").mkdir()
    entry = json.loads((base / "ledger.jsonl").read_text().splitlines()[0])
    entry["dataset_id"] = ["a", "list"]
    (base / "listid.jsonl").write_text(_rehashed([entry]))
    (base / "nested.jsonl").write_text("[" * 10_000 + "]" * 10_000 + "\n")


def make_hostile_parquet(base: Path, raw) -> None:
    """Parquet files: german-credit's first rows (as text), then cut short, nested, empty."""
    columns = {name: [str(v) for v in raw.columns[j][:GERMAN_ROWS]]
               for j, name in enumerate(raw.header)}  # fmt: skip
    pq.write_table(pa.table(columns), base / "g.parquet")
    good = (base / "g.parquet").read_bytes()
    (base / "trunc.parquet").write_bytes(good[: len(good) // 2])
    (base / "empty.parquet").write_bytes(b"")
    first, label = raw.header[0], raw.header[-1]
    two = {label: columns[label][:2]}
    pq.write_table(pa.table({first: pa.array([[1], [2, 3]]), **two}), base / "nested.parquet")
    pq.write_table(
        pa.table({first: pa.array([{"a": 1}, {"a": 2}]), **two}), base / "struct.parquet"
    )
    pq.write_table(pa.table({first: pa.array([b"x", b"y"]), **two}), base / "binary.parquet")
    pq.write_table(pa.table(columns).slice(0, 0), base / "norows.parquet")
    names = [*raw.header[:3], raw.header[1], *raw.header[4:]]
    pq.write_table(
        pa.Table.from_arrays(pa.table(columns).columns, names=names), base / "dup.parquet"
    )


def _rehashed(entries: list[dict]) -> str:
    """Ledger lines re-chained with the ledger's own hash, as a forger with the code would."""
    from dpsynth.ledger.chain import GENESIS_HASH, canonical_json, entry_hash

    out, previous = [], GENESIS_HASH
    for entry in entries:
        entry = {**entry, "prev_hash": previous}
        entry["hash"] = entry_hash(entry)
        previous = entry["hash"]
        out.append(canonical_json(entry))
    return "\n".join(out) + "\n"


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Tiny image and table runs, their ledger, a sample folder, a sampled CSV, hostile files."""
    base = tmp_path_factory.mktemp("hostile")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        ledger = base / "ledger.jsonl"
        common = {"method": "dpkernel", "epsilon": 1.0, "preset": "tiny", "device": "cpu"}
        train_run(data="digits", out=base / "run", ledger_path=ledger, **common)
        train_run(data="german-credit", out=base / "trun", ledger_path=ledger, **common)
        sample_run(base / "run", 10, base / "samples", ledger_path=ledger, device="cpu")
        sample_run(base / "trun", 20, base / "rows.csv", ledger_path=ledger, device="cpu")
    finally:
        torch.set_num_threads(threads)
    make_hostile_files(base)
    return base


@pytest.fixture
def workdir(prepared: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh copy of the prepared folder (links kept as links), made the current directory."""
    case = tmp_path / "case"
    shutil.copytree(prepared, case, symlinks=True)
    monkeypatch.chdir(case)
    monkeypatch.delenv("DPSYNTH_LEDGER", raising=False)
    monkeypatch.delenv("DPSYNTH_MEMORY_BUDGET", raising=False)
    return case


def case(args: str, code: int, phrase: str, *marks: pytest.MarkDecorator):
    """One row of the table: command line, exit code, a phrase of the one error line."""
    return pytest.param(args, code, phrase, marks=marks, id=args)


CSV = f"{TRAIN_CSV} --schema g.schema.json --data"
MESSY = f"{TRAIN_CSV} --schema m.schema.json --data"
CASES = [
    # --- issue 30, as reported ----------------------------------------------------------
    case(f"{CSV} csv:trunc.csv.gz", 4, "truncated or corrupt after byte"),
    case(f"{CSV} csv:trunc.csv.bz2", 4, "truncated or corrupt after byte"),
    case(f"{CSV} csv:trunc.csv.xz", 4, "truncated or corrupt after byte"),
    case(f"{CSV} csv:bad.csv.zip", 4, "csv:bad.csv.zip"),
    case(f"{TABLE_EVAL} --real csv:trunc.csv.gz --schema g.schema.json", 4, "truncated"),
    case("data schema csv:trunc.csv.gz", 4, "truncated or corrupt after byte"),
    case("data schema csv:trunc.csv.bz2", 4, "truncated or corrupt after byte"),
    case("data schema csv:trunc.csv.xz", 4, "truncated or corrupt after byte"),
    case("data schema csv:bad.csv.zip", 4, "csv:bad.csv.zip"),
    case(f"{CSV} csv:longline.csv", 4, "longer than the 1 MiB cap of a CSV line"),
    case("data inspect csv:longline.csv --schema g.schema.json", 4, "line 2 (byte"),
    case("data schema csv:longline.csv", 4, "1 MiB cap"),
    case("data inspect csv:g.csv --schema s_overflow.json", 2, "'max' must be a finite number"),
    case("data inspect csv:g.csv --schema s_colint.json", 2, "schema column 0"),
    case("data inspect csv:g.csv --schema s_notes.json", 2, "'notes' must be a list"),
    case("data inspect csv:g.csv --schema s_deep.json", 2, "nested too deeply"),
    case("data inspect csv:g.csv --schema s_deepobj.json", 2, "nested too deeply"),
    case("data schema csv:dup.csv", 4, "appears twice in the header"),
    case(
        f"{CSV} csv:g.csv --schema-public".replace("g.schema.json", "s_long.json"),
        2,
        "lists 25 categories read off the data",
    ),
    case(
        f"{MESSY} csv:m_baddate.csv", 4, "row 5 holds '2020-02-31 10:00', which is not a datetime"
    ),
    case(f"{MESSY} csv:m_farday.csv", 4, "row 5 holds '99999-01-01 10:00'"),
    case(f"{MESSY} csv:m_mixed.csv", 4, "'n' is numeric but row 5 holds 'lots'"),
    case(f"{MESSY} csv:m_allmissing.csv", 4, "'n' has no value in any row"),
    case(
        f"{MESSY} csv:m_bool.csv", 4, "row 5 holds 'maybe', which is not in the schema's spellings"
    ),
    case("data inspect csv:m_baddate.csv --schema m.schema.json", 4, "not a datetime"),
    case("data inspect csv:outside.csv --schema g.schema.json", 4, "not in the schema's category"),
    case("data inspect folder:loop", 4, "a record has one label"),
    case("data inspect folder:cross", 4, "is the same file as"),
    case(f"{TRAIN_IMG} --data folder:cross", 4, "a record has one label"),
    case("data inspect folder:huge", 4, "100,000,000 pixels"),
    case(f"{TRAIN_IMG} --data folder:huge", 4, "cap of 16,777,216 pixels"),
    case("data inspect npz:zero.npz", 4, "no records"),
    case("data inspect npz:nopixels.npz", 4, "hold no pixels"),
    case(f"{TRAIN_IMG} --data npz:zero.npz", 4, "no records"),
    case(f"{TRAIN_IMG} --data npz:nopixels.npz", 4, "hold no pixels"),
    case(f"{AUDIT} --canaries 2000000000", 2, "use fewer canaries"),
    case(f"{AUDIT} --confidence 1.5", 2, "got 1.5"),
    case(f"{IMAGE_EVAL} --real digits:test".replace("samples", "trun"), 2, "is a table's run"),
    case(f"{TABLE_EVAL} --real csv:lacks.csv", 4, "has no column 'duration_in_month'"),
    case("ledger show --ledger locked/ledger.jsonl", 2, "lock file locked/ledger.jsonl.lock"),
    case(
        "ledger budget --dataset digits --epsilon 9 --delta 1e-5 --ledger locked/ledger.jsonl",
        2,
        "is a folder",
    ),
    # --- budget spent by bad input (rows checked before a release), ledger verify ---------
    case(
        f"{CSV} csv:badtarget.csv --class-weights-epsilon 0.5 --schema-public",
        4,
        "not in the schema's category list",
    ),
    case(  # a declared column's value outside its list; a numeric column's bounds released
        f"{TRAIN_CSV.replace('dpkernel', 'rdpgan')} --data csv:outside.csv "
        "--schema s_data.json --schema-epsilon 0.5",
        4,
        "not in the schema's category list",
    ),
    case(  # the released column's values are still parsed before the release
        f"{TRAIN_CSV.replace('dpkernel', 'rdpgan')} --data csv:word.csv "
        "--schema s_data.json --schema-epsilon 0.5",
        4,
        "row 2 holds 'twelve'",
    ),
    case(
        f"{CSV} csv:badtarget.csv --schema-public --class-weights-epsilon 0.5".replace(
            "g.schema.json", "s_data.json"
        ),
        4,
        "not in the schema's category list",
    ),
    case("ledger verify --ledger listid.jsonl", 1, "dataset_id must be a string"),
    case("ledger verify --ledger nested.jsonl", 1, "nested too deeply"),
    # --- train: files ----------------------------------------------------------------------
    case(f"{CSV} csv:two.csv.zip", 4, "exactly one CSV file, it holds 2"),
    case(f"{CSV} csv:notzip.csv.zip", 4, "not a readable zip archive"),
    case(f"{CSV} csv:gzipped.csv", 4, "read by its suffix"),
    case(f"{CSV} csv:nonewline.csv", 4, "1 MiB cap"),
    case(f"{CSV} csv:longfield.csv", 4, "more than the cap of 4096"),
    case(f"{CSV} csv:latin1.csv", 4, "not UTF-8 text at line 2"),
    case(f"{CSV} csv:nul.csv", 4, "a NUL byte at line"),
    case(f"{CSV} csv:dup.csv", 4, "appears twice in the header"),
    case(f"{CSV} csv:header_only.csv", 4, "has no rows"),
    case(f"{CSV} csv:empty.csv", 4, "has no rows"),
    case(f"{CSV} csv:ragged.csv", 4, "not a readable CSV file"),
    case(f"{CSV} csv:outside.csv", 4, "not in the schema's category list"),
    case(f"{CSV} csv:word.csv", 4, "row 2 holds 'twelve'"),
    case(f"{CSV} csv:missing.csv", 2, "no such file or folder"),
    case(f"{CSV} csv:loop", 2, "not a file"),
    case(f"{TRAIN_CSV} --data csv:g.csv", 2, "needs --schema"),
    case(f"{TRAIN_IMG} --data folder:loop", 4, "a record has one label"),
    case(f"{TRAIN_IMG} --data folder:large", 4, "it is 5000x5000"),
    case(f"{TRAIN_IMG} --data folder:noclasses", 4, "no class sub-folders"),
    case(f"{TRAIN_IMG} --data folder:broken", 4, "cannot open image"),
    case(f"{TRAIN_IMG} --data npz:bomb.npz", 4, "would need about"),
    case(f"{TRAIN_IMG} --data npz:cut.npz", 4, "npz"),
    case(f"{TRAIN_IMG} --data npz:floats.npz", 4, "pixels must be uint8"),
    case(f"{TRAIN_IMG} --data npz:badlabel.npz", 4, "outside the 2 declared classes"),
    case(f"{TRAIN_IMG} --data mnist:idx", 4, "cannot read"),
    # --- train: schemas --------------------------------------------------------------------
    case(f"{CSV} csv:g.csv".replace("g.schema.json", "s_overflow.json"), 2, "finite number"),
    case(f"{CSV} csv:g.csv".replace("g.schema.json", "s_range.json"), 2, "overflows a float"),
    case(f"{CSV} csv:g.csv".replace("g.schema.json", "s_deep.json"), 2, "nested too deeply"),
    case(f"{CSV} csv:g.csv".replace("g.schema.json", "s_cats.json"), 2, "'categories' must be"),
    case(f"{CSV} csv:g.csv".replace("g.schema.json", "s_nomin.json"), 2, "'min' must be"),
    case(f"{CSV} csv:g.csv".replace("g.schema.json", "s_boolmax.json"), 2, "'max' must be"),
    case(f"{CSV} csv:g.csv".replace("g.schema.json", "s_weights.json"), 2, "'weights' must be"),
    case(f"{CSV} csv:g.csv".replace("g.schema.json", "s_list.json"), 2, "expected a JSON object"),
    case(f"{CSV} csv:g.csv".replace("g.schema.json", "s_binary.json"), 2, "not a readable JSON"),
    case(f"{CSV} csv:g.csv".replace("g.schema.json", "s_lacks.json"), 4, "header does not match"),
    case(f"{CSV} csv:g.csv".replace("g.schema.json", "loop"), 2, "is a folder"),
    case(f"{CSV} csv:g.csv".replace("g.schema.json", "nope.json"), 2, "no such file"),
    # --- Parquet (issue 44) ------------------------------------------------------------------
    case(f"{CSV} parquet:trunc.parquet", 4, "parquet:trunc.parquet: not a readable Parquet file"),
    case(f"{CSV} parquet:nested.parquet", 4, "has the nested type list<element: int64>"),
    case(f"{CSV} parquet:struct.parquet", 4, "has the nested type struct<a: int64>"),
    case(f"{CSV} parquet:empty.parquet", 4, "the file is empty (0 bytes)"),
    case(f"{CSV} parquet:dup.parquet", 4, "appears twice"),
    case(f"{CSV} parquet:norows.parquet", 4, "has no rows"),
    case(f"{CSV} parquet:loop", 2, "a folder of partitioned Parquet files is not read"),
    case("data schema parquet:trunc.parquet", 4, "truncated or corrupt"),
    case("data schema parquet:binary.parquet", 4, "has the type binary"),
    case("data schema parquet:struct.parquet", 4, "nested type struct"),
    case("data schema parquet:empty.parquet", 4, "the file is empty"),
    case("data inspect parquet:nested.parquet --schema g.schema.json", 4, "nested type list"),
    case(f"{TABLE_EVAL} --real parquet:trunc.parquet --schema g.schema.json", 4, "truncated"),
    case(
        f"{TABLE_EVAL.replace('rows.csv', 'trunc.parquet')} --real csv:g.csv --schema "
        "g.schema.json",
        4,
        "--synthetic trunc.parquet: not a readable Parquet file",
    ),
    case(f"sample trun --n 10 --out new.csv --format parquet {LEDGER}", 2, "ending in .parquet"),
    case(f"sample trun --n 10 --out new.parquet --format csv {LEDGER}", 2, "not ending in"),
    # --- sample ------------------------------------------------------------------------------
    case(f"sample run --n 10 --out new --batch-size 100000000 {LEDGER}", 2, "at most 131072"),
    case(f"sample run --n 10 --out new --batch-size 0 {LEDGER}", 2, "at least 1"),
    case(f"sample trun --n 10 --out new.csv --batch-size 1000000 {LEDGER}", 2, "at most"),
    case(f"sample trun --n 10 --out rows.csv {LEDGER}", 2, "pass --force"),
    case(f"sample trun --n 10 --out samples {LEDGER}", 2, "exists and is not empty"),
    case(f"sample trun --n 10 --out g.csv --force {LEDGER}", 2, "was not written by `sample`"),
    case(f"sample trun --n 10 --out new.csv --format png {LEDGER}", 2, "writes csv"),
    case(f"sample trun --n 10 --out new.csv --labels 1,2,3 {LEDGER}", 2, "--labels"),
    case(f"sample run --n 10 --out new --truncation nan {LEDGER}", 2, "truncation"),
    case(f"sample run --n 10 --out new --truncation -1 {LEDGER}", 2, "truncation"),
    case(f"sample deeprun --n 10 --out new {LEDGER}", 4, "deeprun"),
    case(f"sample trun --n 99999999999 --out new.csv {LEDGER}", 2, "at most"),
    # --- evaluate ----------------------------------------------------------------------------
    case(f"{TABLE_EVAL} --real csv:dup.csv --schema g.schema.json", 4, "appears twice"),
    case(f"{TABLE_EVAL} --real csv:latin1.csv --schema g.schema.json", 4, "not UTF-8"),
    case(f"{TABLE_EVAL} --real csv:bad.csv.zip --schema g.schema.json", 4, "bad.csv.zip"),
    case(f"{TABLE_EVAL} --real csv:g.csv --schema s_deep.json", 2, "nested too deeply"),
    case(f"{TABLE_EVAL} --real csv:g.csv --schema s_overflow.json", 2, "finite number"),
    case(f"{TABLE_EVAL} --real csv:lacks.csv --schema g.schema.json", 4, "has no column"),
    case(f"{IMAGE_EVAL} --real folder:cross", 4, "a record has one label"),
    case(f"{IMAGE_EVAL} --real folder:huge", 4, "pixels per image"),
    case(f"{IMAGE_EVAL} --real npz:zero.npz", 4, "no records"),
    case(f"{IMAGE_EVAL} --real npz:bomb.npz", 4, "would need about"),
    case(
        f"{IMAGE_EVAL} --real digits:test --n 1000000000000".replace("samples", "run"),
        2,
        "--n 1000000000000",
    ),
    # --- calibrate ---------------------------------------------------------------------------
    case("calibrate --epsilon nan --sampling-rate 0.01 --steps 10", 2, "epsilon"),
    case("calibrate --epsilon 1 --delta 0 --sampling-rate 0.01 --steps 10", 2, "delta"),
    case("calibrate --epsilon 1 --sampling-rate 0 --steps 10", 2, "sampling rate"),
    case("calibrate --epsilon 1 --batch-size 0 --dataset-size 100 --steps 10", 2, "batch"),
    case("calibrate --epsilon 1 --batch-size 10 --dataset-size 0 --steps 10", 2, "dataset"),
    case("calibrate --noise-multiplier -1 --sampling-rate 0.01 --steps 10", 2, "noise"),
    case("calibrate --noise-multiplier nan --sampling-rate 0.01 --steps 10", 2, "noise"),
    # --- audit -------------------------------------------------------------------------------
    case(f"{AUDIT} --canaries 1", 2, "at least 2"),
    case(f"{AUDIT} --confidence 0", 2, "got 0"),
    case(f"{AUDIT} --confidence nan", 2, "got nan"),
    # The functional audit holds about 6 kB per canary: 10⁸ of them is beyond any budget.
    case(f"{AUDIT} --canaries 100000000 --method dpkernel", 2, "use fewer canaries"),
    case(f"{AUDIT} --data csv:g.csv", 2, "takes image data"),
    case(f"{AUDIT} --preset huge", 2, "unknown preset"),
    case(AUDIT.replace("pge", "nope"), 2, "unknown method"),
    case(f"{AUDIT} --black-box --data csv:g.csv", 2, "audits a built-in set"),
    # --- ledger ------------------------------------------------------------------------------
    case("ledger verify --ledger locked/ledger.jsonl", 2, "lock file"),
    case("ledger verify --against user-files-only --ledger ledger.jsonl", 2, "user-files-only"),
    case("ledger verify --against samples --ledger ledger.jsonl", 2, "samples"),
    # --- data --------------------------------------------------------------------------------
    case("data schema csv:latin1.csv", 4, "not UTF-8 text at line 2"),
    case("data schema csv:nul.csv", 4, "NUL byte"),
    case("data schema csv:longfield.csv", 4, "cap of 4096"),
    case("data schema csv:gzipped.csv", 4, "starts like a gzip file"),
    case("data schema csv:two.csv.zip", 4, "exactly one CSV file"),
    case("data schema csv:header_only.csv", 4, "no rows"),
    case("data schema csv:constant.csv", 4, "fewer than two distinct values"),
    case("data schema csv:g.csv --target nope", 2, "is not a column"),
    case("data schema digits", 2, "is image data"),
    case("data inspect csv:g.csv --schema s_lacks.json", 4, "header does not match"),
    case("data inspect csv:word.csv --schema g.schema.json", 4, "'twelve'"),
    case("data inspect folder:large", 4, "5000x5000"),
    case("data inspect npz:bomb.npz", 4, "would need about"),
    case("data inspect npz:cut.npz", 4, "cut.npz"),
    case("data inspect mnist:idx", 4, "cannot read"),
    case("data inspect folder:broken", 4, "cannot open image"),
]


def test_the_table_is_large_and_covers_every_command() -> None:
    rows = [p.values[0] for p in CASES]
    groups = {args.split()[0] for args in rows}
    assert {"train", "sample", "evaluate", "calibrate", "audit", "ledger", "data"} <= groups
    assert len(rows) >= 35 + 40


@pytest.mark.parametrize(("args", "code", "phrase"), CASES)
def test_hostile_input_is_one_line_and_spends_nothing(
    workdir: Path, args: str, code: int, phrase: str
) -> None:
    before = snapshot(workdir)
    ledger_before = (workdir / "ledger.jsonl").read_bytes()
    result = runner.invoke(app, shlex.split(args))
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error:"), lines[0]
    assert result.exit_code == code, result.output
    assert phrase in lines[0], lines[0]
    assert (workdir / "ledger.jsonl").read_bytes() == ledger_before  # no spend, no release
    assert snapshot(workdir) == before  # nothing written, nothing lost


# ----------------------------------------------------------------- beyond the table


def invoke(*args: str):
    return runner.invoke(app, list(args))


def test_a_link_loop_within_one_class_counts_each_file_once(workdir: Path) -> None:
    result = invoke("data", "inspect", "folder:selfloop", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["n"] == 6  # 3 files per class on disk, whatever the links


def test_a_link_to_another_class_is_refused_and_without_it_every_file_counts_once(
    workdir: Path,
) -> None:
    refused = invoke("data", "inspect", "folder:cross")
    assert refused.exit_code == 4 and "a record has one label" in refused.stderr
    (workdir / "cross" / "a" / "linked").unlink()
    result = invoke("data", "inspect", "folder:cross", "--json")
    assert result.exit_code == 0 and json.loads(result.stdout)["n"] == 6


def test_force_onto_a_csv_says_it_replaced_the_csv_and_its_manifest(
    workdir: Path, one_torch_thread
) -> None:
    old = (workdir / "rows.csv").read_bytes()
    result = invoke("sample", "trun", "--n", "7", "--out", "rows.csv", "--force", *LEDGER.split())
    assert result.exit_code == 0, result.output
    assert "replaced the earlier sample output rows.csv and rows.csv.manifest.json" in result.stdout
    assert (workdir / "rows.csv").read_bytes() != old
    assert json.loads((workdir / "rows.csv.manifest.json").read_text())["n"] == 7
    fresh = invoke("sample", "trun", "--n", "7", "--out", "other.csv", *LEDGER.split(), "--json")
    assert fresh.exit_code == 0 and json.loads(fresh.stdout)["replaced"] is False


def test_a_stale_csv_temporary_of_a_dead_writer_is_removed(workdir: Path, one_torch_thread) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = workdir / f".big.csv.dpsynth-{dead.pid}-abc123.tmp"
    stale.write_text("half a csv\n")
    live = workdir / f".big.csv.dpsynth-{os.getpid()}-xyz789.tmp"
    live.write_text("being written\n")
    result = invoke("sample", "trun", "--n", "5", "--out", "out.csv", *LEDGER.split())
    assert result.exit_code == 0, result.output
    assert not stale.exists()
    assert live.is_file()  # its writer (this process) is alive: not ours to remove


def test_kill_9_during_a_csv_sample_leaves_a_temporary_that_the_next_sample_removes(
    workdir: Path,
) -> None:
    command = [
        sys.executable, "-c", "from dpsynth.cli import main; main()", "sample", "trun",
        "--n", "3000000", "--out", "big.csv", "--quiet", *LEDGER.split(),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not [p for p in workdir.glob(".big.csv.*.tmp") if p.stat().st_size > 0]:
            assert process.poll() is None, process.stderr.read() if process.stderr else ""
            assert time.monotonic() < deadline
            time.sleep(0.05)
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    left = list(workdir.glob(".big.csv.*.tmp"))
    assert len(left) == 1 and not (workdir / "big.csv").exists()
    assert f".big.csv.dpsynth-{process.pid}-" in left[0].name  # the writer's pid is in the name
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        result = invoke("sample", "trun", "--n", "5", "--out", "small.csv", *LEDGER.split())
    finally:
        torch.set_num_threads(threads)
    assert result.exit_code == 0, result.output
    assert not list(workdir.glob(".big.csv.*"))


def test_an_unreadable_ledger_file_is_exit_4_not_an_invalid_option(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Mode 000 as another user sees it (tests run as root, where chmod stops nothing): the
    option parser's access check and the ledger's own open both refuse."""
    target = workdir / "ledger.jsonl"
    real_access, real_open = os.access, os.open

    def access(path, mode, *args, **kwargs):
        if Path(path).absolute() == target:
            return False
        return real_access(path, mode, *args, **kwargs)

    def fake_open(path, flags, *args, **kwargs):
        if Path(path).absolute() == target:
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "access", access)
    monkeypatch.setattr(os, "open", fake_open)
    for args in (["ledger", "show"], ["ledger", "verify"], ["sample", "run", "--n", "3",
                                                             "--out", "x"]):  # fmt: skip
        result = invoke(*args, "--ledger", "ledger.jsonl")
        assert result.exit_code == 4, (args, result.output)
        assert result.stderr.strip().splitlines() == [
            "error: ledger ledger.jsonl: cannot read it (Permission denied)"
        ]


def test_the_memory_budget_is_half_the_machine_or_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from dpsynth.data import limits

    monkeypatch.setenv(limits.ENV_BUDGET, "512M")
    assert limits.memory_budget() == 512 << 20
    assert limits.over_budget(500 << 20) is None
    assert "512 MiB budget" in (limits.over_budget(600 << 20) or "")
    monkeypatch.setenv(limits.ENV_BUDGET, "lots")
    with pytest.raises(UsageError, match="DPSYNTH_MEMORY_BUDGET"):
        limits.memory_budget()
    monkeypatch.delenv(limits.ENV_BUDGET)
    assert 0 < limits.memory_budget() <= limits._physical_memory() // 2


def test_a_csv_bigger_than_its_share_of_the_budget_is_refused_while_reading(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GERMAN_ROWS rows × 21 columns parsed: 16 bytes a field and the distinct strings, over 16 KiB
    monkeypatch.setenv("DPSYNTH_MEMORY_BUDGET", "16K")
    result = invoke("data", "schema", "csv:g.csv")
    assert result.exit_code == 4
    assert f"the table's first {GERMAN_ROWS} rows would need about" in result.stderr
    assert "more than the 16 KiB budget" in result.stderr


MEMORY_CASES = [
    ["data", "inspect", "csv:line200.csv", "--schema", "g.schema.json"],
    ["data", "schema", "csv:line200.csv"],
    ["data", "inspect", "folder:huge"],
    ["data", "inspect", "npz:bomb.npz"],
    ["audit", "--method", "pge", "--epsilon", "1", "--canaries", "2000000000"],
    ["audit", "--method", "dpkernel", "--epsilon", "1", "--canaries", "2000000000"],
]
# The peak is the child's own VmHWM: ru_maxrss keeps the peak of the memory the process had
# before exec, which under vfork is the test process's (2.6 GB late in the full suite).
CHILD = """
import json, sys
from typer.testing import CliRunner
from dpsynth.cli import app
codes = [CliRunner().invoke(app, args).exit_code for args in json.loads(sys.argv[1])]
with open("/proc/self/status") as status:
    peak = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
print(json.dumps({"codes": codes, "peak_kib": peak}))
"""


def test_no_hostile_input_takes_more_than_2_gb(workdir: Path) -> None:
    """The memory cases in one child (its peak RSS covers them all, torch's import included)."""
    with (workdir / "line200.csv").open("wb") as handle:
        handle.write(b"a,b\n")
        block = b"x" * (1 << 20)
        for _ in range(200):
            handle.write(block)
        handle.write(b",1\n")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("DPSYNTH_MEMORY_BUDGET", None)
    child = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(MEMORY_CASES)],
        capture_output=True, text=True, env=env, timeout=600, cwd=workdir,
    )  # fmt: skip
    assert child.returncode == 0, child.stderr
    report = json.loads(child.stdout.strip().splitlines()[-1])
    assert report["codes"] == [4, 4, 4, 4, 2, 2]
    assert report["peak_kib"] < 2 * 1024 * 1024, report
