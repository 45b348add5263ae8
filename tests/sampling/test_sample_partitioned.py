"""`sample --out DIR/` (or `--partitions K`, or Parquet above a million rows): a partitioned
Parquet release written by worker processes. It reads back as one table (pyarrow.dataset,
pandas, DuckDB) with the public schema's Arrow types and n rows; its content depends on the
seed and the partitions, never on the worker count; partitions draw from different seeds;
labels and surrogate keys are split exactly; a bad `--out` is one line, exit 2, nothing
recorded; an interrupted run leaves nothing that looks like a release. The plan's arithmetic
(label split, seeds, which `--out` is partitioned, `--n 1e9`) is checked without a run."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from dpsynth.cli import app
from dpsynth.cli.sample import parse_count
from dpsynth.data.schema_file import parse_schema
from dpsynth.errors import UsageError
from dpsynth.ledger import Ledger
from dpsynth.sampling import sample_run
from dpsynth.sampling.dataset import MANIFEST, SUCCESS
from dpsynth.sampling.parquet_out import arrow_schema
from dpsynth.sampling.partitions import (
    CODED_BATCH,
    PARTITION_ROWS,
    partition_seed,
    plan_partitions,
    split_counts,
    wants_partitions,
)

runner = CliRunner()

SCHEMA = {
    "format": "dpsynth-schema-v1",
    "target": "label",
    "columns": [
        {"name": "patient_id", "type": "id", "prefix": "syn-"},
        {"name": "height", "type": "numeric", "min": 140, "max": 200, "decimals": 1,
         "missing": True},
        {"name": "age", "type": "integer", "min": 18, "max": 89, "missing": False},
        {"name": "city", "type": "categorical", "categories": ["Lyon", "Nice", "Paris"]},
        {"name": "visit", "type": "date", "min": "2020-01-01", "max": "2022-06-30",
         "format": "%Y-%m-%d", "missing": False},
        {"name": "label", "type": "categorical", "categories": ["no", "yes"]},
    ],
}  # fmt: skip


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small CSV (with an id column), its declared public schema and a tiny mst run."""
    import torch

    base = tmp_path_factory.mktemp("partitioned")
    rng = np.random.default_rng(0)
    n = 300
    pd.DataFrame({
        "patient_id": [f"P{i:05d}" for i in range(n)],
        "height": np.where(np.arange(n) % 7 == 0, np.nan, rng.normal(170, 10, n).round(1)),
        "age": rng.integers(18, 90, n),
        "city": rng.choice(["Paris", "Lyon", "Nice"], n),
        "visit": [str(dt.date(2020, 1, 1) + dt.timedelta(days=int(d)))
                  for d in rng.integers(0, 900, n)],
        "label": rng.choice(["no", "yes"], n, p=[0.7, 0.3]),
    }).to_csv(base / "t.csv", index=False)  # fmt: skip
    (base / "s.json").write_text(json.dumps(SCHEMA))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        result = runner.invoke(app, [
            "train", "--method", "mst", "--data", f"csv:{base / 't.csv'}",
            "--schema", str(base / "s.json"), "--schema-public", "--epsilon", "2",
            "--preset", "tiny", "--out", str(base / "run"),
            "--ledger", str(base / "ledger.jsonl"), "--device", "cpu", "--json",
        ])  # fmt: skip
    finally:
        torch.set_num_threads(threads)
    assert result.exit_code == 0, result.output
    return base


def _sample(trained: Path, out: str, *extra: str) -> object:
    return runner.invoke(app, [
        "sample", str(trained / "run"), "--out", out, "--ledger", str(trained / "ledger.jsonl"),
        "--device", "cpu", *extra,
    ])  # fmt: skip


def _releases(trained: Path) -> list[dict]:
    return [e for e in Ledger(trained / "ledger.jsonl").entries() if e.get("kind") == "release"]


