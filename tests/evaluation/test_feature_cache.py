"""The real-set feature cache is opt-in: by default `evaluate` keeps no per-record features of
the real data on disk; `--cache-real-features` keeps them (0600 in a 0700 folder) and a second
evaluation reads them; `dpsynth cache show|clear` lists and removes them.

FID runs on a tiny TorchScript stand-in for Inception and a few dozen digits, so each
evaluation takes a second or two on a CPU."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from typer.testing import CliRunner

from dpsynth.cli import app
from dpsynth.data.sources import load_data
from dpsynth.evaluation import feature_cache, fid

runner = CliRunner()
CLASSES = ("0", "1")


class _TinyFeatures(torch.nn.Module):
    """A stand-in TorchScript feature network with Inception's interface: [N,3,299,299] ->
    [N, 2048]."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 5, stride=4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pooled = torch.nn.functional.adaptive_avg_pool2d(self.conv(x), (16, 16))
        return pooled.flatten(1)


@pytest.fixture
def setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, one_torch_thread) -> dict:
    """The cache pointed at tmp_path, tiny weights, 24 real digits (npz) and 20 synthetic ones
    (a sample folder): what an FID evaluation needs."""
    monkeypatch.setenv("DPSYNTH_CACHE_DIR", str(tmp_path / "cache"))
    torch.manual_seed(0)
    weights = tmp_path / "tiny.pt"
    torch.jit.save(torch.jit.script(_TinyFeatures()), str(weights))
    test, train = load_data("digits:test"), load_data("digits")
    keep = (test.y <= 1).nonzero().flatten()[:24]
    real = tmp_path / "real.npz"
    np.savez(real, x=test.x[keep, 0].numpy(), y=test.y[keep].numpy(), classes=np.array(CLASSES))
    synth = tmp_path / "synth"
    for label, name in enumerate(CLASSES):
        (synth / name).mkdir(parents=True)
        for i, image in enumerate(train.x[train.y == label][:10]):
            Image.fromarray(image[0].numpy()).save(synth / name / f"{i}.png")
    return {
        "cache": tmp_path / "cache" / "fid",
        "weights": weights,
        "synthetic": synth,
        "real": f"npz:{real}",
        "ledger": tmp_path / "ledger.jsonl",
    }


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file()) if folder.exists() else []


def _cli_evaluate(setup: dict, *extra: str) -> dict:
    args = [
        "evaluate",
        "--synthetic", str(setup["synthetic"]),
        "--real", setup["real"],
        "--metrics", "fid",
        "--inception-weights", str(setup["weights"]),
        "--ledger", str(setup["ledger"]),
        "--device", "cpu",
        "--json",
        *extra,
    ]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["metrics"]["fid"]


def _cli_json(*args: str) -> dict:
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_by_default_evaluate_keeps_no_features_on_disk(setup: dict) -> None:
    import dpsynth

    first = _cli_evaluate(setup)
    assert first["real_features_cached"] is False and first["n_real"] == 24
    assert _files(setup["cache"].parent) == []
    # The Python API likewise, and a second evaluation still computes them afresh.
    report = dpsynth.evaluate(
        setup["synthetic"], setup["real"], metrics="fid", inception_weights=setup["weights"],
        ledger=setup["ledger"], device="cpu",
    )  # fmt: skip
    assert report.metrics["fid"]["real_features_cached"] is False
    assert report.metrics["fid"]["value"] == pytest.approx(first["value"], rel=1e-6)
    assert _files(setup["cache"].parent) == []
    assert _cli_json("cache", "show")["count"] == 0


def test_the_flag_caches_privately_and_cache_clear_removes_it(setup: dict) -> None:
    first = _cli_evaluate(setup, "--cache-real-features")
    assert first["real_features_cached"] is False
    [cached] = _files(setup["cache"])
    assert stat.S_IMODE(cached.stat().st_mode) == 0o600
    assert stat.S_IMODE(setup["cache"].stat().st_mode) == 0o700
    second = _cli_evaluate(setup, "--cache-real-features")
    assert second["real_features_cached"] is True
    assert second["value"] == pytest.approx(first["value"], rel=1e-6)
    # Without the flag the cache is not read either.
    assert _cli_evaluate(setup)["real_features_cached"] is False

    shown = _cli_json("cache", "show")
    assert shown["folder"] == str(setup["cache"]) and shown["set_by"] == "DPSYNTH_CACHE_DIR"
    assert shown["count"] == 1 and shown["bytes"] == cached.stat().st_size > 0
    assert "files" not in shown  # the names are hashes of the data's digest

    cleared = runner.invoke(app, ["cache", "clear"])
    assert cleared.exit_code == 0, cleared.output
    assert "removed: 1 (" in cleared.stdout and cached.name not in cleared.stdout
    assert _files(setup["cache"].parent) == [] and not setup["cache"].exists()
    after = _cli_json("cache", "show")
    assert after["count"] == 0 and after["bytes"] == 0 and after["exists"] is False
    assert "files: 0 (0 bytes)" in runner.invoke(app, ["cache", "show"]).stdout


def test_the_api_keyword_caches_and_the_second_evaluation_reads_it(setup: dict) -> None:
    import dpsynth

    kwargs = dict(
        metrics="fid", inception_weights=setup["weights"], ledger=setup["ledger"], device="cpu"
    )
    first = dpsynth.evaluate(setup["synthetic"], setup["real"], cache_real_features=True, **kwargs)
    second = dpsynth.evaluate(setup["synthetic"], setup["real"], cache_real_features=True, **kwargs)
    assert first.metrics["fid"]["real_features_cached"] is False
    assert second.metrics["fid"]["real_features_cached"] is True
    assert len(_files(setup["cache"])) == 1
    assert not feature_cache.caching_enabled()  # the setting ends with the call


def test_compute_fid_caches_only_when_asked(setup: dict) -> None:
    images = load_data("digits:test").x[:12]
    run = dict(real_digest="d12", weights=setup["weights"], batch_size=12)
    assert not fid.compute_fid(images, images, **run)["real_features_cached"]
    with feature_cache.caching(True):  # an explicit False wins over the enclosing block
        assert not fid.compute_fid(images, images, cache_real_features=False, **run)[
            "real_features_cached"
        ]
    assert _files(setup["cache"].parent) == []
    with feature_cache.caching(True):
        assert not fid.compute_fid(images, images, **run)["real_features_cached"]
        assert fid.compute_fid(images, images, **run)["real_features_cached"]
    assert fid.compute_fid(images, images, cache_real_features=True, **run)["real_features_cached"]


def test_clear_removes_only_the_cache_files(setup: dict) -> None:
    folder = setup["cache"]
    feature_cache.store_features("a" * 32, np.zeros((2, 3), dtype=np.float32))
    staging = folder / f".{'b' * 32}.x1y2z3.npz"  # a write a killed process left behind
    staging.write_bytes(b"partial")
    foreign = folder / "notes.txt"
    foreign.write_text("not the cache's")
    assert {f.path.name for f in feature_cache.show_cache().files} == {
        f"{'a' * 32}.npz",
        staging.name,
    }
    removed = feature_cache.clear_cache()
    assert removed.count == 2 and removed.removed
    assert _files(folder) == [foreign]  # the folder stays, with the file that is not ours
    assert feature_cache.clear_cache().count == 0
