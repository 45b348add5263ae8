"""The public Python API (`dpsynth.train`, `sample`, `evaluate`, `calibrate`, `audit`,
`Synthesizer`): typed results over the same engines as the CLI, the ledger charged as by the
commands, and errors that name the parameter, never a CLI flag."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import dpsynth
from dpsynth import (
    CalibrationResult,
    EvaluationReport,
    Ledger,
    SampleResult,
    Synthesizer,
    TrainResult,
    UsageError,
)
from dpsynth.data.builtin_tables import TABLES_DIR
from dpsynth.data.schema_file import read_schema


def test_import_dpsynth_does_not_import_torch_or_the_engines() -> None:
    code = (
        "import sys, dpsynth; "
        "print(sorted(m for m in sys.modules if m.startswith(('torch', 'pandas', 'dpsynth.'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['dpsynth.errors']"


def test_train_sample_evaluate_on_digits_from_python(tmp_path: Path, one_torch_thread) -> None:
    ledger = tmp_path / "ledger.jsonl"
    trained = dpsynth.train(
        method="dpkernel", data="digits", epsilon=2.0, preset="tiny", out=tmp_path / "run",
        ledger=ledger, device="cpu",
    )  # fmt: skip
    assert isinstance(trained, TrainResult) and trained.finished and trained.private
    assert 0 < trained.epsilon <= 2.0 and trained.run_dir == tmp_path / "run"
    # the ledger records the spend the result reports, anchored to the run
    spend = Ledger(ledger).spend(trained.ledger_seq)
    assert spend["status"] == "completed" == trained.ledger_status
    assert float(spend["epsilon"]) == pytest.approx(trained.epsilon)
    assert trained.ledger == ledger and trained.to_json()["run"] == str(trained.run_dir)
    with pytest.raises(dataclasses.FrozenInstanceError):
        trained.epsilon = 0.0  # type: ignore[misc]

    sampled = dpsynth.sample(trained.run_dir, 60, tmp_path / "samples", device="cpu")
    assert isinstance(sampled, SampleResult) and sampled.n == 60 and sampled.format == "png"
    assert sum(sampled.label_counts) == 60 and sampled.epsilon == pytest.approx(trained.epsilon)
    assert sampled.manifest.is_file() and sampled.release_seq is not None
    assert len(list(sampled.out.glob("*/*.png"))) == 60

    report = dpsynth.evaluate(
        sampled.out, "digits:test", metrics="accuracy", classifier="logreg", seeds=1,
        device="cpu", ledger=ledger,
    )  # fmt: skip
    assert isinstance(report, EvaluationReport) and report.modality == "image"
    assert 0.0 <= report.metrics["accuracy"]["mean"] <= 1.0
    assert json.loads(json.dumps(report.to_json()))["metrics"] == report.metrics


def test_synthesizer_fits_a_dataframe_and_samples_one(tmp_path: Path, one_torch_thread) -> None:
    frame = pd.read_csv(TABLES_DIR / "german_credit.csv", dtype=str)
    frame.insert(0, "customer_id", [f"cust-{i:05d}" for i in range(len(frame))])
    schema = read_schema(TABLES_DIR / "german_credit.schema.json").to_json()
    schema["columns"].insert(0, {"name": "customer_id", "type": "id"})
    ledger = tmp_path / "ledger.jsonl"

    synth = Synthesizer.create("mst", epsilon=1.0, preset="tiny", ledger=ledger, device="cpu")
    rows = synth.fit(frame, schema=schema).sample(200)
    assert isinstance(rows, pd.DataFrame) and len(rows) == 200
    assert list(rows.columns) == [c["name"] for c in schema["columns"]]
    # identifiers are fresh surrogate keys, never a real one
    assert rows["customer_id"].str.startswith("syn-").all()
    assert not set(rows["customer_id"]) & set(frame["customer_id"])
    categories = next(c for c in schema["columns"] if c["name"] == "credit_risk")["categories"]
    assert set(rows["credit_risk"].astype(str)) <= set(categories)
    # the spend is in the ledger, as `privacy` reports it
    privacy = synth.privacy
    assert privacy.private and 0 < privacy.epsilon <= 1.0 and privacy.ledger == ledger
    spend = Ledger(ledger).spend(privacy.ledger_seq)
    assert spend["status"] == "completed" and spend["dataset_id"] == "dataframe"
    assert float(spend["epsilon"]) == pytest.approx(privacy.epsilon)
    # trained on the frame in memory: no file of it was made
    spec = json.loads((synth.result.run_dir / "config.json").read_text())["data"]["spec"]
    assert spec == "dataframe"


def test_synthesizer_takes_a_privacy_unit(tmp_path: Path, one_torch_thread) -> None:
    frame = pd.read_csv(TABLES_DIR / "german_credit.csv", dtype=str)
    people = np.repeat(np.arange(len(frame)), 3)[: len(frame)]  # three rows a customer
    frame.insert(0, "customer_id", people.astype(str))
    schema = read_schema(TABLES_DIR / "german_credit.schema.json").to_json()
    schema["columns"].insert(0, {"name": "customer_id", "type": "id"})
    synth = Synthesizer.create(
        "mst", epsilon=5.0, preset="tiny", ledger=tmp_path / "ledger.jsonl", device="cpu",
        privacy_unit="customer_id", max_rows_per_unit=2,
    )  # fmt: skip
    rows = synth.fit(frame, schema=schema).sample(300)
    assert synth.result.summary["privacy_unit"]["max_rows_per_unit"] == 2
    spend = Ledger(tmp_path / "ledger.jsonl").spend(synth.privacy.ledger_seq)
    assert spend["privacy_unit"] == {"column": "customer_id", "max_rows_per_unit": 2}
    sizes = rows.groupby("customer_id").size()
    assert sizes.max() <= 2 and not set(rows["customer_id"]) & set(frame["customer_id"])


def test_a_dataframe_without_a_schema_is_refused_before_any_spend(tmp_path: Path) -> None:
    frame = pd.DataFrame({"age": [30, 41, 52, 63], "label": ["a", "b", "a", "b"]})
    ledger = tmp_path / "ledger.jsonl"
    synth = Synthesizer.create("mst", epsilon=1.0, preset="tiny", ledger=ledger)
    with pytest.raises(UsageError) as refused:
        synth.fit(frame)
    assert refused.value.parameter == "schema"
    assert "schema_epsilon" in str(refused.value) and "--" not in str(refused.value)
    assert not ledger.exists() or Ledger(ledger).entries() == []


def test_synthesizer_samples_images_as_uint8_records(tmp_path: Path, one_torch_thread) -> None:
    synth = Synthesizer.create(
        "dpkernel", epsilon=2.0, preset="tiny", ledger=tmp_path / "l.jsonl", device="cpu"
    )
    batch = synth.fit("digits").sample(30)
    x, y = batch.images, batch.labels
    assert isinstance(x, np.ndarray) and x.dtype == np.uint8 and x.shape[0] == 30
    assert y.shape == (30,) and set(np.unique(y)) <= set(range(10))


def test_api_errors_name_the_parameter_not_a_flag(tmp_path: Path) -> None:
    with pytest.raises(UsageError) as bad_epsilon:
        dpsynth.train(
            method="dpkernel", data="digits", epsilon="lots", out=tmp_path / "run",
            ledger=tmp_path / "l.jsonl",
        )  # fmt: skip
    error = bad_epsilon.value
    assert error.parameter == "epsilon" and isinstance(error, dpsynth.DpsynthError)
    assert str(error) == "epsilon must be a number or 'inf', got 'lots'"
    assert not (tmp_path / "run").exists() and not (tmp_path / "l.jsonl").exists()
    with pytest.raises(dpsynth.errors.UsageError) as bad_length:
        dpsynth.calibrate(epsilon=1.0, sampling_rate=0.01)
    assert bad_length.value.parameters == ("epsilon", "steps", "epochs", "noise_multiplier")
    assert "--" not in str(bad_length.value)
    # the CLI prints the same error with its flags
    from dpsynth.cli.flags import cli_message

    assert cli_message(error) == "--epsilon must be a number or 'inf', got 'lots'"
    assert cli_message(bad_length.value).startswith("--epsilon needs --steps or --epochs")


def test_calibrate_returns_a_proven_bound(tmp_path: Path) -> None:
    found = dpsynth.calibrate(epsilon=2.0, delta=1e-5, sampling_rate=0.01, steps=500)
    assert isinstance(found, CalibrationResult) and found.mode == "noise_multiplier"
    assert found.epsilon <= 2.0 and found.noise_multiplier > 0 and found.prior_events == 0
    back = dpsynth.calibrate(
        noise_multiplier=found.noise_multiplier, delta=1e-5, sampling_rate=0.01, steps=500
    )
    assert back.epsilon == pytest.approx(found.epsilon, rel=1e-6)
    assert found.to_json()["mode"] == "noise_multiplier"


def test_audit_wraps_the_white_box_audit() -> None:
    result = dpsynth.audit("dpkernel", 2.0, preset="tiny", canaries=200, seed=1)
    assert result.claimed_epsilon <= 2.0 and result.verdict in ("pass", "FAIL")
    assert result.to_json()["method"] == "dpkernel"


def test_evaluate_and_audit_stay_functions_beside_their_subpackages() -> None:
    import dpsynth.auditing.planned_audit
    import dpsynth.evaluation.report

    assert dpsynth.evaluation.report.run_evaluation is not None
    assert dpsynth.auditing.planned_audit.run_audit is not None
    assert callable(dpsynth.evaluate) and "synthetic" in dpsynth.evaluate.__doc__
    assert dpsynth.audit is dpsynth.api.audit and dpsynth.evaluate is dpsynth.api.evaluate


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            [
                "calibrate",
                "--epsilon",
                "1",
                "--batch-size",
                "5000",
                "--dataset-size",
                "1437",
                "--steps",
                "10",
            ],
            "error: --batch-size 5000 exceeds --dataset-size 1437 (q would be > 1)",
        ),
        (
            [
                "calibrate",
                "--epsilon",
                "1",
                "--sampling-rate",
                "0.01",
                "--steps",
                "10",
                "--epochs",
                "1",
            ],
            "error: give either --steps or --epochs, not both",
        ),
        (
            ["train", "--out", "run", "--data", "digits"],
            "error: missing --method, --epsilon (or use --resume)",
        ),
        (
            [
                "train",
                "--out",
                "run",
                "--method",
                "dpkernel",
                "--data",
                "digits",
                "--epsilon",
                "lots",
                "--ledger",
                "l.jsonl",
            ],
            "error: --epsilon must be a number or 'inf', got 'lots'",
        ),
    ],
)
def test_the_cli_prints_the_parameters_as_its_flags(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], line: str
) -> None:
    from typer.testing import CliRunner

    from dpsynth.cli import app

    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and result.output.strip() == line
