"""A table sample's rows come in a random order of their classes, never class by class: in a
CSV, a Parquet file and every partition of a partitioned release. The order comes from the
public seed (same seed, same bytes; another seed, another order), every class keeps exactly
its manifest's count, surrogate keys run 1..N in file order, and memory stays O(batch) however
many labels. Image sampling keeps its class-by-class labels (its releases are unchanged)."""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch
from typer.testing import CliRunner

from dpsynth.cli import app
from dpsynth.data.table_codec import codec_for
from dpsynth.sampling import sample_run
from dpsynth.sampling.dataset import MANIFEST
from dpsynth.sampling.labels import label_chunks, labelled_batches, shuffled_label_chunks
from dpsynth.sampling.partition_worker import draw_partition
from dpsynth.sampling.partitions import plan_partitions
from dpsynth.sampling.trained_run import load_generator

runner = CliRunner()

SCHEMA = {
    "format": "dpsynth-schema-v1",
    "target": "label",
    "columns": [
        {"name": "row_id", "type": "id", "prefix": "syn-"},
        {"name": "age", "type": "integer", "min": 18, "max": 89, "missing": False},
        {"name": "city", "type": "categorical", "categories": ["Lyon", "Nice", "Paris"]},
        {"name": "label", "type": "categorical", "categories": ["no", "yes"]},
    ],
}
CLASSES = SCHEMA["columns"][-1]["categories"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny mst run on a small CSV with an id column and a two-class target."""
    base = tmp_path_factory.mktemp("row-order")
    rng = np.random.default_rng(0)
    n = 200
    pd.DataFrame({
        "row_id": [f"R{i}" for i in range(n)],
        "age": rng.integers(18, 90, n),
        "city": rng.choice(["Paris", "Lyon", "Nice"], n),
        "label": rng.choice(CLASSES, n, p=[0.6, 0.4]),
    }).to_csv(base / "t.csv", index=False)  # fmt: skip
    (base / "s.json").write_text(json.dumps(SCHEMA))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        result = runner.invoke(app, [
            "train", "--method", "mst", "--data", f"csv:{base / 't.csv'}",
            "--schema", str(base / "s.json"), "--schema-public", "--epsilon", "2",
            "--preset", "tiny", "--out", str(base / "run"),
            "--ledger", str(base / "ledger.jsonl"), "--device", "cpu", "-q",
        ])  # fmt: skip
    finally:
        torch.set_num_threads(threads)
    assert result.exit_code == 0, result.output
    return base


def _sample(trained: Path, out: Path, seed: int, **extra: object) -> dict:
    return sample_run(
        trained / "run", 400, out, seed=seed, ledger_path=trained / "ledger.jsonl",
        device="cpu", **extra,
    )  # fmt: skip


def _check_shuffled(labels: list[str], counts: list[int]) -> None:
    """`labels` hold exactly `counts` of each class, in a random order: not sorted, the first
    50 mixed, and about as many class changes as a random order has (class by class: one)."""
    assert [labels.count(c) for c in CLASSES] == counts
    assert min(counts) >= 50  # a mix that a random order shows in any 50 rows
    assert labels not in (sorted(labels), sorted(labels, reverse=True))
    assert len(set(labels[:50])) == len(CLASSES)
    changes = sum(a != b for a, b in itertools.pairwise(labels))
    expected = 2 * counts[0] * counts[1] / len(labels)  # a random permutation's mean
    assert changes > expected / 2


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_csv_sample_is_in_random_order_fixed_by_the_seed(trained: Path, tmp_path: Path) -> None:
    def sample(name: str, seed: int) -> tuple[pd.DataFrame, dict]:
        out = tmp_path / name
        result = runner.invoke(app, [
            "sample", str(trained / "run"), "--n", "400", "--out", str(out), "--seed", str(seed),
            "--labels", "balanced", "--ledger", str(trained / "ledger.jsonl"),
            "--device", "cpu", "-q",
        ])  # fmt: skip
        assert result.exit_code == 0, result.output
        manifest = json.loads(out.with_name(f"{name}.manifest.json").read_text())
        return pd.read_csv(out, dtype=str, keep_default_na=False), manifest

    first, manifest = sample("a.csv", 3)
    assert manifest["label_counts"] == [200, 200] and manifest["seed"] == 3
    _check_shuffled(first["label"].tolist(), manifest["label_counts"])
    # surrogate keys number the rows in file order, whatever their classes
    assert first["row_id"].tolist() == [f"syn-{i}" for i in range(1, 401)]
    sample("b.csv", 3)
    assert _sha(tmp_path / "a.csv") == _sha(tmp_path / "b.csv") == manifest["output_sha256"]
    other, other_manifest = sample("c.csv", 4)
    assert other_manifest["label_counts"] == manifest["label_counts"]
    assert other["label"].tolist() != first["label"].tolist()


def test_a_parquet_file_is_in_random_order_with_the_manifest_counts(
    trained: Path, tmp_path: Path
) -> None:
    one = _sample(trained, tmp_path / "a.parquet", seed=0)  # `auto`: the model's own mix
    assert one["format"] == "parquet" and sum(one["label_counts"]) == 400
    table = pq.read_table(tmp_path / "a.parquet")
    _check_shuffled(table["label"].to_pylist(), one["label_counts"])
    assert table["row_id"].to_pylist() == [f"syn-{i}" for i in range(1, 401)]
    two = _sample(trained, tmp_path / "b.parquet", seed=0)
    assert two["output_sha256"] == one["output_sha256"] == _sha(tmp_path / "b.parquet")


def test_every_partition_is_in_its_own_random_order(
    trained: Path, tmp_path: Path, one_torch_thread: None
) -> None:
    one = _sample(
        trained, tmp_path / "one", seed=5, labels="balanced", partitions=2, workers=1,
        batch_size=64,
    )  # fmt: skip
    parts = one["partitions"]
    orders = []
    for part in parts:
        table = pq.read_table(tmp_path / "one" / part["file"])
        labels = table["label"].to_pylist()
        _check_shuffled(labels, part["label_counts"])
        first = part["start"] + 1
        keys = [f"syn-{i}" for i in range(first, first + part["rows"])]
        assert table["row_id"].to_pylist() == keys
        orders.append(labels)
    assert orders[0] != orders[1]  # each from its own partition seed
    assert [sum(p["label_counts"][c] for p in parts) for c in range(2)] == one["label_counts"]
    assert json.loads((tmp_path / "one" / MANIFEST).read_text())["partitions"] == parts
    # a partition drawn again here (as a worker draws it) from the same seed: the same bytes;
    # from another seed: another order of the same labels
    generator, _, info = load_generator(trained / "run", "cpu")
    plan = plan_partitions(400, one["label_counts"], seed=5, partitions=2)
    again = draw_partition(generator, codec_for(info), plan[0], tmp_path, 64)
    assert again["sha256"] == parts[0]["sha256"]
    other = replace(plan[0], seed=plan[0].seed + 1)
    (tmp_path / "other").mkdir()
    draw_partition(generator, codec_for(info), other, tmp_path / "other", 64)
    labels = pq.read_table(tmp_path / "other" / other.name)["label"].to_pylist()
    assert labels != orders[0] and sorted(labels) == sorted(orders[0])


# ------------------------------------------------------------------------- the label order


def test_shuffled_labels_are_exact_fixed_by_the_seed_and_uniform() -> None:
    counts = [5, 0, 300, 95]
    chunks = list(shuffled_label_chunks(counts, 64, seed=1))
    assert [len(c) for c in chunks] == [64] * 6 + [16]
    assert all(c.dtype == torch.int64 for c in chunks)
    labels = torch.cat(chunks)
    assert torch.bincount(labels, minlength=4).tolist() == counts
    assert labels.tolist() != sorted(labels.tolist())
    # the same seed, the same order; another seed, another
    again = torch.cat(list(shuffled_label_chunks(counts, 64, seed=1)))
    assert torch.equal(labels, again)
    assert not torch.equal(labels, torch.cat(list(shuffled_label_chunks(counts, 64, seed=2))))
    # one label of class 1 among 9 others lands on each position about equally often
    where = [
        int(torch.cat(list(shuffled_label_chunks([9, 1], 3, seed=s))).argmax()) for s in range(2000)
    ]
    share = np.bincount(where, minlength=10) / 2000
    assert np.all(np.abs(share - 0.1) < 0.035)


def test_shuffled_labels_stream_from_huge_counts_in_batch_memory() -> None:
    chunks = shuffled_label_chunks([10**12, 10**12, 1], 500, seed=0)
    first = next(chunks)
    assert first.shape == (500,) and set(first.tolist()) == {0, 1}
    counts = [500_000_000, 500_000_000]  # 10⁹: numpy's multivariate hypergeometric refuses it
    assert sorted(set(next(shuffled_label_chunks(counts, 1000, seed=0)).tolist())) == [0, 1]


class _Echo:
    """A stand-in generator whose records are their labels (one value each)."""

    device = torch.device("cpu")

    def sample(
        self, labels: torch.Tensor, batch_size: int, generator: torch.Generator
    ) -> Iterator[torch.Tensor]:
        for start in range(0, len(labels), batch_size):
            yield labels[start : start + batch_size, None].float()


def test_labelled_batches_shuffle_only_when_asked() -> None:
    counts = [30, 50, 20]
    plain = list(labelled_batches(_Echo(), counts, 16, seed=0))  # images: class by class
    assert torch.equal(torch.cat([y for _, y in plain]), torch.cat(list(label_chunks(counts, 16))))
    mixed = list(labelled_batches(_Echo(), counts, 16, seed=0, shuffle=True))
    labels = torch.cat([y for _, y in mixed])
    assert torch.equal(labels, torch.cat(list(shuffled_label_chunks(counts, 16, seed=0))))
    assert all(torch.equal(x[:, 0].long(), y) for x, y in mixed)  # each record with its label
    assert torch.bincount(labels).tolist() == counts