def test_a_partitioned_release_reads_back_as_one_typed_table(trained: Path, tmp_path: Path) -> None:
    out = tmp_path / "synth"
    result = _sample(trained, f"{out}/", "--n", "2_000", "--partitions", "3", "--workers", "2",
                     "--json")  # fmt: skip
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted([MANIFEST, SUCCESS, *(f"part-0000{i}.parquet" for i in range(3))])
    # one table, as the readers of a Parquet dataset see it, typed by the public schema
    dataset = pads.dataset(out, format="parquet")
    assert len(dataset.files) == 3  # _manifest.json and _SUCCESS are not read as rows
    table = dataset.to_table()
    assert table.num_rows == 2000
    assert table.schema == arrow_schema(parse_schema(SCHEMA))
    assert len(pd.read_parquet(out)) == 2000
    duckdb = pytest.importorskip("duckdb")
    assert duckdb.sql(f"select count(*) from read_parquet('{out}/*.parquet')").fetchall() == [
        (2000,)
    ]
    # surrogate keys run on across partitions; rows are sizes as even as possible
    keys = table["patient_id"].to_pylist()
    assert keys == [f"syn-{i}" for i in range(1, 2001)]
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest["batch_size"] == CODED_BATCH  # mst: a row group's rows drawn at once
    parts = manifest["partitions"]
    assert [p["rows"] for p in parts] == [667, 667, 666]
    assert [p["start"] for p in parts] == [0, 667, 1334]
    # the per-class counts are split exactly: each partition's labels are what it lists
    assert [sum(p["label_counts"][c] for p in parts) for c in range(2)] == manifest["label_counts"]
    for part in parts:
        labels = pq.read_table(out / part["file"])["label"].to_pylist()
        assert [labels.count("no"), labels.count("yes")] == part["label_counts"]
        assert part["sha256"] == hashlib.sha256((out / part["file"]).read_bytes()).hexdigest()
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part["file"].encode() + b"\0" + bytes.fromhex(part["sha256"]))
    assert manifest["output_sha256"] == summary["output_sha256"] == digest.hexdigest()
    release = _releases(trained)[-1]
    assert release["output_sha256"] == manifest["output_sha256"]
    assert release["details"]["partitions"] == 3 and release["epsilon"] == 0.0
    assert manifest["privacy"] == summary["privacy"] and "ε ≤" in manifest["privacy"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging left


def test_the_rows_depend_on_the_seed_and_partitions_not_on_the_workers(
    trained: Path, tmp_path: Path
) -> None:
    def release(name: str, workers: int, seed: int = 7) -> dict:
        return sample_run(
            trained / "run", 1200, tmp_path / name, seed=seed, partitions=2, workers=workers,
            ledger_path=trained / "ledger.jsonl", device="cpu",
        )  # fmt: skip

    one, two = release("one", 1), release("two", 2)
    assert [p["sha256"] for p in one["partitions"]] == [p["sha256"] for p in two["partitions"]]
    assert one["output_sha256"] == two["output_sha256"]
    assert one["workers"] == 1 and two["workers"] == 2
    # the partitions are not copies: their own seeds, and different rows
    seeds = [p["seed"] for p in one["partitions"]]
    assert len(set(seeds)) == 2 and 7 not in seeds
    first, second = (pq.read_table(tmp_path / "one" / p["file"]) for p in one["partitions"])
    drawn = ["height", "age", "city", "visit"]
    assert first.select(drawn).slice(0, 100) != second.select(drawn).slice(0, 100)
    assert release("other", 1, seed=8)["output_sha256"] != one["output_sha256"]


def test_progress_is_one_line_per_partition_when_piped_and_force_replaces_a_release(
    trained: Path, tmp_path: Path
) -> None:
    out = tmp_path / "synth.parquet"
    first = _sample(trained, str(out), "--n", "900", "--partitions", "3", "--workers", "1")
    assert first.exit_code == 0, first.output
    lines = [line for line in first.output.splitlines() if line.startswith("sample: partition")]
    assert lines == [
        "sample: partition 1/3 written, 300 of 900 rows",
        "sample: partition 2/3 written, 600 of 900 rows",
        "sample: partition 3/3 written, 900 of 900 rows",
    ]
    assert "wrote 900 rows to" in first.output and "3 partitions" in first.output
    before = len(_releases(trained))
    refused = _sample(trained, str(out), "--n", "900", "--partitions", "2")
    assert refused.exit_code == 2
    assert refused.output.strip().splitlines() == [
        f"error: --out {out} exists and is not empty; use --force to replace it"
    ]
    replaced = _sample(trained, str(out), "--n", "500", "--partitions", "2", "--force", "-q")
    assert replaced.exit_code == 0, replaced.output
    assert pads.dataset(out, format="parquet").count_rows() == 500
    assert sorted(p.name for p in out.iterdir() if p.name.startswith("part-")) == [
        "part-00000.parquet", "part-00001.parquet",
    ]  # fmt: skip
    assert len(_releases(trained)) == before + 1


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--n", "100", "--partitions", "2"], "holds files this command did not write"),
        (["--n", "100"], "exists and is not empty; use --force"),
        (["--n", "100", "--partitions", "200"], "--partitions 200 is more than --n 100"),
        (["--n", "100", "--format", "csv", "--partitions", "2"], "is written as Parquet"),
        (["--n", "1e-3"], "Invalid value for '--n': '1e-3' is not a whole number of records"),
        (["--n", "100", "--partitions", "2", "--workers", "0"], "--workers must be at least 1"),
    ],
)
def test_a_bad_out_or_option_is_one_line_exit_2_and_nothing_recorded(
    trained: Path, tmp_path: Path, extra: list[str], message: str
) -> None:
    out = tmp_path / "taken"
    out.mkdir()
    (out / "notes.txt").write_text("not a sample")
    force = ["--force"] if message.startswith("holds") else []
    before = len(_releases(trained))
    result = _sample(trained, f"{out}/", *extra, *force)
    assert result.exit_code == 2, result.output
    assert len(result.output.strip().splitlines()) == 1 and message in result.output
    assert (out / "notes.txt").read_text() == "not a sample"
    assert len(_releases(trained)) == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_an_interrupted_release_leaves_no_folder_and_no_ledger_entry(
    trained: Path, tmp_path: Path
) -> None:
    before = len(_releases(trained))

    def stop(done: int, total: int) -> None:
        raise KeyboardInterrupt  # Ctrl-C once the first partition is written

    with pytest.raises(KeyboardInterrupt):
        sample_run(
            trained / "run", 900, tmp_path / "synth", partitions=3, workers=1, progress=stop,
            ledger_path=trained / "ledger.jsonl", device="cpu",
        )  # fmt: skip
    assert list(tmp_path.iterdir()) == []  # neither the release nor its staging folder
    assert len(_releases(trained)) == before


