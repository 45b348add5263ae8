"""The target's class proportions released with DP (`train --class-weights-epsilon`): the
mechanism's sensitivity and noise, its ledger event composed with training (re-accounted with
dp-accounting), the released weights stored in the run's schema and used in training and
sampling, and the refusals."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from dpsynth.cli import app
from dpsynth.data.builtin_tables import TABLES_DIR
from dpsynth.data.images import DataInfo
from dpsynth.data.schema_file import parse_schema
from dpsynth.ledger import Ledger
from dpsynth.privacy.accounting.compose import compose_epsilon
from dpsynth.privacy.accounting.events import events_to_json
from dpsynth.privacy.mechanisms.histograms import (
    CLASS_WEIGHT_FLOOR,
    class_counts,
    noisy,
    plan_class_weights_release,
    proportions_from_counts,
    release_class_weights,
)
from dpsynth.sampling import weighted_counts

runner = CliRunner()


def _train(
    tmp_path: Path, *extra: str, data: str = "german-credit", out: str = "run", epsilon: str = "2"
) -> object:
    args = ["train", "--method", "dpkernel", "--data", data, "--epsilon", epsilon]
    args += ["--preset", "tiny", "--set", "steps=10", "--out", str(tmp_path / out)]
    args += ["--ledger", str(tmp_path / "ledger.jsonl"), "--device", "cpu", "--json", *extra]
    return runner.invoke(app, args)


def _spends(tmp_path: Path) -> list[dict]:
    path = tmp_path / "ledger.jsonl"
    return [e for e in Ledger(path).entries() if e["kind"] == "spend"] if path.exists() else []


def _reference_epsilon(events: list[dict], delta: float) -> float:
    """ε of the events under dp-accounting's PLD accountant (an independent implementation)."""
    dp_event = pytest.importorskip("dp_accounting.dp_event")
    pld = pytest.importorskip("dp_accounting.pld.pld_privacy_accountant")
    accountant = pld.PLDAccountant()
    threshold = 0.0
    for event in events_to_json(events):
        if event["type"] == "gaussian":
            accountant.compose(
                dp_event.GaussianDpEvent(event["noise_multiplier"]), int(event["count"])
            )
        elif event["type"] == "poisson_gaussian":
            accountant.compose(
                dp_event.PoissonSampledDpEvent(
                    event["sampling_rate"], dp_event.GaussianDpEvent(event["noise_multiplier"])
                ),
                int(event["steps"]),
            )
        elif event["type"] == "threshold_delta":
            threshold += float(event["delta"])
        else:
            raise AssertionError(f"unexpected event {event}")
    return accountant.get_epsilon(delta - threshold)


def test_class_histogram_sensitivity_one_and_noise_std() -> None:
    classes = ("no", "yes", "maybe")
    labels = np.array(["no"] * 70 + ["yes"] * 30)
    counts = class_counts(labels, classes)
    assert counts.tolist() == [70, 30, 0]
    # one row added or removed moves exactly one bin by exactly 1 (L2 sensitivity 1)
    for extra in classes:
        change = class_counts(np.append(labels, extra), classes) - counts
        assert np.abs(change).sum() == 1 and change.max() == 1
    assert (class_counts(labels[1:], classes) - counts).tolist() == [-1, 0, 0]
    plan = plan_class_weights_release(0.5, 1e-5)
    assert plan.noise_std == plan.noise_multiplier  # sensitivity 1
    assert [e.kind for e in plan.events] == ["gaussian"]
    assert compose_epsilon(list(plan.events), 1e-5).epsilon <= 0.5 + 1e-9
    assert _reference_epsilon(list(plan.events), 1e-5) <= 0.5 * 1.01
    # the release is exactly counts + N(0, σ²) then post-processing, with the planned std
    generator = torch.Generator().manual_seed(3)
    released = release_class_weights(labels, classes, plan, generator)
    again = noisy(counts, plan.noise_std, torch.Generator().manual_seed(3))
    assert released == pytest.approx(tuple(proportions_from_counts(again)))
    draws = noisy(np.zeros(20000), plan.noise_std, torch.Generator().manual_seed(1))
    assert draws.std() == pytest.approx(plan.noise_std, rel=0.03)
    assert abs(draws.mean()) < 4 * plan.noise_std / math.sqrt(20000)


