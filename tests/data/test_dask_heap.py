"""A Dask counting task's allocator settings (`dask_engine._with_heap`, issue 71).

- In a process whose environment fixed glibc's thresholds (`MALLOC_TRIM_THRESHOLD_`, as Dask's
  nanny starts its workers), the first counting task under way raises the mmap and trim
  thresholds and the last puts back those the environment gave, then trims the heap; a task
  that fails puts them back too. Without those variables nothing is called.
- Counted under it, on a local cluster's workers (in this process, the variables set), the
  counts, N and the digest are those of the in-memory engine, bit for bit.
"""

from __future__ import annotations

import platform
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dpsynth.data.discrete import ChunkEncoder, schema_domain
from dpsynth.data.engines import dask_engine, table_files
from dpsynth.data.engines.memory import MemoryCounter
from dpsynth.data.schema_draft import draft_table
from dpsynth.data.sources import read_table_file

VARIABLES = dask_engine._FIXED_BY


class FakeLibc:
    """glibc's two functions, recorded."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def mallopt(self, parameter: int, value: int) -> int:
        self.calls.append(("mallopt", parameter, value))
        return 1

    def malloc_trim(self, pad: int) -> int:
        self.calls.append(("malloc_trim", pad))
        return 1


@pytest.fixture
def libc(monkeypatch: pytest.MonkeyPatch) -> FakeLibc:
    """The engine's glibc replaced by a recorder, and no allocator variable set."""
    fake = FakeLibc()
    monkeypatch.setitem(dask_engine._HEAP, "libc", fake)
    for variable in VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    return fake


def test_the_first_task_raises_the_thresholds_and_the_last_puts_them_back(
    libc: FakeLibc, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "65536")
    roomy = [
        ("mallopt", dask_engine._M_MMAP_THRESHOLD, 32 * 2**20),
        ("mallopt", dask_engine._M_TRIM_THRESHOLD, 64 * 2**20),
    ]
    back = [
        ("mallopt", dask_engine._M_MMAP_THRESHOLD, 128 * 2**10),  # glibc's default
        ("mallopt", dask_engine._M_TRIM_THRESHOLD, 65536),  # the environment's
        ("malloc_trim", 0),
    ]
    inner_started, finish_inner = threading.Event(), threading.Event()
    seen: list[list[tuple[Any, ...]]] = []

    def inner() -> int:
        inner_started.set()
        finish_inner.wait(10)
        return 2

    def outer() -> int:
        thread = threading.Thread(target=dask_engine._with_heap, args=(inner,))
        thread.start()
        inner_started.wait(10)
        seen.append(list(libc.calls))  # two tasks under way: set once
        finish_inner.set()
        thread.join()
        seen.append(list(libc.calls))  # one left: not put back yet
        return 1

    assert dask_engine._with_heap(outer) == 1
    assert seen == [roomy, roomy]
    assert libc.calls == roomy + back and dask_engine._HEAP["tasks"] == 0
    libc.calls.clear()

    def fails() -> None:
        raise ValueError("a bad cell")

    with pytest.raises(ValueError, match="a bad cell"):
        dask_engine._with_heap(fails)
    assert libc.calls == roomy + back and dask_engine._HEAP["tasks"] == 0


def test_nothing_changes_where_glibc_slides_its_own_thresholds(libc: FakeLibc) -> None:
    assert dask_engine._with_heap(lambda a, b: a + b, 2, 3) == 5
    assert libc.calls == []


def test_counts_under_it_on_a_cluster_are_the_in_memory_counts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the environment's thresholds are glibc's own ceilings: putting them back leaves this
    # test process's allocator as roomy as glibc would have made it
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", str(64 * 2**20))
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", str(32 * 2**20))
    from distributed import Client, LocalCluster

    settings: list[bool] = []
    real = dask_engine._heap_settings

    def spy(roomy: bool) -> None:
        settings.append(roomy)
        real(roomy)

    monkeypatch.setattr(dask_engine, "_heap_settings", spy)

    rng = np.random.default_rng(7)
    frame = pd.DataFrame(
        {
            "age": rng.integers(18, 90, 3000),
            "colour": rng.choice(["red", "green", "blue"], 3000),
            "outcome": rng.choice(["yes", "no"], 3000),
        }
    )
    frame.to_csv(tmp_path / "t.csv", index=False)
    (tmp_path / "parts").mkdir()
    table = pa.Table.from_pandas(frame, preserve_index=False)
    for i in range(2):
        part = table.slice(i * 1500, 1500)
        pq.write_table(part, tmp_path / "parts" / f"part-{i}.parquet", row_group_size=300)
    raw = read_table_file(tmp_path / "t.csv", "csv:t")
    schema = draft_table(raw.header, raw.columns, "outcome")[0]
    encoder = ChunkEncoder(schema, schema_domain(schema, 8, True))
    memory = MemoryCounter(raw, encoder)
    local = LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None)
    client = Client(local)
    try:
        files = table_files(f"parquet:{tmp_path / 'parts'}")
        counter = dask_engine.DaskCounter(client, files, encoder, None)
        assert counter.scan() == memory.scan() and counter.record_count == 3000
        cliques = [(0,), (1, 2), (0, 1, 2), ()]
        for a, b in zip(memory.counts(cliques), counter.counts(cliques), strict=True):
            np.testing.assert_array_equal(a, b)
        assert dask_engine._HEAP["tasks"] == 0
        if platform.libc_ver()[0] == "glibc":
            assert dask_engine._glibc() is not None  # the real functions were called
        # each task ran under it (the workers run in this process): set, then put back
        assert settings and settings == [True, False] * (len(settings) // 2)
        counter.close()
    finally:
        client.close()
        local.close()
