"""A large table for the scale goal (issue 29): 1M rows × 50 columns built from Census-Income.

    python -m bench.big_table --out /tmp/dpsynth-scale [--rows 1000000] [--seed 0] [--parquet]

Writes `big.csv.gz` (or, with `--parquet`, the same rows as a partitioned Parquet folder
`big.parquet/` of 1M-row files, for the out-of-core engines of issue 47) and `big.schema.json`
under `--out` (a temporary folder: generated, never
committed). The 50 columns: the 41 used columns of `bench/census.schema.json` (its 40
features and the `income` target; `instance_weight` is dropped) with their public bounds and
categories, and 9 extra columns with public domains (5 numbers on [0, 1000], 4 categorical
columns of 3, 8, 20 and 50 categories). Each row is a census training row drawn uniformly with
replacement, with public noise so that rows are not copies: every number is multiplied by
(1 + N(0, 0.05²)) (zeros stay zero, as most capital gains), rounded for integer columns and
clipped to its bounds; every category (the target too) is replaced, with probability 0.02, by
one drawn uniformly from its list. The extra columns depend on the row (age, weeks worked,
wage, education, sex and race, state) plus noise, so they carry structure a synthesizer can
learn. Generation works in chunks of 100,000 rows (memory: the census codes, not the output).
"""

from __future__ import annotations

import argparse
import gzip
import json
import time
from pathlib import Path

import numpy as np
import pandas as pd

from dpsynth.data.schema import Column, Schema
from dpsynth.data.schema_file import read_schema
from dpsynth.data.table_codec import read_csv_table
from dpsynth.evaluation.marginals import category_codes, marginal_columns

BENCH = Path(__file__).resolve().parent
CENSUS_SCHEMA = BENCH / "census.schema.json"
NUMBER_NOISE = 0.05
CATEGORY_FLIP = 0.02
CHUNK = 100_000
EXTRA_NUMBERS = 5
EXTRA_CATEGORIES = (3, 8, 20, 50)


def big_schema(census: Schema) -> Schema:
    """The census schema's used columns plus the extra public columns (50 in all)."""
    extra = [
        Column(f"x{k}", "integer" if k < 2 else "numeric", 0.0, 1000.0)
        for k in range(EXTRA_NUMBERS)
    ]
    extra += [
        Column(f"k{j}", "categorical", categories=tuple(f"k{j}_{i}" for i in range(size)))
        for j, size in enumerate(EXTRA_CATEGORIES)
    ]
    return Schema(tuple(marginal_columns(census)) + tuple(extra), census.target)


def _census_arrays(raw_path: Path, census: Schema) -> dict[str, np.ndarray]:
    """Each used census column as float64 numbers or int32 category codes."""
    raw = read_csv_table(raw_path)
    arrays: dict[str, np.ndarray] = {}
    for column in marginal_columns(census):
        values = raw.column(column.name)
        if column.is_numeric:
            arrays[column.name] = values.astype(np.float64)
        else:
            codes = category_codes(values, column)
            arrays[column.name] = np.minimum(codes, len(column.categories) - 1)
    return arrays


def _extras(base: dict[str, np.ndarray], rng: np.random.Generator) -> dict[str, np.ndarray]:
    """The 9 extra columns for one chunk, from the chunk's (noised) census values."""
    size = len(base["age"])
    age = base["age"] / 90.0
    weeks = base["weeks_worked_in_year"] / 52.0
    wage = np.minimum(base["wage_per_hour"] / 2000.0, 1.0)
    out: dict[str, np.ndarray] = {
        "x0": np.clip(1000 * (0.8 * age + 0.2 * rng.random(size)), 0, 1000),
        "x1": np.clip(1000 * (0.7 * weeks + 0.3 * rng.random(size)), 0, 1000),
        "x2": np.clip(1000 * wage + rng.normal(0, 20, size), 0, 1000),
        "x3": rng.uniform(0, 1000, size),
        "x4": np.clip(0.5 * 1000 * age + 0.5 * 1000 * weeks + rng.normal(0, 50, size), 0, 1000),
    }
    for k in range(EXTRA_NUMBERS):  # x0, x1 are integer columns; the others keep 3 decimals
        out[f"x{k}"] = np.round(out[f"x{k}"]).astype(np.int64) if k < 2 else out[f"x{k}"].round(3)
    sources = (
        base["education"] % 3,
        (base["sex"] * 5 + base["race"]) % 8,
        rng.integers(0, 20, size),
        base["state_of_previous_residence"] % 50,
    )
    for j, (code, categories) in enumerate(zip(sources, EXTRA_CATEGORIES, strict=True)):
        flip = rng.random(size) < 0.1
        code = np.where(flip, rng.integers(0, categories, size), code)
        out[f"k{j}"] = np.array([f"k{j}_{i}" for i in range(categories)], dtype=object)[code]
    return out


