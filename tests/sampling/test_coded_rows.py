"""The marginal methods' fast path: codes straight to columns (`CodedRows`), to Arrow batches
and Parquet, against the encoded-rows route (`rows_from_codes` → `TableCodec.decode` →
`frame_to_arrow`) on a table with every column kind. Given the same codes and the same
positions inside the bins, every cell must be the same (values, nulls, types), in a frame, in
Arrow, in a Parquet file and in CSV text; the forward sampler's guide tables must draw exactly
the inverse CDF; and the two routes must draw the same distribution from a model."""

from __future__ import annotations

import io

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from dpsynth.data.coded_rows import CodedSampler, coded_frame
from dpsynth.data.discrete import schema_domain
from dpsynth.data.schema_file import parse_schema
from dpsynth.data.table_codec import TableCodec
from dpsynth.methods.marginal.cliquetree import CliqueTree
from dpsynth.methods.marginal.domain import rows_from_codes
from dpsynth.methods.marginal.generator import (
    MarginalGenerator,
    TreeSampler,
    _conditional,
    coded_rows,
)
from dpsynth.sampling import parquet_out
from dpsynth.sampling.arrow_rows import ArrowRows
from dpsynth.sampling.parquet_out import ParquetRows, arrow_schema, frame_to_arrow
from dpsynth.sampling.partitions import CODED_BATCH, DATASET_BATCH, dataset_batch, row_values

SCHEMA = parse_schema({
    "target": "y",
    "columns": [
        {"name": "key", "type": "id", "prefix": "p-"},
        {"name": "height", "type": "numeric", "min": 140, "max": 200, "decimals": 1,
         "missing": True, "edges": [140, 150, 150, 170, 185, 200]},
        {"name": "ratio", "type": "numeric", "min": -1.5, "max": 3.25, "missing": False},
        {"name": "flat", "type": "numeric", "min": 2, "max": 2, "missing": True},
        {"name": "age", "type": "integer", "min": 18, "max": 24, "missing": True},
        {"name": "income", "type": "integer", "min": 0, "max": 250000, "missing": False},
        {"name": "dep_time", "type": "integer", "clock": "hhmm", "min": 0, "max": 1440},
        {"name": "at", "type": "datetime", "min": "2020-01-01T00:00:00",
         "max": "2024-12-31T23:59:59", "format": "%Y-%m-%d %H:%M:%S%z",
         "timezone": "+01:00", "missing": True},
        {"name": "stamp", "type": "datetime", "min": "2021-03-01T00:00:00",
         "max": "2021-03-02T00:00:00", "format": "%Y-%m-%dT%H:%M:%S.%f"},
        {"name": "day", "type": "date", "min": "2019-01-01", "max": "2022-06-30",
         "format": "%Y-%m-%d", "missing": True},
        {"name": "smoker", "type": "boolean", "true": "yes", "false": "no", "missing": True},
        {"name": "member", "type": "boolean", "true": "Y", "false": "N", "missing": False},
        {"name": "ward", "type": "categorical", "categories": ["A", "B", "", "(other)"],
         "other": "(other)"},
        {"name": "note", "type": "ignored"},
        {"name": "y", "type": "categorical", "categories": ["home", "ward", "died"]},
    ],
})  # fmt: skip
CODEC = TableCodec(SCHEMA)


def _numeric(domain) -> list[int]:
    return [j for j, a in enumerate(domain.attributes) if a.kind not in ("categorical", "target")]