# ----------------------------------------------------------------------------- the plan


def test_labels_are_split_exactly_at_a_billion_rows() -> None:
    n, counts = 10**9, [612_345_678, 387_654_321, 1]
    plan = plan_partitions(n, counts, seed=3, partitions=None)
    assert len(plan) == n // PARTITION_ROWS
    assert all(p.rows == PARTITION_ROWS for p in plan)
    assert [sum(p.counts[c] for p in plan) for c in range(3)] == counts
    assert all(abs(p.counts[0] - 612_345.678) <= 1 for p in plan)  # each the release's mix
    assert [p.start for p in plan[:3]] == [0, PARTITION_ROWS, 2 * PARTITION_ROWS]
    assert split_counts([5, 0, 2], [3, 3, 1]) == [[2, 0, 1], [2, 0, 1], [1, 0, 0]]


def test_partition_seeds_are_distinct_and_fixed_by_the_seed_and_index() -> None:
    seeds = [partition_seed(0, i) for i in range(10_000)]
    assert len(set(seeds)) == 10_000 and all(0 <= s < 2**63 for s in seeds)
    assert seeds[:5] == [partition_seed(0, i) for i in range(5)]
    assert partition_seed(1, 0) != seeds[0]


def test_which_out_is_a_partitioned_release(tmp_path: Path) -> None:
    big = PARTITION_ROWS + 1
    assert wants_partitions("synth/", 10, None, None)
    assert wants_partitions(tmp_path, 10, None, None)  # an existing folder
    assert wants_partitions("s.csv", 10, None, 2)
    assert wants_partitions("s.parquet", big, None, None)
    assert not wants_partitions("s.parquet", PARTITION_ROWS, None, None)
    assert not wants_partitions("s.csv", big, None, None)  # a big CSV stays one file


def test_n_is_written_as_people_write_counts() -> None:
    for text in ("1e9", "1E9", "1_000_000_000", "1000000000", "1G", "1b", "1000M"):
        assert parse_count(text) == 10**9
    assert parse_count("2.5M") == 2_500_000 and parse_count("10k") == 10_000
    for bad in ("1.5", "1e-3", "-5", "ten", "1e9999", ""):
        with pytest.raises(UsageError):
            parse_count(bad)
