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
    AIM_TIME_BUDGET_S,
    feature_columns,
    recommend_method,
)
from dpsynth.methods.registry import get_method, method_names

runner = CliRunner()


def _image(shape: tuple[int, int, int]) -> DataInfo:
    return DataInfo("x", "npz", 1000, shape, tuple("0123456789"), "", "x")


def _table(features: int, rows: int = 1000, categories: int = 0) -> DataInfo:
    """A public table description: numeric features (12 bins each under the presets), or
    categorical ones of `categories` values each."""
    if categories:
        values = [f"v{k}" for k in range(categories)]
        columns = [
            {"name": f"c{i}", "type": "categorical", "categories": values} for i in range(features)
        ]
    else:
        columns = [
            {"name": f"c{i}", "type": "numeric", "min": 0, "max": 1} for i in range(features)
        ]
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
    # aim's time grows with the rows: a table too long for its budget goes to mst (a
    # 100,000 × 18 table took the aim before 2026-11-28 30 minutes; now about 2)
    assert recommend_method(_table(18, rows=100_000), 1.0) == "aim"
    assert recommend_method(_table(18, rows=10**7), 1.0) == "mst"
    assert recommend_method(_image((1, 28, 28)), 1.0) == "dpkernel"
    assert recommend_method(_image((1, 28, 28)), 10.0) == "dpkernel"
    assert recommend_method(_image((1, 8, 8)), 1.0) == "dpkernel"
    assert recommend_method(_image((1, 8, 8)), 10.0) == "dpkernel"
    # every recommendation is a registered backend that takes that kind of data
    for info in (_table(3), _table(40), _image((1, 28, 28)), _image((1, 8, 8))):
        for epsilon in (1.0, 10.0):
            name = recommend_method(info, epsilon)
            assert name in method_names()
            assert info.modality in get_method(name).modalities


def test_auto_falls_back_to_mst_where_aims_estimated_time_is_over_the_budget() -> None:
    """The time rule: aim's cost estimated from the public schema (domain sizes under the
    preset's bins, the columns), N and ε; above `AIM_TIME_BUDGET_S` auto picks mst, even for
    a table narrow enough and an ε small enough for aim."""
    aim = get_method("aim")
    small = _table(20)  # german-credit's shape: an upper bound of about 2 minutes
    assert aim.estimated_train_seconds(small, 1.0) < AIM_TIME_BUDGET_S / 2
    assert recommend_method(small, 1.0) == "aim"
    # The estimate grows with N and with the columns' domain sizes (more candidate pairs to
    # count and score), and the model's own cap bounds the rest.
    seconds = [aim.estimated_train_seconds(_table(20, n), 1.0) for n in (10**3, 10**5, 10**7)]
    assert seconds == sorted(seconds) and seconds[-1] > AIM_TIME_BUDGET_S
    larger = [aim.estimated_train_seconds(_table(24, 10**6, k), 1.0) for k in (5, 20, 60)]
    assert larger == sorted(larger) and larger[0] < larger[-1]
    # Narrow and at ε = 1, but large: 24 columns of 60 categories (300 candidate pairs of
    # up to 3,600 cells each) over 8 million rows; or 20 numeric columns over 10 million.
    large_domain = _table(AIM_MAX_COLUMNS, 8_000_000, 60)
    assert aim.estimated_train_seconds(large_domain, 1.0) > AIM_TIME_BUDGET_S
    assert recommend_method(large_domain, 1.0) == "mst"
    assert recommend_method(_table(20, 10**7), 1.0) == "mst"
    # census (41 attributes, 199,523 rows): about 2 minutes, trained in 92–109 s (2026-11-28)
    census_like = _table(40, 199_523, 12)
    assert 60 < aim.estimated_train_seconds(census_like, 10.0) < AIM_TIME_BUDGET_S
    # No estimate for images: the rule is for tables only.
    assert aim.estimated_train_seconds(_image((1, 8, 8)), 1.0) is None


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


_DPAF_SHRINK = ["c_steps=2", "windows=2", "frequency_fit_steps=2", "width=4", "fc_hidden=8"]
_PGE_SHRINK = ["steps=2", "warm_start_steps=2", "sampler_rounds=1", "sampler_steps=1", "nf=4"]


@pytest.mark.parametrize(
    "method, preset, advised, shrink",
    [
        ("dpaf", "mnist-freq-eps1", True, _DPAF_SHRINK),
        ("dpaf", "small", False, _DPAF_SHRINK),
        ("pge", "mnist-eps1", True, _PGE_SHRINK),
    ],
)
def test_train_advises_against_an_image_preset_that_fails_the_baseline(
    tmp_path: Path, method: str, preset: str, advised: bool, shrink: list[str], one_torch_thread
) -> None:
    """dpaf's and pge's ε ≤ 3 28×28 presets measured worse than the frequency model alone:
    `train` says so in its warnings (shrunk here to seconds; the advice is by preset name)."""
    result = runner.invoke(
        app,
        ["train", "--method", method, "--data", "digits", "--epsilon", "1", "--preset", preset,
         "--out", str(tmp_path / "r"), "--ledger", str(tmp_path / "l.jsonl"), "--json",
         "--device", "cpu", *[a for item in shrink for a in ("--set", item)]],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    warnings = json.loads(result.stdout).get("warnings", [])
    assert any("prefer --method freq or dpkernel" in w for w in warnings) is advised