def test_post_processing_clips_floors_and_normalises() -> None:
    shares = proportions_from_counts(np.array([900.0, -12.0, 100.0]))
    assert shares.sum() == pytest.approx(1.0)
    assert shares[1] == pytest.approx(CLASS_WEIGHT_FLOOR, rel=0.01)
    assert shares[0] / shares[2] == pytest.approx(9.0)
    assert proportions_from_counts(np.array([-3.0, -1.0])).tolist() == [0.5, 0.5]
    assert weighted_counts(20000, (0.938, 0.062)) == [18760, 1240]
    assert sum(weighted_counts(7, (0.5, 0.3, 0.2))) == 7


def test_released_weights_are_spent_composed_stored_and_used(tmp_path: Path) -> None:
    result = _train(tmp_path, "--class-weights-epsilon", "0.3")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    release, training = _spends(tmp_path)
    assert release["command"] == "schema-release" and training["command"] == "train"
    assert release["run_id"] == training["run_id"] == summary["run_id"]
    assert release["seq"] < training["seq"]  # spent before training
    assert [e["type"] for e in release["events"]] == ["gaussian"]
    delta = training["delta"]
    # the total is the dataset's --epsilon: composed by the ledger and by dp-accounting
    events = [*release["events"], *training["events"]]
    total = compose_epsilon(events, delta).epsilon
    assert 1.9 < total <= 2.0
    assert float(training["total_epsilon"]) == pytest.approx(total, rel=1e-3)
    assert _reference_epsilon(events, delta) <= total * 1.001
    # the released weights are in the run's (public) schema, used as declared ones are
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    target = config["data"]["schema"]["columns"][-1]
    assert target["name"] == "credit_risk"
    weights = target["weights"]
    assert target["weights_source"].startswith("released with DP (--class-weights-epsilon 0.3")
    assert config["schema_release"]["class_weights"]["weights"] == pytest.approx(weights)
    # german-credit's training split is 70% / 30%; the noise at ε = 0.3 on 800 rows is ~±2%
    assert weights[0] == pytest.approx(0.7, abs=0.05) and sum(weights) == pytest.approx(1.0)
    from dpsynth.methods.dpkernel.labels import target_weights as _target_weights

    assert _target_weights(DataInfo.from_json(config["data"])) == pytest.approx(tuple(weights))
    # sampling follows them on request and says so; the statement composes both spends
    out = tmp_path / "s.csv"
    sampled = runner.invoke(
        app,
        ["sample", str(tmp_path / "run"), "--n", "200", "--out", str(out), "--json",
         "--labels", "weights"],
    )  # fmt: skip
    assert sampled.exit_code == 0, sampled.output
    manifest = json.loads((tmp_path / "s.csv.manifest.json").read_text())
    assert manifest["label_counts"] == weighted_counts(200, weights)
    assert manifest["labels"].startswith("weights of the target (released with DP")
    assert manifest["privacy_source"]["epsilon"] == pytest.approx(total, rel=1e-6)
    balanced = runner.invoke(  # the default
        app, ["sample", str(tmp_path / "run"), "--n", "200", "--out", str(tmp_path / "b.csv")]
    )
    assert balanced.exit_code == 0, balanced.output
    manifest = json.loads((tmp_path / "b.csv.manifest.json").read_text())
    assert manifest["label_counts"] == [100, 100] and manifest["labels"] == "balanced"


