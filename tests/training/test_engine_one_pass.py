"""One pass over a table counted out of core under a public schema (issue 71, item 2).

- The check pass counts the marginals the trainer will first ask for (public facts: the
  method, its preset, the schema), so a run makes one pass in all; one secret seed gives the
  same model as the two-pass run (the check pass, then a counting pass) and as the in-memory
  run, for mst and aim, on a CSV and on a partitioned Parquet folder; the summary and the
  piped lines (two counting processes) say one pass.
- `--method auto` guesses on the Parquet footers' N (one pass); a CSV has no N before its
  read, so its run makes two. With a DP schema release, the check pass counts its first
  round (four passes: the check, two more rounds, the counting under the released schema).
- A bad cell still fails that pass in one line before anything is spent or drawn.
- The counter hands out only what it counted ahead under the trainer's encoder: other cliques,
  or another binning, are a pass of their own with the same counts; a pass reads only the
  columns the schema uses; what the methods plan ahead is what a new trainer asks for first.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from dpsynth.cli import app
from dpsynth.data.discrete import ChunkEncoder, schema_domain, table_domain
from dpsynth.data.engines import table_files
from dpsynth.data.engines.base import Ahead
from dpsynth.data.engines.duckdb_engine import DuckDBCounter
from dpsynth.data.engines.memory import MemoryCounter
from dpsynth.data.engines.parts import parquet_parts, part_chunks
from dpsynth.data.schema_file import as_schema
from dpsynth.data.sources import load_table, read_table_file
from dpsynth.methods.registry import get_method
from dpsynth.privacy.accounting.plan import PrivacyTarget
from dpsynth.privacy.mechanisms.randomness import PrivateRandomness
from dpsynth.training import train_run

runner = CliRunner()
GERMAN = Path(__file__).resolve().parents[2] / "dpsynth" / "data" / "tables"
SEED = 4321


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """german-credit as a CSV, as a Parquet folder of three files, and its public schema."""
    folder = tmp_path_factory.mktemp("one-pass")
    shutil.copy(GERMAN / "german_credit.csv", folder / "german.csv")
    shutil.copy(GERMAN / "german_credit.schema.json", folder / "german.schema.json")
    table = pa.Table.from_pandas(pd.read_csv(folder / "german.csv"), preserve_index=False)
    (folder / "parts").mkdir()
    for i in range(3):
        part = table.slice(i * 334, 334)
        pq.write_table(part, folder / "parts" / f"part-{i}.parquet", row_group_size=100)
    return folder


def _train(folder: Path, name: str, data: str, **fields) -> tuple[dict, dict]:
    out = folder / name
    shutil.rmtree(out, ignore_errors=True)
    fields = {
        "method": "mst",
        "data": data,
        "schema": folder / "german.schema.json",
        "epsilon": 2.0,
        "ledger_path": folder / f"{name}.ledger.jsonl",
        "privacy_seed": SEED,
        "preset": "tiny",
        "out": out,
        **fields,
    }
    if fields.get("engine") == "duckdb":  # parts counted here (the CLI test below spawns two)
        fields["workers"] = 1
    summary = train_run(**fields)
    checkpoints = sorted(p for p in out.rglob("*.safetensors") if "private" not in p.parts)
    return summary, load_file(checkpoints[-1])


def _same(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for key in a:
        assert torch.equal(a[key], b[key]), key


@pytest.mark.parametrize("method", ["mst", "aim"])
def test_one_pass_releases_what_two_passes_release(
    folder: Path, method: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    csv, parts = f"csv:{folder / 'german.csv'}", f"parquet:{folder / 'parts'}"
    common = {"method": method, "preset": "tiny"}
    _, memory = _train(folder, f"{method}-memory", csv, engine="memory", **common)
    for data in (csv, parts):
        kind = data.split(":")[0]
        one, state = _train(folder, f"{method}-{kind}-one", data, engine="duckdb", **common)
        assert (one["engine"], one["passes"]) == ("duckdb", 1)
        (name,) = one["pass_names"]
        assert name.startswith("check, ") and name.endswith(" marginals")
        _same(state, memory)
        with monkeypatch.context() as patch:
            patch.setattr("dpsynth.training.table_source.first_counts", lambda r, b: None)
            two, before = _train(folder, f"{method}-{kind}-two", data, engine="duckdb", **common)
        assert two["passes"] == 2 and two["pass_names"][0] == "check"
        _same(before, state)


def test_auto_guesses_on_the_footers_and_a_release_keeps_its_passes(folder: Path) -> None:
    parts, csv = f"parquet:{folder / 'parts'}", f"csv:{folder / 'german.csv'}"
    auto = {"method": "auto", "engine": "duckdb", "epsilon": 10.0}
    guessed, _ = _train(folder, "auto-parquet", parts, **auto)
    assert guessed["passes"] == 1  # the method recommended on the footers' N: counted ahead
    unknown, _ = _train(folder, "auto-csv", csv, **auto)
    assert unknown["passes"] == 2  # no N before a CSV is read: no guess, a pass of its own
    drafted = as_schema(folder / "german.schema.json").to_json()
    for column in drafted["columns"]:
        if column["name"] == "purpose":
            column["source"] = "data (drafted)"
    (folder / "drafted.json").write_text(json.dumps(drafted))
    released, _ = _train(folder, "release", parts, engine="duckdb", schema=folder / "drafted.json")
    assert released["passes"] == 4  # the check pass counts the release's first round
    assert released["pass_names"][0] == "check, schema release round 1"


def test_piped_lines_and_json_say_one_pass(folder: Path) -> None:
    result = runner.invoke(app, [
        "train", "--method", "mst", "--data", f"parquet:{folder / 'parts'}",
        "--schema", str(folder / "german.schema.json"), "--epsilon", "2", "--engine", "duckdb",
        "--preset", "tiny", "--workers", "2", "--out", str(folder / "piped"),
        "--ledger", str(folder / "piped.ledger.jsonl"),
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    lines = [line for line in result.stderr.splitlines() if line.startswith("pass ")]
    assert len(lines) == 1 and lines[0].startswith("pass 1 (duckdb, check, ")
    assert "marginals): 1,000 rows" in lines[0]
    assert "passes over the data: 1 (duckdb): check, " in result.stdout


def test_a_bad_cell_fails_the_one_pass_before_anything_is_spent(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bad = folder / "bad"
    shutil.copytree(folder / "parts", bad, dirs_exist_ok=True)
    frame = pq.read_table(bad / "part-2.parquet").to_pandas()
    frame.loc[frame.index[200], "purpose"] = "A499"  # not one of the schema's categories
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), bad / "part-2.parquet")
    drawn: list[int] = []
    monkeypatch.setattr(
        "dpsynth.privacy.mechanisms.marginal_measure.MarginalQueries.measure",
        lambda *args, **kwargs: drawn.append(1),
    )
    ledger, out = folder / "bad.ledger.jsonl", folder / "bad-run"
    result = runner.invoke(app, [
        "train", "--method", "mst", "--data", f"parquet:{bad}", "--epsilon", "2",
        "--schema", str(folder / "german.schema.json"), "--engine", "duckdb",
        "--preset", "tiny", "--out", str(out), "--ledger", str(ledger),
    ])  # fmt: skip
    assert result.exit_code == 4, result.output
    errors = [line for line in result.stderr.splitlines() if not line.startswith("pass ")]
    assert len(errors) == 1 and "'A499', which is not in the schema's category" in errors[0]
    assert not ledger.exists() or not ledger.read_text().strip()  # nothing reserved or spent
    assert not out.exists() and not drawn


def _encoder(folder: Path, bins: int) -> ChunkEncoder:
    schema = as_schema(folder / "german.schema.json")
    return ChunkEncoder(schema, schema_domain(schema, bins, True))


def test_the_counter_hands_out_only_what_it_counted_ahead(folder: Path) -> None:
    files = table_files(f"parquet:{folder / 'parts'}")
    check, ahead = _encoder(folder, 2), _encoder(folder, 8)
    raw = read_table_file(folder / "german.csv", "csv:german")
    memory = MemoryCounter(raw, ahead)
    counter = DuckDBCounter(files, check, None, 128 * 2**20, workers=1)
    first = [(0,), (1, 2), (3, 1, 20)]
    assert counter.scan(Ahead(ahead, tuple(first))) == memory.scan()
    assert (counter.record_count, counter.passes) == (1000, 1)
    counter.use_domain(ahead)
    asked = [(1, 2), (0,), (4, 20), (1, 2)]  # one clique not counted ahead: one more pass
    for a, b in zip(counter.counts(asked), memory.counts(asked), strict=True):
        np.testing.assert_array_equal(a, b)
    assert counter.passes == 2 and counter.pass_names[0] == "check, 3 marginals"
    counter.use_domain(_encoder(folder, 16))  # another binning: what was held does not serve
    other = MemoryCounter(raw, _encoder(folder, 16))
    np.testing.assert_array_equal(counter.counts([(3, 1, 20)])[0], other.counts([(3, 1, 20)])[0])
    assert counter.passes == 3


def test_a_pass_reads_only_the_columns_the_schema_uses(folder: Path) -> None:
    schema = as_schema(folder / "german.schema.json").to_json()
    for column in schema["columns"]:
        if column["name"] in ("purpose", "credit_amount"):
            column.update(type="ignored")
            for key in ("categories", "min", "max"):
                column.pop(key, None)
    ignored = as_schema(schema)
    encoder = ChunkEncoder(ignored, schema_domain(ignored, 8, True))
    files = table_files(f"parquet:{folder / 'parts'}")
    counter = DuckDBCounter(files, encoder, None, 128 * 2**20, workers=1)
    part = parquet_parts(files)[0]
    chunks = list(part_chunks(part.path, part.groups, files.name, ignored))
    assert all(c.header == tuple(s.name for s in ignored.columns) for c in chunks)
    assert all((c.column("purpose") == "").all() for c in chunks)  # never decoded
    raw = read_table_file(folder / "german.csv", "csv:german")
    memory = MemoryCounter(raw, encoder)
    assert counter.scan() == memory.scan()
    cliques = [(0,), (1, 2), (3, 1, len(encoder.domain.sizes) - 1)]
    for a, b in zip(counter.counts(cliques), memory.counts(cliques), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(
    ("method", "overrides"), [("mst", {}), ("mst", {"label_edges": False}), ("aim", {})]
)
def test_first_cliques_are_what_a_new_trainer_asks_for_first(method: str, overrides: dict) -> None:
    backend = get_method(method)
    info = load_table("german-credit").info("")
    config = backend.config("small", overrides, info)
    plan = backend.plan(info, PrivacyTarget(2.0, 1e-6), config, [])
    trainer = backend.trainer(info, config, plan, torch.device("cpu"), 0, PrivateRandomness(1))
    first = backend.first_cliques(table_domain(info, config), config)  # type: ignore[attr-defined]
    assert first == trainer.upfront_cliques()  # type: ignore[attr-defined]