def _draws(domain, b: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Codes [d, b] over the whole domain (missing values included) and positions in bins."""
    rng = np.random.default_rng(seed)
    codes = np.stack([rng.integers(0, size, b) for size in domain.sizes])
    return codes, rng.random((len(_numeric(domain)), b))


def _old_frame(domain, codes: np.ndarray, uniform: np.ndarray, start: int) -> pd.DataFrame:
    """The encoded-rows route: `rows_from_codes` then `TableCodec.decode`."""
    full = np.zeros((codes.shape[1], codes.shape[0]))
    full[:, _numeric(domain)] = uniform.T
    rows, labels = rows_from_codes(codes.T.copy(), domain, full)
    return CODEC.decode(rows.numpy(), labels.numpy(), np.random.default_rng(0), start=start)


@pytest.mark.parametrize("bins,bound_bins", [(5, True), (64, False), (3, True)])
def test_codes_decode_to_the_same_cells_as_the_encoded_rows(bins: int, bound_bins: bool) -> None:
    domain = schema_domain(SCHEMA, bins, bound_bins)
    codes, uniform = _draws(domain, 3000, seed=bins)
    old = _old_frame(domain, codes, uniform, start=41)
    coded = coded_rows(codes, domain, uniform, start=41)
    pd.testing.assert_frame_equal(coded_frame(SCHEMA, coded), old)
    # every kind of cell occurs: missing numbers, dates and booleans, "" categories
    assert old["height"].isna().any() and old["at"].isna().any() and old["day"].isna().any()
    assert old["smoker"].isna().any() and (old["ward"] == "").any()
    assert old["key"].iloc[0] == "p-42" and (old["note"] == "").all()
    # Arrow batches (categories dictionary-encoded) hold the frame's cells and types
    arrow = ArrowRows(SCHEMA)
    batch = arrow.batch(coded)
    assert batch.schema == arrow.arrow
    assert pa.types.is_dictionary(batch.schema.field("ward").type)
    expected = frame_to_arrow(old, SCHEMA)
    table = arrow.public_table([batch])
    assert table.schema == arrow_schema(SCHEMA)
    assert table.equals(expected)
    # and CSV text of the codes' frame is the encoded rows' text
    assert CODEC.csv_text(coded_frame(SCHEMA, coded), True) == CODEC.csv_text(old, True)


def test_encoded_rows_give_the_same_arrow_cells_through_coded_rows() -> None:
    """A network generator's rows (soft one-hot blocks): the same draws and cells as before."""
    rng = np.random.default_rng(3)
    rows = rng.normal(0.3, 0.6, (500, CODEC.dim)).astype(np.float32)
    labels = rng.integers(0, 3, 500)
    frame = CODEC.decode(rows, labels, np.random.default_rng(9), start=5)
    coded = CODEC.coded(rows, labels, np.random.default_rng(9), start=5)
    pd.testing.assert_frame_equal(coded_frame(SCHEMA, coded), frame)
    arrow = ArrowRows(SCHEMA)
    assert arrow.public_table([arrow.batch(coded)]).equals(frame_to_arrow(frame, SCHEMA))


def test_parquet_files_declare_the_public_schema_in_full_row_groups(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(parquet_out, "ROWS_PER_GROUP", 100)
    domain = schema_domain(SCHEMA, 8, True)
    arrow = ArrowRows(SCHEMA)
    handle, frames, batches = io.BytesIO(), [], []
    with ParquetRows(handle, arrow.arrow, arrow.public, **arrow.writer_options) as written:
        for k in range(7):
            codes, uniform = _draws(domain, 64, seed=k)
            coded = coded_rows(codes, domain, uniform, start=64 * k)
            written.write(arrow.batch(coded))
            frames.append(_old_frame(domain, codes, uniform, start=64 * k))
            batches.append(arrow.batch(coded))
    data = handle.getvalue()
    meta = pq.ParquetFile(io.BytesIO(data)).metadata
    assert [meta.row_group(i).num_rows for i in range(meta.num_row_groups)] == [100] * 4 + [48]
    chunks = {meta.schema.column(i).name: meta.row_group(0).column(i) for i in range(15)}
    assert chunks["ward"].statistics is None and chunks["y"].statistics is None
    assert chunks["age"].statistics.max <= 24 and chunks["ratio"].statistics.has_min_max
    assert (
        "RLE_DICTIONARY" in chunks["ward"].encodings and "RLE_DICTIONARY" in chunks["age"].encodings
    )
    assert "RLE_DICTIONARY" not in chunks["ratio"].encodings  # a float: unique to its row
    assert "RLE_DICTIONARY" not in chunks["key"].encodings
    back = pq.read_table(io.BytesIO(data))
    assert back.schema == arrow_schema(SCHEMA)  # categories read back as strings
    assert back.equals(frame_to_arrow(pd.concat(frames, ignore_index=True), SCHEMA))
    read = pd.read_parquet(io.BytesIO(data))
    assert not isinstance(read["ward"].dtype, pd.CategoricalDtype)
    assert str(read["at"].dtype) == "datetime64[us, UTC+01:00]"


# ------------------------------------------------------------------- the forward sampler


def _tree_step(table: np.ndarray) -> object:
    """The step drawing attribute 1 given attribute 0 of a two-attribute table."""
    tree = CliqueTree(table.shape, [(0, 1)], [table])
    return _conditional(tree, 0, (0,))


@pytest.mark.parametrize("width", [1, 2, 7, 300])
def test_guide_tables_draw_exactly_the_inverse_cdf(width: int) -> None:
    rng = np.random.default_rng(width)
    table = rng.random((6, width)) ** 4
    table[1] = 0.0  # a separator value with no mass: uniform
    table[2, ::2] = 0.0  # empty cells: flat stretches of the CDF
    table[3] = 0.0
    table[3, -1] = 5.0  # all the mass on the last cell
    step = _tree_step(table)
    cdf = step.cdf.reshape(6, width)
    uniform = np.concatenate([
        rng.random(20000), cdf.reshape(-1), np.nextafter(cdf.reshape(-1), 0), [0.0, 1 - 2**-53],
    ])  # fmt: skip
    uniform = uniform[uniform < 1.0]
    row = rng.integers(0, 6, len(uniform))
    drawn = step.draw(row, uniform)
    expected = [np.searchsorted(cdf[r], u, side="right") for r, u in zip(row, uniform, strict=True)]
    np.testing.assert_array_equal(drawn, expected)
    assert drawn.min() >= 0 and drawn.max() < width
    # no draw lands on a cell without mass
    mass = table / np.where(table.sum(1, keepdims=True) > 0, table.sum(1, keepdims=True), 1)
    assert (mass[row, drawn] > 0)[(table.sum(1) > 0)[row]].all()


def test_a_large_table_gets_one_guide_bucket_per_cell() -> None:
    step = _tree_step(np.random.default_rng(0).random((3, 600_000)))
    assert step.buckets == 1 << 20 and step.guide.dtype == np.int32


def _model() -> tuple[MarginalGenerator, TableCodec]:
    domain = schema_domain(SCHEMA, 6, True)
    rng = np.random.default_rng(4)
    sizes = domain.sizes
    d = len(sizes)
    cliques = [(j, j + 1) for j in range(d - 1)]
    tables = [rng.random((sizes[a], sizes[b])) ** 3 for a, b in cliques]
    tree = CliqueTree(sizes, cliques, tables)
    return MarginalGenerator(SCHEMA.classes, domain, tree), CODEC


def test_the_fast_path_draws_the_distribution_of_the_encoded_rows() -> None:
    generator, codec = _model()
    assert isinstance(generator, CodedSampler)
    n = 40_000
    labels = np.random.default_rng(1).integers(0, 3, n)
    coded = generator.sample_coded(labels, np.random.default_rng(2), 0)
    fast = coded_frame(SCHEMA, coded)
    rows = torch.cat(list(generator.sample(torch.from_numpy(labels), 10_000, torch.Generator())))
    slow = codec.decode(rows.numpy(), labels, np.random.default_rng(3))
    assert (fast["y"] == slow["y"]).all()  # the labels asked for, in order
    for name in ("ward", "smoker", "member"):
        a = fast[name].astype(str).value_counts(normalize=True)
        b = slow[name].astype(str).value_counts(normalize=True)
        assert (a.sub(b, fill_value=0).abs().sum() / 2) < 0.02, name
    for name in ("height", "ratio", "age", "income", "dep_time", "at", "day"):
        a, b = _values(fast[name]), _values(slow[name])
        assert abs(np.isnan(a).mean() - np.isnan(b).mean()) < 0.02, name
        a, b = a[~np.isnan(a)], b[~np.isnan(b)]
        edges = np.unique(np.quantile(b, np.linspace(0, 1, 11)))
        shares = [np.histogram(v, edges)[0] / len(v) for v in (a, b)]
        assert np.abs(shares[0] - shares[1]).sum() / 2 < 0.03, name


def _values(cells: pd.Series) -> np.ndarray:
    """A column's cells as floats (datetimes as seconds; NaN: missing)."""
    series = pd.Series(cells)
    if series.dtype.kind == "M":
        seconds = (series.dt.tz_localize(None) if series.dt.tz else series).astype("int64") / 1e6
        return np.where(series.isna(), np.nan, seconds)
    return series.astype("Float64").to_numpy(np.float64, na_value=np.nan)


def test_the_fast_path_is_fixed_by_its_stream() -> None:
    generator, _ = _model()
    labels = np.arange(900) % 3
    one = coded_frame(SCHEMA, generator.sample_coded(labels, np.random.default_rng(5), 10))
    two = coded_frame(SCHEMA, generator.sample_coded(labels, np.random.default_rng(5), 10))
    other = coded_frame(SCHEMA, generator.sample_coded(labels, np.random.default_rng(6), 10))
    pd.testing.assert_frame_equal(one, two)
    assert not one["ward"].equals(other["ward"])
    assert one["key"].iloc[0] == "p-11"


def test_tree_sampler_codes_keep_the_labels() -> None:
    generator, _ = _model()
    sampler: TreeSampler = generator.sampler
    labels = np.array([2, 0, 1, 1])
    uniform = np.random.default_rng(0).random((len(sampler.steps), 4))
    codes = sampler.draw(labels, uniform)
    assert codes.shape == (len(generator.domain.attributes), 4)
    np.testing.assert_array_equal(codes[generator.domain.target], labels)
    np.testing.assert_array_equal(sampler.sample(labels, uniform.T), codes.T)


def test_coded_samplers_draw_a_row_group_at_once_in_a_partitioned_release() -> None:
    from dpsynth.data.images import DataInfo

    generator, _ = _model()
    shape = (CODEC.dim,)
    info = DataInfo("t", "csv", 10, shape, SCHEMA.classes, "", "t", "table", SCHEMA.to_json())
    assert dataset_batch(generator) == CODED_BATCH == parquet_out.ROWS_PER_GROUP
    assert dataset_batch(object()) == DATASET_BATCH
    # its memory per row is a few values per column, not the encoded row's width
    assert row_values(generator, info) == len(SCHEMA.columns) < CODEC.dim
    assert row_values(object(), info) == CODEC.dim
