"""`dpsynth sample --truncation`: the latent scale of the released generator (post-processing)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from dpsynth.cli import app

runner = CliRunner()


def _train(tmp_path, method: str, *extra: str):
    ledger = tmp_path / f"{method}.jsonl"
    out = tmp_path / f"run-{method}"
    result = runner.invoke(
        app,
        [
            "train", "--method", method, "--data", "digits", "--epsilon", "4", "--preset",
            "tiny", "--out", str(out), "--ledger", str(ledger), "--device", "cpu", "-q",
            *extra,
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    return out, ledger


def _sample(run, ledger, out, *extra: str):
    return runner.invoke(
        app,
        [
            "sample", str(run), "--n", "200", "--out", str(out), "--format", "npz",
            "--ledger", str(ledger), "--device", "cpu", "--json", *extra,
        ],
    )  # fmt: skip


@pytest.mark.parametrize("method", ["dpkernel", "dpaf", "rdpgan"])
def test_truncation_narrows_the_samples_and_is_in_the_manifest(tmp_path, method):
    """The same seed at a smaller latent scale gives other, less spread images; the manifest
    states the scale used (the run's `sample_truncation` when not overridden)."""
    run, ledger = _train(tmp_path, method)
    plain = _sample(run, ledger, tmp_path / "plain")
    narrow = _sample(run, ledger, tmp_path / "narrow", "--truncation", "0.25")
    assert plain.exit_code == 0 and narrow.exit_code == 0, plain.output + narrow.output
    assert json.loads(plain.stdout)["truncation"] == 1.0
    assert json.loads(narrow.stdout)["truncation"] == 0.25
    manifest = json.loads((tmp_path / "narrow" / "manifest.json").read_text())
    assert manifest["truncation"] == 0.25
    x_plain = np.load(tmp_path / "plain" / "samples.npz")["x"].astype(np.float64)
    x_narrow = np.load(tmp_path / "narrow" / "samples.npz")["x"].astype(np.float64)
    assert not np.array_equal(x_plain, x_narrow)
    # per class, the pixels' spread over samples shrinks with the latent's
    labels = np.load(tmp_path / "plain" / "samples.npz")["y"]
    spread = [[x[labels == c].std(axis=0).mean() for c in range(10)] for x in (x_plain, x_narrow)]
    assert np.mean(spread[1]) < np.mean(spread[0])


def test_truncation_from_the_run_config_and_refusals(tmp_path):
    """`--set sample_truncation` at train time is the default at sample time; a sampler with
    no latent (psg's set) and an out-of-range value exit 2 before anything is written."""
    run, ledger = _train(tmp_path, "dpkernel", "--set", "sample_truncation=0.5")
    default = _sample(run, ledger, tmp_path / "default")
    assert default.exit_code == 0 and json.loads(default.stdout)["truncation"] == 0.5
    bad = _sample(run, ledger, tmp_path / "bad", "--truncation", "0")
    assert bad.exit_code == 2 and "--truncation" in bad.output
    psg_run, psg_ledger = _train(tmp_path, "psg")
    refused = _sample(psg_run, psg_ledger, tmp_path / "psg", "--truncation", "0.5")
    assert refused.exit_code == 2 and "no latent" in refused.output
    assert not (tmp_path / "psg").exists()
