"""`--method auto`: the recommended backend from public facts, through `train` as a user runs
it, and the advice `train` gives with a table method that is measurably behind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dpsynth.cli import app
from dpsynth.data.images import DataInfo
from dpsynth.data.sources import load_table
from dpsynth.ledger import Ledger
from dpsynth.methods.base import SMALL_EPSILON
from dpsynth.methods.recommend import (
    AIM_MAX_COLUMNS,
    AIM_MAX_ROW_CELLS,
    feature_columns,
    recommend_method,
)
from dpsynth.methods.registry import get_method, method_names

runner = CliRunner()


def _image(shape: tuple[int, int, int]) -> DataInfo:
    return DataInfo("x", "npz", 1000, shape, tuple("0123456789"), "", "x")


def _table(features: int, rows: int = 1000) -> DataInfo:
    columns = [{"name": f"c{i}", "type": "numeric", "min": 0, "max": 1} for i in range(features)]
    columns += [{"name": "skip", "type": "ignored"}]
    columns += [{"name": "t", "type": "categorical", "categories": ["a", "b"]}]
    schema = {"format": "dpsynth-schema-v1", "target": "t", "columns": columns}
    return DataInfo("csv:x", "csv", rows, (features,), ("a", "b"), "", "x", "table", schema)


def test_the_rule_follows_the_public_shape_and_epsilon() -> None:
    assert feature_columns(_table(7)) == 7  # the target and ignored columns are not features
    assert recommend_method(_table(AIM_MAX_COLUMNS), 1.0) == "aim"
    assert recommend_method(_table(AIM_MAX_COLUMNS), SMALL_EPSILON) == "aim"
    assert recommend_method(_table(AIM_MAX_COLUMNS), 10.0) == "mst"
    assert recommend_method(_table(AIM_MAX_COLUMNS + 1), 1.0) == "mst"
    # aim's rounds count every row: a long table goes to mst whatever its width
    assert recommend_method(_table(18, rows=100_000), 1.0) == "mst"
    assert recommend_method(_table(18, rows=AIM_MAX_ROW_CELLS // 18), 1.0) == "aim"
    assert recommend_method(_image((1, 28, 28)), 1.0) == "rdpgan"
    assert recommend_method(_image((1, 28, 28)), 10.0) == "rdpgan"
    assert recommend_method(_image((1, 8, 8)), 1.0) == "pge"
    assert recommend_method(_image((1, 8, 8)), 10.0) == "dpkernel"
    # every recommendation is a registered backend that takes that kind of data
    for info in (_table(3), _table(40), _image((1, 28, 28)), _image((1, 8, 8))):
        for epsilon in (1.0, 10.0):
            name = recommend_method(info, epsilon)
            assert name in method_names()
            assert info.modality in get_method(name).modalities


def _train(tmp_path: Path, *args: str) -> dict:
    result = runner.invoke(
        app,
        ["train", "--method", "auto", "--preset", "tiny", "--device", "cpu", "--json",
         "--ledger", str(tmp_path / "ledger.jsonl"), *args],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_auto_trains_the_recommended_image_backend(tmp_path: Path, one_torch_thread) -> None:
    summary = _train(tmp_path, "--data", "digits", "--epsilon", "10", "--out", str(tmp_path / "r"))
    assert summary["method"] == "dpkernel"
    config = json.loads((tmp_path / "r" / "config.json").read_text())
    assert config["method"] == "dpkernel"
    assert Ledger(tmp_path / "ledger.jsonl").spend(summary["ledger_seq"])["method"] == "dpkernel"


def test_auto_on_a_table_records_one_backend_for_the_release_and_the_run(
    tmp_path: Path, one_torch_thread
) -> None:
    """With a DP class-weights release before training, the release's ledger entry and the
    run name the same backend: the choice is made once, before anything is spent."""
    wanted = recommend_method(load_table("german-credit").info(), 2.0)
    summary = _train(
        tmp_path, "--data", "german-credit", "--epsilon", "2", "--out", str(tmp_path / "r"),
        "--class-weights-epsilon", "0.5",
    )  # fmt: skip
    assert summary["method"] == wanted == "aim"
    entries = [e for e in Ledger(tmp_path / "ledger.jsonl").entries() if "method" in e]
    assert {e["method"] for e in entries} == {"aim"}
    assert {e["command"] for e in entries} >= {"schema-release", "train"}


@pytest.mark.parametrize("method, advised", [("rdpgan", True), ("mst", False)])
def test_train_advises_against_a_table_method_that_is_far_behind(
    tmp_path: Path, method: str, advised: bool, one_torch_thread
) -> None:
    result = runner.invoke(
        app,
        ["train", "--method", method, "--data", "german-credit", "--epsilon", "2", "--preset",
         "tiny", "--out", str(tmp_path / "r"), "--ledger", str(tmp_path / "l.jsonl"), "--json",
         "--device", "cpu"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    warnings = json.loads(result.stdout).get("warnings", [])
    assert any("prefer --method mst or aim" in w for w in warnings) is advised
