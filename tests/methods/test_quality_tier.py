"""`--preset quality`: the slow tier, resolved per backend from public facts like `auto`, refused
before any spend where the backend has none."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dpsynth.cli import app
from dpsynth.data.images import DataInfo
from dpsynth.errors import UsageError
from dpsynth.ledger import Ledger
from dpsynth.methods.recommend import QUALITY, quality_methods, resolve_preset
from dpsynth.methods.registry import get_method, method_names

runner = CliRunner()
MNIST = DataInfo("mnist-5k", "npz", 4000, (1, 28, 28), tuple("0123456789"), "", "mnist-5k")
DIGITS = DataInfo("digits", "npz", 1437, (1, 8, 8), tuple("0123456789"), "", "digits")


def test_dpkernel_has_a_quality_tier_for_28x28_images_above_epsilon_3_only() -> None:
    dpkernel = get_method("dpkernel")
    assert resolve_preset(dpkernel, QUALITY, MNIST, 10.0) == "mnist-quality"
    assert resolve_preset(dpkernel, QUALITY, MNIST, float("inf")) == "mnist-quality"
    assert "mnist-quality" in dpkernel.presets
    for info, epsilon in ((MNIST, 1.0), (DIGITS, 10.0)):
        with pytest.raises(UsageError, match="no method has one"):
            resolve_preset(dpkernel, QUALITY, info, epsilon)
    assert quality_methods(MNIST, 10.0) == ["dpkernel"]


def test_the_quality_tier_is_never_the_fast_tier() -> None:
    """`auto` never resolves to a backend's quality preset: the fast tier stays fast."""
    for name in method_names():
        method = get_method(name)
        for info in (MNIST, DIGITS):
            for epsilon in (1.0, 10.0):
                quality = method.quality_preset(info, epsilon)
                if quality is not None and info.modality in method.modalities:
                    assert quality != method.recommended_preset(info, epsilon)


def test_a_backend_without_one_names_those_with_one() -> None:
    with pytest.raises(UsageError, match=r"pge has no quality tier.*--method dpkernel has one"):
        resolve_preset(get_method("pge"), QUALITY, MNIST, 10.0)
    assert resolve_preset(get_method("pge"), "mnist", MNIST, 10.0) == "mnist"


def test_train_refuses_a_missing_tier_before_any_spend(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.jsonl"
    result = runner.invoke(
        app,
        ["train", "--method", "auto", "--preset", "quality", "--data", "digits",
         "--epsilon", "10", "--out", str(tmp_path / "r"), "--device", "cpu",
         "--ledger", str(ledger)],
    )  # fmt: skip
    assert result.exit_code == 2, result.output
    assert "quality" in result.output and "auto" in result.output
    assert not ledger.exists() or not [e for e in Ledger(ledger).entries() if "method" in e]
    assert not (tmp_path / "r" / "config.json").exists()


def test_train_records_the_quality_preset_it_resolved(tmp_path: Path, one_torch_thread) -> None:
    """`--preset quality` on 28×28 images trains dpkernel's quality preset (one step here) and
    config.json names it, as `auto` records what it resolved to."""
    result = runner.invoke(
        app,
        ["train", "--method", "dpkernel", "--preset", "quality", "--data", "digits",
         "--image-size", "28", "--epsilon", "10", "--out", str(tmp_path / "r"),
         "--device", "cpu", "--json", "--ledger", str(tmp_path / "ledger.jsonl"),
         "--set", "steps=1", "--set", "warm_start_steps=1", "--set", "teacher_epochs=0.1",
         "--set", "teacher_pretrain=20", "--set", "teacher_pretrain_epochs=1"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    config = json.loads((tmp_path / "r" / "config.json").read_text())
    assert config["preset"] == "mnist-quality"
    assert config["config"]["teacher_augment"] > 0


def test_audit_resolves_the_tier_as_train_does() -> None:
    from dpsynth.auditing.planned_audit import resolve_auto

    assert resolve_auto("dpkernel", "mnist", 10.0, "digits") == ("dpkernel", "mnist")
    with pytest.raises(UsageError, match="quality"):
        resolve_auto("dpkernel", QUALITY, 10.0, "digits")
