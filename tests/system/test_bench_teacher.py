"""bench/teacher.py: scores a run's saved teacher and re-plans a variant under the run's ε."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest

from dpsynth.privacy.accounting.compose import compose_epsilon

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def teacher_bench():
    return importlib.import_module("bench.teacher")


def test_variants_override_only_their_keys(teacher_bench):
    base = {"batch": 256, "epochs": 15.0, "lr": 5e-3, "clip": 1.0, "augment": 0, "width": 16,
            "pretrain": 10000, "pretrain_epochs": 3}  # fmt: skip
    name, settings = teacher_bench.parse_variant("b512:batch=512,epochs=30,pretrain=0", base)
    assert name == "b512"
    assert settings == {**base, "batch": 512, "epochs": 30.0, "pretrain": 0}
    assert isinstance(settings["batch"], int) and isinstance(settings["epochs"], float)
    assert teacher_bench.parse_variant("run:", base) == ("run", base)
    with pytest.raises(SystemExit, match="unknown variant key"):
        teacher_bench.parse_variant("x:sigma=2", base)


def test_scores_the_saved_teacher_and_a_variant_within_the_runs_epsilon(teacher_bench, tmp_path):
    from dpsynth.training import train_run

    overrides = {"teacher_share": "0.5", "teacher_batch": "64", "teacher_epochs": "0.5",
                 "teacher_width": "4", "teacher_pretrain": "20"}  # fmt: skip
    train_run(
        method="rdpgan", data="digits", epsilon=4.0, preset="tiny", device="cpu", seed=1,
        overrides=overrides, out=tmp_path / "run", ledger_path=tmp_path / "a.jsonl",
    )  # fmt: skip
    out = tmp_path / "teacher.json"
    teacher_bench.main(
        [str(tmp_path / "run"), "--data", "digits", "--seeds", "1", "--json", str(out),
         "--variant", "longer:epochs=1,pretrain=0"]
    )  # fmt: skip
    report = json.loads(out.read_text())
    saved, longer = report["rows"]
    assert saved["variant"] == "saved" and 0.0 <= saved["accuracy"][0] <= 1.0
    assert longer["settings"]["epochs"] == 1.0 and longer["settings"]["pretrain"] == 0
    # The variant's teacher is re-planned so that the run's other events plus it stay under ε.
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    others = [e for e in config["privacy"]["events"] if e.get("mechanism") != "dp_classifier"]
    event = {"type": "poisson_gaussian", "noise_multiplier": longer["sigma"],
             "sampling_rate": 64 / 1437, "steps": longer["steps"]}  # fmt: skip
    assert longer["steps"] == round(1437 / 64)
    assert compose_epsilon([*others, event], config["privacy"]["delta"]).epsilon <= 4.0
    assert report["machine"]["date"] and report["target_epsilon"] == 4.0
