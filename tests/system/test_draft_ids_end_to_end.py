"""A table of subjects with several rows each, integer subject numbers: `data schema` types
them `id`, and the synthetic table `train` → `sample` writes carries none of the real ones."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
from typer.testing import CliRunner

from dpsynth.cli import app

runner = CliRunner()


def _visits(subjects: int = 150, seed: int = 11) -> pd.DataFrame:
    """Lab visits: each subject (an integer number) on 1–3 rows, an age, a test, a value."""
    rng = np.random.default_rng(seed)
    per_subject = rng.integers(1, 4, subjects)
    subject = np.repeat(rng.permutation(np.arange(1, subjects + 1)), per_subject)
    age = np.repeat(rng.integers(18, 90, subjects), per_subject)
    rows = len(subject)
    return pd.DataFrame(
        {
            "subject_id": subject,
            "age": age,
            "test": rng.choice(["hb", "crp", "alt"], rows),
            "value": np.round(rng.normal(10, 3, rows), 1),
            "abnormal": rng.choice(["no", "yes"], rows, p=[0.7, 0.3]),
        }
    )


def test_drafted_subject_numbers_never_reach_the_synthetic_table(tmp_path: Path) -> None:
    real = _visits()
    path = tmp_path / "visits.csv"
    real.to_csv(path, index=False)
    drafted = runner.invoke(app, ["data", "schema", f"csv:{path}", "--target", "abnormal"])
    assert drafted.exit_code == 0, drafted.output
    kinds = {c["name"]: c["type"] for c in json.loads(drafted.stdout)["columns"]}
    assert kinds["subject_id"] == "id" and kinds["age"] == "integer"
    assert "looks like a privacy unit" in " ".join(drafted.stderr.split())
    schema = tmp_path / "schema.json"
    schema.write_text(drafted.stdout)
    ledger = tmp_path / "ledger.jsonl"
    trained = runner.invoke(
        app,
        ["train", "--method", "mst", "--preset", "tiny", "--data", f"csv:{path}",
         "--schema", str(schema), "--epsilon", "10",
         "--out", str(tmp_path / "run"), "--ledger", str(ledger), "--device", "cpu", "--json"],
    )  # fmt: skip
    assert trained.exit_code == 0, trained.output
    out = tmp_path / "synth.csv"
    sampled = runner.invoke(
        app, ["sample", str(tmp_path / "run"), "--n", "500", "--out", str(out),
              "--ledger", str(ledger)],
    )  # fmt: skip
    assert sampled.exit_code == 0, sampled.output
    synthetic = pd.read_csv(out, dtype=str, keep_default_na=False)
    assert len(synthetic) == 500
    real_ids = set(real["subject_id"].astype(str))
    assert not set(synthetic["subject_id"]) & real_ids
    assert synthetic["subject_id"].str.startswith("syn-").all()
