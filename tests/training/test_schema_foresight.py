"""`dpsynth data schema --epsilon E` says before any spend which columns the default DP schema
release would lose, on the terminal only."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from typer.testing import CliRunner

from dpsynth.cli import app

runner = CliRunner()


def _table(path: Path, rows: int = 2000) -> None:
    rng = np.random.default_rng(0)
    pd.DataFrame(
        {
            # 200 codes of about 10 rows each: no value clears the threshold at small ε
            "ward": rng.choice([f"W{i:03d}" for i in range(200)], rows),
            "sex": rng.choice(["F", "M"], rows),
            "age": rng.integers(18, 90, rows),
            "label": rng.choice(["a", "b"], rows),
        }
    ).to_csv(path, index=False)


def test_the_columns_a_small_epsilon_would_lose_are_named_on_stderr_only(tmp_path: Path) -> None:
    data = tmp_path / "t.csv"
    _table(data)
    low = runner.invoke(
        app, ["data", "schema", f"csv:{data}", "--target", "label", "--epsilon", "1"]
    )
    assert low.exit_code == 0, low.output
    lost = [
        line
        for line in low.stderr.splitlines()
        if "would lose" in line or "--schema-epsilon" in line
    ]
    assert any("would lose" in line for line in lost)
    assert any(line.startswith("note: ward: none of its 200 values") for line in lost)
    assert not any(line.startswith("note: sex:") for line in lost)  # its values clear
    assert "would lose" not in low.stdout  # the schema JSON holds no count
    high = runner.invoke(
        app, ["data", "schema", f"csv:{data}", "--target", "label", "--epsilon", "400"]
    )
    assert high.exit_code == 0 and "would lose" not in high.stderr
    bad = runner.invoke(app, ["data", "schema", f"csv:{data}", "--epsilon", "0"])
    assert bad.exit_code == 2


def test_the_notes_name_the_default_share_train_spends(tmp_path: Path) -> None:
    """On a small table the draft says which --schema-epsilon its release needs, beside the
    share of --epsilon that `train` spends by default with mst and aim (it said half, and a
    quarter in its code's comment, after the default had changed)."""
    from dpsynth.training.table_schema import REUSED_SCHEMA_SHARE

    data = tmp_path / "t.csv"
    _table(data, rows=300)
    result = runner.invoke(
        app, ["data", "schema", f"csv:{data}", "--target", "label", "--epsilon", "1"]
    )
    assert result.exit_code == 0, result.output
    remark = next(line for line in result.stderr.splitlines() if "a tenth of the rows" in line)
    assert f"train spends {REUSED_SCHEMA_SHARE:.0%} of --epsilon" in remark
    _table(data)
    result = runner.invoke(
        app, ["data", "schema", f"csv:{data}", "--target", "label", "--epsilon", "1"]
    )
    losses = next(line for line in result.stderr.splitlines() if "would lose" in line)
    assert f"mst and aim ({REUSED_SCHEMA_SHARE:g})" in losses


def test_a_sparse_number_is_said_to_be_drawn_over_a_guess_or_written_empty(
    tmp_path: Path,
) -> None:
    """60 numbers on 1,300 rows at ε = 1: a year of death held by 18% of the rows (83–92, two
    bins of the range grid) clears no cut, but its present count clears the last resort's (a
    crude range); a tip held by 10 rows is written empty."""
    rows = 1300
    rng = np.random.default_rng(0)
    columns = {f"x{i}": np.round(rng.normal(50, 10, rows), 1) for i in range(60)}
    year = np.full(rows, np.nan)
    year[:234] = rng.integers(83, 93, 234)
    tip = np.full(rows, np.nan)
    tip[:10] = rng.uniform(1, 20, 10).round(2)
    frame = pd.DataFrame(
        {**columns, "year": year, "tip": tip, "label": rng.choice(["a", "b"], rows)}
    )
    frame["year"] = frame["year"].astype("Int64")
    data = tmp_path / "t.csv"
    frame.to_csv(data, index=False)
    result = runner.invoke(
        app, ["data", "schema", f"csv:{data}", "--target", "label", "--epsilon", "1"]
    )
    assert result.exit_code == 0, result.output
    notes = {
        line.split(":")[1].strip(): line
        for line in result.stderr.splitlines()
        if line.startswith("note: ")
    }
    assert "crude range guessed from the noise" in notes["year"], notes.get("year")
    assert "written empty" in notes["tip"], notes.get("tip")
