"""What fails after the ledger reservation (issue 30): the spend is closed `aborted`, with the
ε counted honestly (nothing when no record was read, the reserved events in full when the
data was read), and a run directory that holds nothing is removed.

The failures are made real: the mechanism's Cholesky factorisation is told to fail (as a
covariance that no jitter makes positive definite would), and writing the run's secret fails
(as a full disk would).
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from dpsynth.cli import app
from dpsynth.ledger import Ledger
from dpsynth.methods.dpkernel.trainer import DPKernelTrainer
from dpsynth.privacy.mechanisms import functional
from dpsynth.rundir import RunDir
from dpsynth.training import train_run

runner = CliRunner()
TRAIN = (
    "train --method dpkernel --data digits --epsilon 5 --preset tiny --out run --device cpu "
    "--ledger ledger.jsonl"
)


def _lines(ledger: Path) -> list[dict]:
    return [json.loads(line) for line in ledger.read_text().splitlines()]


def _never_positive_definite(monkeypatch: pytest.MonkeyPatch) -> None:
    real = torch.linalg.cholesky_ex

    def failed(matrix, *args, **kwargs):
        factor, _ = real(matrix, *args, **kwargs)
        return factor, torch.tensor(1)  # as LAPACK reports a failed factorisation

    monkeypatch.setattr(functional.torch.linalg, "cholesky_ex", failed)


def test_a_covariance_that_fails_on_public_facts_fails_before_the_reservation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, one_torch_thread
) -> None:
    monkeypatch.chdir(tmp_path)
    _never_positive_definite(monkeypatch)
    result = runner.invoke(app, shlex.split(TRAIN))
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2, result.output
    assert len(lines) == 1 and lines[0].startswith("error:"), result.stderr
    assert "cannot start with these settings" in lines[0] and "not positive definite" in lines[0]
    assert not (tmp_path / "ledger.jsonl").exists() or not _lines(tmp_path / "ledger.jsonl")
    assert not (tmp_path / "run").exists()


def test_a_mechanism_that_cannot_go_on_aborts_the_spend_counting_it_in_full(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, one_torch_thread
) -> None:
    # A failure the public preflight did not foresee (its points are the initial weights'):
    # the preflight is skipped so that the factorisation fails at the first step.
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(DPKernelTrainer, "preflight", lambda self: None)
    _never_positive_definite(monkeypatch)
    result = runner.invoke(app, shlex.split(TRAIN))
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 1, result.output
    assert len(lines) == 1 and lines[0].startswith("error:"), result.stderr
    assert "not positive definite" in lines[0]
    assert "closed as aborted and counts its planned ε in full" in lines[0]
    spend, status = _lines(tmp_path / "ledger.jsonl")
    assert (spend["kind"], status["kind"], status["status"]) == ("spend", "status", "aborted")
    assert status["ref"] == spend["seq"]
    assert status["events"] == spend["events"]  # counted in full: the data was read
    assert status["total_epsilon"] == pytest.approx(spend["epsilon"])
    assert Ledger(tmp_path / "ledger.jsonl").verify()["open_spends"] == []
    resumed = runner.invoke(app, shlex.split(TRAIN + " --resume"))
    assert resumed.exit_code == 2 and "was aborted" in resumed.stderr


@pytest.mark.parametrize("made_by_user", [False, True])
def test_a_start_that_fails_before_any_read_aborts_at_zero_and_leaves_no_run_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, made_by_user: bool
) -> None:
    out = tmp_path / "run"
    if made_by_user:
        out.mkdir()

    def disk_full(self, secret) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(RunDir, "write_secret", disk_full)
    with pytest.raises(OSError, match="No space left"):
        train_run(
            method="dpkernel", data="digits", epsilon=5.0, preset="tiny", out=out,
            ledger_path=tmp_path / "ledger.jsonl", device="cpu",
        )  # fmt: skip
    spend, status = _lines(tmp_path / "ledger.jsonl")
    assert status["status"] == "aborted" and status["ref"] == spend["seq"]
    assert status["events"] == [] and status["total_epsilon"] == 0
    if made_by_user:
        assert out.is_dir() and list(out.iterdir()) == []
    else:
        assert not out.exists()


# ----------------------------------------------------------------- too little headroom


def _spend_up_to(ledger_path: Path, spent: float) -> float:
    """A completed spend on `digits` whose ε at the default δ is just under `spent`; its δ."""
    from dpsynth.data.sources import load_data
    from dpsynth.privacy.accounting.calibration import default_delta
    from dpsynth.privacy.accounting.compose import compose_epsilon, poisson_gaussian_event
    from dpsynth.training.data import keyed_fingerprint

    records = load_data("digits")
    delta = default_delta(records.n)
    ledger = Ledger(ledger_path)
    fingerprint = keyed_fingerprint(ledger, records.content_digest)
    low, high = 0.5, 5.0  # σ of 1000 steps at q = 0.01: ε falls as σ grows
    for _ in range(40):
        middle = (low + high) / 2
        event = poisson_gaussian_event(middle, 0.01, 1000)
        if compose_epsilon([event], delta).epsilon > spent:
            low = middle
        else:
            high = middle
    events = [poisson_gaussian_event(high, 0.01, 1000)]
    entry = ledger.reserve(
        dataset_id="digits", fingerprint=fingerprint, command="train", method="dpkernel",
        run_id="earlier", events=events, delta=delta,
    )  # fmt: skip
    ledger.complete(entry["seq"], events, run_id="earlier", fingerprint=fingerprint)
    return delta


@pytest.mark.parametrize("method", ["dpaf", "dpkernel"])
def test_too_little_headroom_is_exit_3_naming_the_spent_epsilon_and_the_headroom(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, method: str, one_torch_thread
) -> None:
    monkeypatch.chdir(tmp_path)
    _spend_up_to(tmp_path / "ledger.jsonl", 4.99)  # 0.2% of ε left
    before = (tmp_path / "ledger.jsonl").read_bytes()
    result = runner.invoke(app, shlex.split(TRAIN.replace("dpkernel", method)))
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 3, result.output
    assert len(lines) == 1 and lines[0].startswith("error:"), result.stderr
    assert "already spent ε ≤ 4.99" in lines[0] and "leaving a headroom of 0.01" in lines[0]
    assert "under the target ε=5; a run needs at least 0.5% of ε" in lines[0]
    assert (tmp_path / "ledger.jsonl").read_bytes() == before
    assert not (tmp_path / "run").exists()
