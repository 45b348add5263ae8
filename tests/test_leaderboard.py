"""bench/leaderboard.py plumbing: method discovery, presets, and the table/JSON writer."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from pathlib import Path

import pytest

from dpsynth.data.images import DataInfo
from dpsynth.methods import registry

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "leaderboard.py"


@pytest.fixture(scope="module")
def leaderboard():
    spec = importlib.util.spec_from_file_location("leaderboard", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _row(method: str, epsilon, cnn: float, fid=None) -> dict:
    return {
        "method": method,
        "preset": "small",
        "epsilon": epsilon,
        "steps": 1200,
        "train_seconds": 42.4,
        "cnn_mean": cnn,
        "cnn_std": 0.01,
        "fid": fid,
        "sample_images_per_s": 512.3,
    }


def _report(rows: list[dict]) -> dict:
    return {
        "data": "digits",
        "date": "2026-01-01T00:00:00+00:00",
        "machine": {"cpu": "Test CPU", "cpu_cores": 2, "torch": "2.x", "gpu": None},
        "command": "python bench/leaderboard.py --data digits",
        "synthetic_n": 2000,
        "seeds": 3,
        "fid": False,
        "real": {"method": "real train data", "preset": None, "epsilon": None} | {
            "cnn_mean": 0.95, "cnn_std": 0.004, "fid": None
        },
        "rows": rows,
    }  # fmt: skip


def test_every_registered_method_is_on_the_board(leaderboard, monkeypatch):
    monkeypatch.setitem(registry._BACKENDS, "newmethod", "dpsynth.methods.pge:PGEMethod")
    assert leaderboard.registered_methods() == registry.method_names()
    assert "newmethod" in leaderboard.registered_methods()
    assert leaderboard.parse_args(["--quick"]).methods is None  # None means: the registry's


def test_default_presets_and_sizes(leaderboard):
    digits = DataInfo("digits", "builtin", 1437, (1, 8, 8), tuple("0123456789"), "f", "digits")
    mnist = dataclasses.replace(digits, spec="mnist-5k", n=4000, shape=(1, 28, 28))
    # --preset for every method; a method without it falls back to small.
    assert leaderboard.preset_for("dpkernel", mnist, "10", "paper-200k") == "paper-200k"
    assert leaderboard.preset_for("dpkernel", mnist, "10", "no-such-preset") == "small"
    # Without --preset each method recommends one from public facts (no 200k-step default).
    assert leaderboard.preset_for("dpkernel", digits, "10", None) == "small"
    assert leaderboard.preset_for("dpkernel", mnist, "10", None) == "mnist"
    assert leaderboard.preset_for("dpkernel", mnist, "1", None) == "mnist-eps1"
    assert leaderboard.preset_for("dpkernel", mnist, "inf", None) == "mnist"
    for method in registry.method_names():
        for data in (digits, mnist):
            for epsilon in ("1", "10", "inf"):
                chosen = leaderboard.preset_for(method, data, epsilon, None)
                assert chosen in registry.get_method(method).presets, (method, chosen)
                assert not chosen.startswith("paper"), (method, chosen)
    assert leaderboard.default_synthetic_n("digits") == 2000
    assert leaderboard.default_synthetic_n("mnist-5k") == 10_000
    quick = leaderboard.parse_args(["--quick"])
    assert quick.no_fid and quick.seeds == 1


def test_table_has_the_real_row_first_and_percent_of_real(leaderboard):
    report = _report([_row("dpkernel", 9.9922, 0.855, fid=31.25), _row("pge", "inf", 0.475)])
    report["rows"][0]["epsilon_target"] = "10"  # the target names the row, not the bound
    table = leaderboard.markdown_table(report).splitlines()
    assert table[0].startswith("| method | preset | ε | steps | train time")
    assert table[2].startswith("| real train data |")
    assert "| dpkernel | small | 10 | 1,200 | 42 | 0.855 ± 0.010 | 90% | 31.2 | 512 |" in table
    assert "| pge | small | ∞ (not private) |" in table[4] and "| 50% | – |" in table[4]


def test_failed_runs_keep_their_row(leaderboard):
    report = _report([{"method": "pge", "epsilon": "1", "error": "dpsynth train failed"}])
    table = leaderboard.markdown_table(report)
    assert "| pge | – | 1 | failed: dpsynth train failed |" in table


def test_write_results_json_and_markdown(leaderboard, tmp_path):
    report = _report([_row("dpkernel", 1.0, 0.5)])
    leaderboard.write_results(report, tmp_path / "lb.json", tmp_path / "lb.md")
    assert json.loads((tmp_path / "lb.json").read_text()) == report
    page = (tmp_path / "lb.md").read_text()
    assert "Test CPU, 2 cores" in page and "not measured (--no-fid)" in page
    assert "`python bench/leaderboard.py --data digits`" in page
    assert "| dpkernel | small | 1 |" in page
