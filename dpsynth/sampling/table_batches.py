"""The generated batches of a table's sample (a file, or one partition of a partitioned release)
as `CodedRows`, in the release's row order, from its public seed.

The labels come in a random order drawn from the seed (`labels.shuffled_label_chunks`). A
generator that draws discrete codes (`coded_rows.CodedSampler`: aim, mst) turns each chunk of
labels into `CodedRows` itself, with the seed's numpy stream; any other yields encoded rows
(`labels.labelled_batches`, its latents from the seed), whose one-hot blocks
`TableCodec.coded` samples with that same numpy stream. A run with a privacy unit gets its
synthetic people's keys (`sampling.units`) in its unit column.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from dpsynth.data.coded_rows import CodedRows, CodedSampler
from dpsynth.data.table_codec import TableCodec
from dpsynth.sampling.labels import labelled_batches, shuffled_label_chunks
from dpsynth.sampling.units import UnitSpec


def coded_batches(
    generator: Any,
    codec: TableCodec,
    counts: Sequence[int],
    batch_size: int,
    seed: int,
    start: int = 0,
    units: UnitSpec | None = None,
) -> Iterator[CodedRows]:
    """Batches of at most `batch_size` rows holding exactly `counts[c]` rows of class c, in a
    random order, drawn from `generator` with the public `seed` (see the module docstring);
    `start` is the release's row number of the first row (surrogate keys, unit keys)."""
    rng = np.random.default_rng(seed)
    keys = units.keys(seed, start) if units is not None else None
    for coded in _batches(generator, codec, counts, batch_size, seed, rng, start):
        if keys is not None and units is not None:
            coded = replace(coded, keys={units.column: keys.next(len(coded))})
        yield coded


def _batches(
    generator: Any,
    codec: TableCodec,
    counts: Sequence[int],
    batch_size: int,
    seed: int,
    rng: np.random.Generator,
    start: int,
) -> Iterator[CodedRows]:
    done = start
    if isinstance(generator, CodedSampler):
        for chunk in shuffled_label_chunks(counts, batch_size, seed):
            coded = generator.sample_coded(chunk.numpy(), rng, done)
            done += len(coded)
            yield coded
        return
    for rows, chunk in labelled_batches(generator, counts, batch_size, seed, shuffle=True):
        coded = codec.coded(rows.cpu().numpy(), chunk.numpy(), rng, start=done)
        done += len(coded)
        yield coded
