"""`dpsynth ledger`, `train` and `sample` through the command line."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from dpsynth.cli import app
from dpsynth.ledger import Ledger
from dpsynth.methods import registry
from dpsynth.privacy.accounting.compose import poisson_gaussian_event

runner = CliRunner()


@pytest.fixture(autouse=True)
def template_backend(monkeypatch):
    monkeypatch.setitem(registry._BACKENDS, "templates", "loop_backend:TemplateMethod")


def invoke(*args: str):
    return runner.invoke(app, list(args))


def filled_ledger(path) -> Ledger:
    book = Ledger(path)
    event = poisson_gaussian_event(1.5, 0.05, 100)
    for run in ("a", "b"):
        seq = book.reserve(
            dataset_id="digits", fingerprint="f" * 64, command="train", method="pge",
            run_id=run, events=[event], delta=1e-5,
        )["seq"]  # fmt: skip
        book.complete(seq, [event], run_id=run, fingerprint="f" * 64)
    return book


def test_ledger_show_json_lists_datasets_and_entries(tmp_path):
    path = tmp_path / "l.jsonl"
    filled_ledger(path)
    result = invoke("ledger", "show", "--ledger", str(path), "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["datasets"]["digits"]["spends"] == 2
    assert len(out["entries"]) == 4
    text = invoke("ledger", "show", "--ledger", str(path))
    assert "digits" in text.stdout and text.exit_code == 0


def test_ledger_verify_ok_then_fails_on_an_edit(tmp_path):
    path = tmp_path / "l.jsonl"
    filled_ledger(path)
    ok = invoke("ledger", "verify", "--ledger", str(path))
    assert ok.exit_code == 0 and "ok" in ok.stdout
    lines = path.read_text().splitlines()
    lines[1] = lines[1].replace('"steps":100', '"steps":10')
    path.write_text("\n".join(lines) + "\n")
    bad = invoke("ledger", "verify", "--ledger", str(path))
    assert bad.exit_code == 1
    assert "Traceback" not in bad.output and len(bad.stderr.strip().splitlines()) == 1


def test_ledger_verify_fails_on_a_removed_line(tmp_path):
    path = tmp_path / "l.jsonl"
    filled_ledger(path)
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:1] + lines[2:]) + "\n")
    assert invoke("ledger", "verify", "--quick", "--ledger", str(path)).exit_code == 1


def test_budget_then_train_over_it_exits_3_and_writes_nothing(tmp_path):
    path = tmp_path / "l.jsonl"
    assert invoke(
        "ledger", "budget", "--dataset", "digits", "--epsilon", "1", "--delta", "1e-5",
        "--ledger", str(path),
    ).exit_code == 0  # fmt: skip
    result = invoke(
        "train", "--method", "templates", "--data", "digits", "--epsilon", "2",
        "--delta", "1e-5", "--preset", "tiny", "--out", str(tmp_path / "run"),
        "--ledger", str(path), "--device", "cpu",
    )  # fmt: skip
    assert result.exit_code == 3, result.output
    assert not (tmp_path / "run").exists()
    assert [e["kind"] for e in Ledger(path).entries()] == ["budget"]


def test_train_and_sample_json_output_is_one_document(tmp_path):
    path = tmp_path / "l.jsonl"
    train = invoke(
        "train", "--method", "templates", "--data", "digits", "--epsilon", "4",
        "--preset", "tiny", "--out", str(tmp_path / "run"), "--ledger", str(path),
        "--device", "cpu", "--json",
    )  # fmt: skip
    assert train.exit_code == 0, train.output
    out = json.loads(train.stdout)
    assert out["ledger_status"] == "completed" and out["private"] is True
    sample = invoke(
        "sample", str(tmp_path / "run"), "--n", "12", "--out", str(tmp_path / "s"),
        "--ledger", str(path), "--device", "cpu", "--json",
    )  # fmt: skip
    assert sample.exit_code == 0, sample.output
    assert json.loads(sample.stdout)["n"] == 12
    again = invoke("train", "--out", str(tmp_path / "run"), "--resume", "--ledger", str(path))
    assert again.exit_code == 0 and "already finished" in again.stdout


@pytest.mark.parametrize(
    "args",
    [
        ["train", "--method", "nope", "--data", "digits", "--epsilon", "1", "--out", "X"],
        ["train", "--method", "templates", "--data", "digits", "--epsilon", "-1", "--out", "X"],
        ["train", "--method", "templates", "--data", "digits", "--out", "X"],
        ["train", "--method", "templates", "--data", "digits", "--epsilon", "1", "--out", "X",
         "--preset", "huge"],
        ["train", "--method", "templates", "--data", "digits", "--epsilon", "1", "--out", "X",
         "--preset", "tiny", "--set", "nonsense=1"],
        ["train", "--method", "templates", "--data", "digits", "--epsilon", "1", "--out", "X",
         "--device", "cuda:7"],
    ],
)  # fmt: skip
def test_train_usage_errors_exit_2(tmp_path, args):
    args = [a.replace("X", str(tmp_path / "run")) for a in args]
    result = invoke(*args, "--ledger", str(tmp_path / "l.jsonl"))
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "l.jsonl").exists() or Ledger(tmp_path / "l.jsonl").entries() == []


@pytest.mark.parametrize(
    ("data", "epsilon", "expected"),
    [("digits", "10", "small-eps1"), ("mnist-5k", "1", "mnist-eps1"), ("mnist-5k", "10", "mnist")],
)
def test_train_without_preset_takes_the_methods_recommendation(tmp_path, data, epsilon, expected):
    """`--preset` defaults to `auto`: dpkernel resolves by the data's shape (and ε on 28×28),
    and the run's config records the preset it resolved to (its bandwidths, too)."""
    from dpsynth.methods.dpkernel.presets import PRESETS

    out = tmp_path / "run"
    result = invoke(
        "train", "--method", "dpkernel", "--data", data, "--epsilon", epsilon,
        "--out", str(out), "--ledger", str(tmp_path / "l.jsonl"), "--device", "cpu",
        "--set", "steps=2", "--set", "batch_size=16", "--set", "generated_points=8",
        "--set", "warm_start_steps=5", "--quiet", "--json",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    config = json.loads((out / "config.json").read_text())
    assert config["preset"] == expected
    assert config["config"]["bandwidths"] == list(PRESETS[expected]["bandwidths"])


def test_a_preset_that_needs_public_images_is_refused_without_them_before_any_spend(tmp_path):
    path = tmp_path / "l.jsonl"
    result = invoke(
        "train", "--method", "dpkernel", "--data", "digits", "--epsilon", "1",
        "--preset", "mnist-eps1-public", "--out", str(tmp_path / "run"),
        "--ledger", str(path), "--device", "cpu",
    )  # fmt: skip
    assert result.exit_code == 2, result.output
    assert "give --public SPEC" in result.stderr and "mnist-eps1-public" in result.stderr
    assert not (tmp_path / "run").exists()
    assert not path.exists() or not [e for e in Ledger(path).entries() if e["kind"] != "budget"]