def test_with_schema_epsilon_both_releases_share_one_entry(tmp_path: Path) -> None:
    lines = (TABLES_DIR / "german_credit.csv").read_text().splitlines()[:401]
    path = tmp_path / "g.csv"
    path.write_text("\n".join(lines) + "\n")
    schema = json.loads(runner.invoke(app, ["data", "schema", f"csv:{path}"]).stdout)
    assert "weights" not in schema["columns"][-1]  # drafts never write class proportions
    schema["columns"][-1].pop("source")  # the label set is declared
    schema_path = tmp_path / "g.schema.json"
    schema_path.write_text(json.dumps(schema))
    # 400 rows: a schema release of 2 keeps what a quarter of the rows hold (0.5 is refused)
    result = _train(tmp_path, "--schema", str(schema_path), "--schema-epsilon", "2",
                    "--class-weights-epsilon", "0.2", data=f"csv:{path}", epsilon="4")  # fmt: skip
    assert result.exit_code == 0, result.output
    release, training = _spends(tmp_path)
    assert [e["type"] for e in release["events"]] == ["threshold_delta", "gaussian", "gaussian"]
    delta = training["delta"]
    events = [*release["events"], *training["events"]]
    total = compose_epsilon(events, delta).epsilon
    assert 3.9 < total <= 4.0
    assert _reference_epsilon(events, delta) <= total * 1.001
    record = json.loads(result.stdout)["schema_release"]
    assert record["epsilon"] == pytest.approx(compose_epsilon(release["events"], delta).epsilon)
    assert record["class_weights"]["epsilon"] <= 0.2 + 1e-9


def test_refusals_spend_nothing(tmp_path: Path) -> None:
    on_images = _train(tmp_path, "--class-weights-epsilon", "0.1", data="digits")
    assert on_images.exit_code == 2 and "are for tables" in on_images.output
    too_much = _train(tmp_path, "--class-weights-epsilon", "2")
    assert too_much.exit_code == 2 and "below --epsilon" in too_much.output
    bad = _train(tmp_path, "--class-weights-epsilon", "-1")
    assert bad.exit_code == 2 and "positive number" in bad.output
    # weights already declared public: nothing to release
    raw = (TABLES_DIR / "german_credit.csv").read_text()
    path = tmp_path / "g.csv"
    path.write_text(raw)
    from dpsynth.data.sources import read_table

    schema = read_table("german-credit")[2].to_json()
    schema["columns"][-1]["weights"] = [0.7, 0.3]
    declared = tmp_path / "declared.json"
    declared.write_text(json.dumps(schema))
    refused = _train(tmp_path, "--schema", str(declared), "--class-weights-epsilon", "0.1",
                     data=f"csv:{path}")  # fmt: skip
    assert refused.exit_code == 2 and "already declares public 'weights'" in refused.output
    # weights read off the data are not public: refused unless declared or released
    schema["columns"][-1]["weights_source"] = "data (not private: review or replace)"
    derived = tmp_path / "derived.json"
    derived.write_text(json.dumps(schema))
    assert parse_schema(schema).target_column.weights_derived
    refused = _train(tmp_path, "--schema", str(derived), data=f"csv:{path}")
    assert refused.exit_code == 2 and "--class-weights-epsilon" in refused.output
    assert _spends(tmp_path) == []
    # --schema-public declares them public (recorded in the run's schema)
    public = _train(tmp_path, "--schema", str(derived), "--schema-public", data=f"csv:{path}",
                    out="public")  # fmt: skip
    assert public.exit_code == 0, public.output
    config = json.loads((tmp_path / "public" / "config.json").read_text())
    target = config["data"]["schema"]["columns"][-1]
    assert target["weights"] == pytest.approx([0.7, 0.3])
    assert target["weights_source"] == "declared public by the user (--schema-public)"
    # --labels weights on a run whose schema has none
    plain = _train(tmp_path, out="plain")
    assert plain.exit_code == 0, plain.output
    sampled = runner.invoke(
        app,
        ["sample", str(tmp_path / "plain"), "--n", "10", "--out", str(tmp_path / "p.csv"),
         "--labels", "weights"],
    )  # fmt: skip
    assert sampled.exit_code == 2 and "no 'weights'" in sampled.output