def _big_chunks(shared: Path, rows: int, seed: int):
    """The big table's (schema, generator of ordered column dicts of up to CHUNK rows)."""
    census = read_schema(CENSUS_SCHEMA)
    schema = big_schema(census)
    arrays = _census_arrays(shared / "census_income_kdd_train.csv.gz", census)
    total = len(next(iter(arrays.values())))
    rng = np.random.default_rng(seed)

    def chunks():
        for start in range(0, rows, CHUNK):
            size = min(CHUNK, rows - start)
            index = rng.integers(0, total, size)
            codes: dict[str, np.ndarray] = {}
            frame: dict[str, np.ndarray] = {}
            for column in marginal_columns(census):
                values = arrays[column.name][index]
                if column.is_numeric:
                    noised = values * (1 + rng.normal(0, NUMBER_NOISE, size))
                    noised = np.clip(noised, column.min, column.max)
                    if column.type == "integer":
                        noised = np.round(noised).astype(np.int64)
                    codes[column.name] = frame[column.name] = noised
                else:
                    flip = rng.random(size) < CATEGORY_FLIP
                    drawn = rng.integers(0, len(column.categories), size)
                    code = np.where(flip, drawn, values)
                    codes[column.name] = code
                    frame[column.name] = np.asarray(column.categories, dtype=object)[code]
            frame |= _extras(codes, rng)
            yield {c.name: frame[c.name] for c in schema.columns}

    return schema, chunks()


def make_big_table(
    out: Path, shared: Path, rows: int = 1_000_000, seed: int = 0
) -> tuple[Path, Path]:
    """Write `out/big.csv.gz` and `out/big.schema.json` (see the module docstring); reuse them
    when a previous call wrote the same rows and seed."""
    out.mkdir(parents=True, exist_ok=True)
    csv_path, schema_path, stamp = out / "big.csv.gz", out / "big.schema.json", out / "big.json"
    wanted = {"rows": rows, "seed": seed, "noise": NUMBER_NOISE, "flip": CATEGORY_FLIP}
    if stamp.is_file() and json.loads(stamp.read_text()) == wanted and csv_path.is_file():
        return csv_path, schema_path
    schema, chunks = _big_chunks(shared, rows, seed)
    partial = out / "big.csv.gz.partial"
    with gzip.open(partial, "wt", compresslevel=1, newline="") as handle:
        for i, ordered in enumerate(chunks):
            pd.DataFrame(ordered).to_csv(handle, header=i == 0, index=False)
    partial.rename(csv_path)
    schema_path.write_text(json.dumps(schema.to_json(), indent=1) + "\n")
    stamp.write_text(json.dumps(wanted))
    return csv_path, schema_path


def make_big_parquet(
    out: Path, shared: Path, rows: int = 10_000_000, seed: int = 0, rows_per_file: int = 1_000_000
) -> tuple[Path, Path]:
    """Write the same rows as a partitioned Parquet data set, `out/big.parquet/part-NNNNN.parquet`
    (`rows_per_file` rows each; integers as int64, numbers as float64, categories as strings),
    and `out/big.schema.json`; reuse them when a previous call wrote the same rows and seed."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out.mkdir(parents=True, exist_ok=True)
    folder, schema_path, stamp = out / "big.parquet", out / "big.schema.json", out / "bigpq.json"
    wanted = {"rows": rows, "seed": seed, "noise": NUMBER_NOISE, "flip": CATEGORY_FLIP,
              "rows_per_file": rows_per_file}  # fmt: skip
    if stamp.is_file() and json.loads(stamp.read_text()) == wanted and folder.is_dir():
        return folder, schema_path
    schema, chunks = _big_chunks(shared, rows, seed)
    partial = out / "big.parquet.partial"
    partial.mkdir(exist_ok=True)
    writer, written, part = None, 0, 0
    for ordered in chunks:
        table = pa.Table.from_pydict({k: pa.array(v) for k, v in ordered.items()})
        if writer is None:
            writer = pq.ParquetWriter(partial / f"part-{part:05d}.parquet", table.schema)
        writer.write_table(table, row_group_size=CHUNK)
        written += table.num_rows
        if written >= rows_per_file:
            writer.close()
            writer, written, part = None, 0, part + 1
    if writer is not None:
        writer.close()
    if folder.exists():
        import shutil

        shutil.rmtree(folder)
    partial.rename(folder)
    schema_path.write_text(json.dumps(schema.to_json(), indent=1) + "\n")
    stamp.write_text(json.dumps(wanted))
    return folder, schema_path


def repeat_parquet(folder: Path, out: Path, times: int) -> Path:
    """`out/big.parquet`: the part files of `folder` hard-linked `times` times over (a table of
    `times` × the rows, each row `times` times: the same throughput as distinct rows, at no
    disk cost); rebuilt when it is not the same repetition."""
    out.mkdir(parents=True, exist_ok=True)
    target, stamp = out / "big.parquet", out / "repeat.json"
    parts = sorted(folder.glob("part-*.parquet"))
    wanted = {"of": str(folder.resolve()), "times": times, "parts": len(parts)}
    if stamp.is_file() and json.loads(stamp.read_text()) == wanted and target.is_dir():
        return target
    if target.exists():
        import shutil

        shutil.rmtree(target)
    target.mkdir()
    for k in range(times):
        for i, part in enumerate(parts):
            (target / f"part-{k * len(parts) + i:05d}.parquet").hardlink_to(part)
    stamp.write_text(json.dumps(wanted))
    return target


def main() -> None:
    """Generate the table and print where it is."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("/tmp/dpsynth-scale"))
    parser.add_argument("--shared", type=Path, default=BENCH.parents[1] / "shared" / "data")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--parquet", action="store_true", help="a partitioned Parquet folder")
    args = parser.parse_args()
    start = time.perf_counter()
    make = make_big_parquet if args.parquet else make_big_table
    data_path, schema_path = make(args.out, args.shared, args.rows, args.seed)
    print(f"{data_path} and {schema_path} ({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
