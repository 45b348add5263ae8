"""The shared training loop: plan before data, ledger lifecycle, resume, budget refusal."""

from __future__ import annotations

import json
import math

import pytest
import torch
from loop_backend import TemplateMethod
from safetensors.torch import load_file

from dpsynth.errors import BudgetExceededError, UsageError
from dpsynth.ledger import Ledger
from dpsynth.methods import registry
from dpsynth.privacy.accounting.compose import compose_epsilon
from dpsynth.sampling import sample_run
from dpsynth.training import train_run


@pytest.fixture(autouse=True)
def template_backend(monkeypatch):
    monkeypatch.setitem(registry._BACKENDS, "templates", "loop_backend:TemplateMethod")
    return TemplateMethod


def train(tmp_path, name="run", **kwargs):
    args = dict(
        method="templates", data="digits", epsilon=5.0, preset="tiny",
        out=tmp_path / name, ledger_path=tmp_path / "ledger.jsonl", device="cpu", seed=3,
    )  # fmt: skip
    args.update(kwargs)
    return train_run(**args)


def test_run_reserves_then_completes_and_writes_the_run_dir(tmp_path):
    result = train(tmp_path)
    run = tmp_path / "run"
    config = json.loads((run / "config.json").read_text())
    assert result["steps"] == result["total_steps"] == 12
    assert result["ledger_status"] == "completed"
    spends = [e for e in Ledger(tmp_path / "ledger.jsonl").entries() if e["kind"] == "spend"]
    assert len(spends) == 1 and spends[0]["run_id"] == config["run_id"]
    assert spends[0]["events"] == config["privacy"]["events"]
    assert float(result["epsilon"]) <= 5.0
    assert config["privacy"]["delta"] < 1 / 1437
    for name in ("checkpoint.safetensors", "state.json", "train-log.jsonl", "preview.png"):
        assert (run / name).is_file(), name
    log = [json.loads(line) for line in (run / "train-log.jsonl").read_text().splitlines()]
    assert log[-1]["step"] == 12 and log[-1]["epsilon"] <= 5.0 + 1e-9


def test_resume_after_interruption_equals_an_uninterrupted_run(tmp_path):
    # The same secret privacy seed (injectable in tests only) gives the same batches and noise.
    secret = 0x0123456789ABCDEF0123456789ABCDEF
    full = train(tmp_path, "full", ledger_path=tmp_path / "a.jsonl", privacy_seed=secret)
    part = train(
        tmp_path, "part", ledger_path=tmp_path / "b.jsonl", stop_after_steps=5, privacy_seed=secret
    )
    assert part["interrupted"] and part["steps"] == 5
    assert part["ledger_status"] == "reserved"  # an interrupted run stays counted in full
    resumed = train(tmp_path, "part", ledger_path=tmp_path / "b.jsonl", resume=True)
    assert resumed["steps"] == full["steps"] == 12
    a = load_file(tmp_path / "full" / "checkpoint.safetensors")
    b = load_file(tmp_path / "part" / "checkpoint.safetensors")
    assert torch.equal(a["trainer/weight"], b["trainer/weight"])
    book = Ledger(tmp_path / "b.jsonl")
    assert [e["kind"] for e in book.entries()] == ["spend", "status"]  # no double charge
    again = train(tmp_path, "part", ledger_path=tmp_path / "b.jsonl", resume=True)
    assert again["already_finished"]


def test_second_run_composes_with_the_first(tmp_path):
    first = train(tmp_path, "one", epsilon=3.0)
    second = train(tmp_path, "two", epsilon=6.0)
    assert second["noise_multiplier"] > 0
    book = Ledger(tmp_path / "ledger.jsonl")
    total = compose_epsilon(book.events_for("digits"), first["delta"]).epsilon
    assert total <= 6.0
    assert float(second["epsilon"]) < 6.0  # this run alone got what the first left
    with pytest.raises(BudgetExceededError):
        train(tmp_path, "three", epsilon=total * 0.9)


def test_budget_cap_refuses_before_any_data_is_read(tmp_path):
    book = Ledger(tmp_path / "ledger.jsonl")
    book.set_budget("digits", 1.0, 1e-5)
    with pytest.raises(BudgetExceededError):
        train(tmp_path, epsilon=2.0, delta=1e-5)
    assert not (tmp_path / "run").exists()
    assert [e["kind"] for e in book.entries()] == ["budget"]


def test_non_private_baseline_is_labelled(tmp_path):
    result = train(tmp_path, epsilon="inf")
    assert result["private"] is False and result["epsilon"] == "inf"
    spend = Ledger(tmp_path / "ledger.jsonl").entries()[0]
    assert spend["private"] is False and spend["epsilon"] == "inf"
    out = sample_run(tmp_path / "run", 20, tmp_path / "synth", device="cpu")
    assert "NOT PRIVATE" in out["privacy"]


def test_existing_run_dir_is_refused(tmp_path):
    train(tmp_path)
    with pytest.raises(UsageError):
        train(tmp_path)


def test_sample_writes_n_images_in_class_folders_and_a_release(tmp_path):
    train(tmp_path)
    out = sample_run(tmp_path / "run", 23, tmp_path / "synth", batch_size=7, device="cpu")
    files = sorted((tmp_path / "synth").glob("*/*.png"))
    assert len(files) == 23
    assert {f.parent.name for f in files} == {str(d) for d in range(10)}
    rows = (tmp_path / "synth" / "labels.csv").read_text().splitlines()
    assert rows[0] == "file,label,class" and len(rows) == 24
    manifest = json.loads((tmp_path / "synth" / "manifest.json").read_text())
    assert manifest["n"] == 23 and manifest["label_counts"] == [3, 3, 3, 2, 2, 2, 2, 2, 2, 2]
    release = Ledger(tmp_path / "ledger.jsonl").entries()[-1]
    assert release["kind"] == "release" and release["output_sha256"] == out["output_sha256"]
    assert release["events"] == []
    with pytest.raises(UsageError):
        sample_run(tmp_path / "run", 5, tmp_path / "synth", device="cpu")
    sample_run(tmp_path / "run", 5, tmp_path / "synth", device="cpu", force=True)
    assert len(list((tmp_path / "synth").glob("*/*.png"))) == 5


def test_sample_npz_and_counts(tmp_path):
    train(tmp_path)
    sample_run(
        tmp_path / "run", 6, tmp_path / "npz", fmt="npz", labels="1,0,0,0,0,0,0,0,0,5",
        device="cpu",
    )  # fmt: skip
    import numpy as np

    data = np.load(tmp_path / "npz" / "samples.npz")
    assert data["x"].shape == (6, 1, 8, 8) and data["x"].dtype == np.uint8
    assert data["y"].tolist() == [0, 9, 9, 9, 9, 9]
    with pytest.raises(UsageError):
        sample_run(tmp_path / "run", 6, tmp_path / "bad", labels="1,2", device="cpu")


def test_epsilon_shown_while_training_never_undercounts(tmp_path):
    train(tmp_path, log_private_loss=True)
    log = [json.loads(x) for x in (tmp_path / "run" / "train-log.jsonl").read_text().splitlines()]
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    plan = config["privacy"]
    for record in log:
        exact = compose_epsilon(
            [{**plan["events"][0], "steps": record["step"]}], plan["delta"]
        ).epsilon
        assert record["epsilon"] >= exact * (1 - 1e-9)
    # The loss of private batches lives in the private folder (asked for above).
    private_log = (tmp_path / "run" / "private" / "train-loss.jsonl").read_text().splitlines()
    last = json.loads(private_log[-1])
    assert last["loss"] is None or not math.isnan(last["loss"])
