"""Whole numbers stay numbers on the safe path: a count with a handful of values (delinquencies,
children) is drafted `integer`, and its DP release never writes '(other)' text into it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
from typer.testing import CliRunner

from dpsynth.cli import app

runner = CliRunner()


def test_a_count_with_rare_values_is_released_as_a_number(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    rows = 3000
    # 0 for most rows, 1-3 for some, 4-9 held by a few rows each: as a category list the rare
    # values would not clear the threshold and become '(other)'
    counts = rng.choice(
        10, rows, p=[0.7, 0.15, 0.07, 0.04, 0.015, 0.01, 0.007, 0.004, 0.002, 0.002]
    )
    frame = pd.DataFrame(
        {
            "delinquencies": counts,
            "income": rng.integers(20, 200, rows) * 1000,
            "default": np.where(counts + rng.normal(0, 1, rows) > 1.5, "yes", "no"),
        }
    )
    data = tmp_path / "loans.csv"
    frame.to_csv(data, index=False)
    drafted = runner.invoke(app, ["data", "schema", f"csv:{data}", "--target", "default"])
    assert drafted.exit_code == 0, drafted.output
    schema = json.loads(drafted.stdout[drafted.stdout.index("{") :])
    kinds = {c["name"]: c["type"] for c in schema["columns"]}
    assert kinds["delinquencies"] == "integer"
    (tmp_path / "schema.json").write_text(json.dumps(schema))
    ledger = ["--ledger", str(tmp_path / "ledger.jsonl"), "--device", "cpu"]
    trained = runner.invoke(
        app,
        ["train", "--method", "mst", "--data", f"csv:{data}", "--schema",
         str(tmp_path / "schema.json"), "--epsilon", "3", "--preset", "tiny",
         "--out", str(tmp_path / "run"), *ledger],
    )  # fmt: skip
    assert trained.exit_code == 0, trained.output
    out = tmp_path / "synth.csv"
    sampled = runner.invoke(
        app, ["sample", str(tmp_path / "run"), "--n", "2000", "--out", str(out), *ledger]
    )
    assert sampled.exit_code == 0, sampled.output
    synthetic = pd.read_csv(out, dtype=str, keep_default_na=False)
    written = synthetic["delinquencies"][synthetic["delinquencies"] != ""]
    assert written.str.fullmatch(r"\d+").all()  # numbers, never '(other)'
    assert (written.astype(int) == 0).mean() > 0.4  # the zero's mass is kept
