"""The API without files in between: `Synthesizer.fit(frame)` trains on the frame in memory (the
same release as the Parquet file of it), `sample(n)` draws a typed DataFrame or an
`ImageBatch` (the same records and digests as `dpsynth sample`), and `evaluate` scores frames."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import dpsynth
from dpsynth import ImageBatch, Ledger, Synthesizer
from dpsynth.data.builtin_tables import TABLES_DIR
from dpsynth.sampling.options import SampleOptions
from dpsynth.sampling.table import sample_table_frame

SCHEMA = TABLES_DIR / "german_credit.schema.json"


@pytest.fixture(scope="module")
def credit() -> pd.DataFrame:
    return pd.read_csv(TABLES_DIR / "german_credit.csv")


def test_fit_reads_the_frame_in_memory_and_writes_none_of_it(
    credit: pd.DataFrame, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, one_torch_thread
) -> None:
    def written(*args: object, **kwargs: object) -> None:
        raise AssertionError("the frame was written out")

    synth = Synthesizer.create("mst", epsilon=1.0, preset="tiny", ledger=tmp_path / "l.jsonl")
    with monkeypatch.context() as patched:
        for method in ("to_csv", "to_parquet", "to_pickle", "to_feather"):
            patched.setattr(pd.DataFrame, method, written)
        synth.fit(credit, schema=SCHEMA)
    config = json.loads((synth.result.run_dir / "config.json").read_text())
    assert config["data"]["spec"] == "dataframe" and config["data"]["n"] == len(credit)
    rows = synth.sample(300)
    assert list(rows.columns) == list(credit.columns) and len(rows) == 300
    # typed by the schema: integer columns are integers, not text or floats
    assert str(rows["duration_in_month"].dtype) == "Int64"
    assert set(rows["credit_risk"].astype(str)) <= set(credit["credit_risk"].astype(str))
    report = dpsynth.evaluate(
        rows, credit, schema=SCHEMA, metrics="marginals", seeds=1, ledger=tmp_path / "l.jsonl"
    )
    assert 0.0 <= report.metrics["marginals"]["two_way"]["mean"] <= 1.0
    assert report.non_private  # scored against the rows it trained on: it says so


def test_a_frame_trains_the_same_release_as_its_parquet_file(
    credit: pd.DataFrame, tmp_path: Path, one_torch_thread
) -> None:
    credit.to_parquet(tmp_path / "credit.parquet", index=False)
    samples = []
    for name, data in (("frame", credit), ("file", tmp_path / "credit.parquet")):
        run = dpsynth.train(
            method="mst", data=data, epsilon=1.0, preset="tiny", out=tmp_path / name,
            ledger=tmp_path / f"{name}.jsonl", schema=SCHEMA, privacy_seed=11, device="cpu",
        )  # fmt: skip
        assert run is not None
        sampled = dpsynth.sample(run.run_dir, 200, tmp_path / f"{name}.csv", device="cpu")
        samples.append((tmp_path / f"{name}.csv").read_bytes())
        assert sampled.output_sha256
    assert samples[0] == samples[1]


def test_an_in_memory_sample_is_the_file_sample_and_is_recorded(
    credit: pd.DataFrame, tmp_path: Path, one_torch_thread
) -> None:
    ledger = tmp_path / "l.jsonl"
    synth = Synthesizer.create("mst", epsilon=1.0, preset="tiny", ledger=ledger, device="cpu")
    synth.fit(credit, schema=SCHEMA)
    run_dir = synth.result.run_dir
    on_disk = dpsynth.sample(run_dir, 250, tmp_path / "s.csv", seed=4, labels="auto")
    options = SampleOptions(labels="auto", seed=4, ledger_path=ledger)
    rows, manifest = sample_table_frame(run_dir, 250, options)
    # the same rows: their CSV text has the file's digest
    assert manifest["output_sha256"] == on_disk.output_sha256
    assert len(rows) == 250 and list(rows.columns) == list(credit.columns)
    releases = [e for e in Ledger(ledger).entries() if e.get("command") == "sample"]
    assert [r["details"]["format"] for r in releases] == ["csv", "dataframe"]
    assert releases[1]["details"]["out"] == "in memory"


def test_images_come_back_as_a_typed_batch_equal_to_the_npz_sample(
    tmp_path: Path, one_torch_thread
) -> None:
    synth = Synthesizer.create(
        "dpkernel", epsilon=2.0, preset="tiny", ledger=tmp_path / "l.jsonl", device="cpu"
    )
    batch = synth.fit("digits").sample(30)
    assert isinstance(batch, ImageBatch) and len(batch) == 30
    assert batch.images.dtype == np.uint8 and batch.images.shape[0] == 30
    assert batch.labels.dtype == np.int64 and batch.classes == tuple(str(i) for i in range(10))
    assert batch.label_names[0] == batch.classes[batch.labels[0]]
    images, labels = batch.to_torch()
    assert images.dtype.is_floating_point and float(images.max()) <= 1.0
    assert labels.tolist() == batch.labels.tolist()
    npz = dpsynth.sample(synth.result.run_dir, 30, tmp_path / "s", fmt="npz", device="cpu")
    with np.load(npz.out / "samples.npz") as archive:
        assert np.array_equal(archive["x"], batch.images)
        assert np.array_equal(archive["y"], batch.labels)


def test_a_drafted_frame_comes_back_typed(tmp_path: Path, one_torch_thread) -> None:
    rng = np.random.default_rng(0)
    frame = pd.DataFrame(
        {
            "visits": rng.integers(0, 6, 300),
            "seen": pd.Timestamp("2024-01-01") + pd.to_timedelta(rng.integers(0, 90, 300), "D"),
            "ward": rng.choice(["a", "b", "c"], 300),
            "label": rng.choice(["yes", "no"], 300),
        }
    )
    frame["seen"] = frame["seen"].dt.date  # a date column, not a timestamp
    synth = Synthesizer.create("mst", epsilon=5.0, preset="tiny", ledger=tmp_path / "l.jsonl")
    rows = synth.fit(frame, schema_public=True).sample(100)
    assert str(rows["visits"].dtype) == "Int64"
    assert pd.api.types.is_datetime64_any_dtype(rows["seen"])
    assert set(rows["ward"].dropna()) <= {"a", "b", "c"}
