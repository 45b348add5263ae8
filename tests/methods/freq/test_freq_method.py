"""`--method freq`: the shared DP frequency model alone, as a backend (one Gaussian release)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from dpsynth import sampling
from dpsynth.cli import app
from dpsynth.data.images import DataInfo
from dpsynth.data.sources import load_data
from dpsynth.errors import UsageError
from dpsynth.ledger import Ledger
from dpsynth.methods.blocks import TeacherFilter
from dpsynth.methods.registry import get_method, method_names
from dpsynth.privacy.accounting.compose import compose_epsilon
from dpsynth.privacy.accounting.events import event_from_json
from dpsynth.privacy.accounting.plan import PrivacyTarget
from dpsynth.privacy.accounting.plan_check import IDLE_STEPS_KEY, check_plan_parameters
from dpsynth.privacy.mechanisms.randomness import PrivateRandomness
from dpsynth.privacy.releases import frequency
from dpsynth.privacy.releases.frequency import FrequencyModel, FrequencyPlan, frequency_statistics
from dpsynth.training import train_run

runner = CliRunner()
DIGITS = DataInfo("digits", "builtin", 1437, (1, 8, 8), tuple("0123456789"), "f" * 64, "digits")
MNIST = DataInfo("mnist", "images", 4000, (1, 28, 28), tuple("0123456789"), "f" * 64, "mnist")
SECRET = 20261201


def _train(tmp_path: Path, name: str, epsilon: Any = 2.0, **kwargs: Any) -> dict[str, Any]:
    return train_run(
        method="freq", data="digits", epsilon=epsilon, preset="tiny", out=tmp_path / name,
        ledger_path=tmp_path / f"{name}.jsonl", device="cpu", seed=0, **kwargs,
    )  # fmt: skip


def _spend(tmp_path: Path, name: str) -> dict[str, Any]:
    (spend,) = [e for e in Ledger(tmp_path / f"{name}.jsonl").entries() if e["kind"] == "spend"]
    return spend


def _model(run: Path) -> dict[str, torch.Tensor]:
    tensors = load_file(str(run / "checkpoint.safetensors"))
    return {k: v for k, v in tensors.items() if k.startswith("trainer/frequency.")}


def test_it_is_registered_between_rdpgan_and_aim_for_images():
    names = method_names()
    assert names.index("rdpgan") + 1 == names.index("freq") == names.index("aim") - 1
    backend = get_method("freq")
    assert backend.modalities == ("image",)
    assert {"tiny", "small", "mnist", "mnist-eps1", "mnist-teacher"} <= set(backend.presets)


def test_one_release_noised_as_planned_and_the_printed_epsilon_is_the_prv_bound(
    tmp_path, monkeypatch
):
    released: list[torch.Tensor] = []
    original = frequency.model_from_release

    def spy(vector, *args, **kwargs):
        released.append(vector.clone())
        return original(vector, *args, **kwargs)

    monkeypatch.setattr(frequency, "model_from_release", spy)
    result = _train(tmp_path, "run", privacy_seed=SECRET)
    assert result["ledger_status"] == "completed" and result["private"]
    assert result["steps"] == result["total_steps"] == 1
    spend = _spend(tmp_path, "run")
    # exactly one event: the frequency model's Gaussian, declaring the loop's step idle
    (event,) = spend["events"]
    assert event["type"] == "gaussian" and event["count"] == 1
    assert event["mechanism"] == "frequency_model" and event[IDLE_STEPS_KEY] == 1
    assert event["band"] == 4 and event["covariance"] == "pooled"
    # the printed ε is the PRV bound of the events, under the target
    bound = compose_epsilon(spend["events"], spend["delta"]).epsilon
    assert float(result["epsilon"]) == pytest.approx(bound, rel=1e-12)
    assert bound <= 2.0 and float(result["dataset_total_epsilon"]) <= 2.0
    plan = json.loads((tmp_path / "run" / "config.json").read_text())["privacy"]
    assert plan["events"] == spend["events"]
    assert plan["gaussian_sum"]["noise_multiplier"] == event["noise_multiplier"]
    # the noise: std σ·√(2 + w²) on the exact statistics, drawn from the run's secret stream
    release = FrequencyPlan.from_event(event_from_json(event))
    sigma, weight = event["noise_multiplier"], event["count_weight"]
    assert release.noise_std == pytest.approx(sigma * math.sqrt(2 + weight**2))
    records = load_data("digits")
    exact = frequency_statistics(records.as_float(), records.y, 10, release)
    stream = PrivateRandomness(SECRET).generator("frequency/noise")
    noise = torch.randn(exact.shape, generator=stream, dtype=torch.float64)
    (vector,) = released
    torch.testing.assert_close(vector, exact + release.noise_std * noise)
    residual = (vector - exact) / release.noise_std
    assert 0.85 < float(residual.std()) < 1.15  # 306 coordinates of N(0, 1)
    # the loop's plan check accepts one step without reads
    check_plan_parameters(
        plan["events"], private=True, noise_multiplier=plan["gaussian_sum"]["noise_multiplier"],
        sampling_rate=plan["sampling_rate"], steps=plan["steps"], run_name="run",
    )  # fmt: skip


def test_samples_are_uint8_images_with_the_requested_labels_and_repeat_for_a_seed(tmp_path):
    _train(tmp_path, "run")
    images, labels, classes = sampling.generate(tmp_path / "run", 25, seed=3, device="cpu")
    assert images.shape == (25, 1, 8, 8) and images.dtype == torch.uint8
    assert classes == tuple("0123456789")
    assert torch.equal(torch.bincount(labels, minlength=10), torch.tensor([3] * 5 + [2] * 5))
    again, labels_again, _ = sampling.generate(tmp_path / "run", 25, seed=3, device="cpu")
    assert torch.equal(images, again) and torch.equal(labels, labels_again)
    other, _, _ = sampling.generate(tmp_path / "run", 25, seed=4, device="cpu")
    assert not torch.equal(images, other)
    # the sampler is the release's own map (FrequencyModel.images_at), for the same latents
    generator, _, _ = sampling.load_generator(tmp_path / "run", "cpu")
    tensors = {k.removeprefix("trainer/"): v for k, v in _model(tmp_path / "run").items()}
    model = FrequencyModel.from_tensors(tensors)
    assert model is not None and model.dim == 16
    wanted = torch.arange(10)
    z = torch.randn(10, model.dim, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(generator.images_at(wanted, z), model.images_at(wanted, z))


def test_truncation_narrows_the_deviations_and_is_in_the_manifest(tmp_path):
    _train(tmp_path, "run")
    common = ["--n", "200", "--format", "npz", "--device", "cpu", "--json"]
    common += ["--ledger", str(tmp_path / "run.jsonl")]
    spreads = []
    for name, extra in (("plain", []), ("narrow", ["--truncation", "0.25"])):
        out = tmp_path / name
        result = runner.invoke(
            app, ["sample", str(tmp_path / "run"), "--out", str(out), *common, *extra]
        )
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout)["truncation"] == (0.25 if extra else 1.0)
        archive = np.load(out / "samples.npz")
        x, y = archive["x"].astype(np.float64), archive["y"]
        spreads.append(np.mean([x[y == c].std(axis=0).mean() for c in range(10)]))
    assert spreads[1] < spreads[0]


def test_epsilon_inf_is_the_exact_release_marked_not_private(tmp_path):
    result = runner.invoke(
        app,
        [
            "train", "--method", "freq", "--data", "digits", "--epsilon", "inf", "--preset",
            "tiny", "--out", str(tmp_path / "run"), "--ledger", str(tmp_path / "l.jsonl"),
            "--device", "cpu", "--json",
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["private"] is False and summary["epsilon"] == "inf"
    (spend,) = [e for e in Ledger(tmp_path / "l.jsonl").entries() if e["kind"] == "spend"]
    (event,) = spend["events"]
    assert event["type"] == "non_private" and event["mechanism"] == "frequency_model"
    assert event[IDLE_STEPS_KEY] == 1
    images, _, _ = sampling.generate(tmp_path / "run", 10, seed=0, device="cpu")
    assert images.shape == (10, 1, 8, 8)


def test_a_resumed_run_releases_the_same_model_and_samples_the_same_images(tmp_path):
    straight = _train(tmp_path, "straight", privacy_seed=SECRET)
    part = _train(tmp_path, "part", privacy_seed=SECRET, stop_after_steps=0, checkpoint_every_s=0)
    assert part["interrupted"] and part["steps"] == 0
    with pytest.raises(UsageError, match="not released"):
        sampling.generate(tmp_path / "part", 5, seed=0, device="cpu")
    resumed = train_run(
        method="freq", data="digits", epsilon=2.0, out=tmp_path / "part", ledger_path=None,
        device="cpu", resume=True,
    )  # fmt: skip
    assert resumed["steps"] == 1 and resumed["epsilon"] == straight["epsilon"]
    a, b = _model(tmp_path / "straight"), _model(tmp_path / "part")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    x, _, _ = sampling.generate(tmp_path / "straight", 30, seed=5, device="cpu")
    y, _, _ = sampling.generate(tmp_path / "part", 30, seed=5, device="cpu")
    assert torch.equal(x, y)


def test_the_teacher_takes_its_share_beside_the_release_and_relabels(tmp_path):
    overrides = {"teacher_share": "0.5", "teacher_epochs": "1", "teacher_filter": "relabel"}
    result = _train(tmp_path, "run", epsilon=3.0, overrides=overrides)
    spend = _spend(tmp_path, "run")
    mechanisms = [e["mechanism"] for e in spend["events"]]
    assert mechanisms == ["dp_classifier", "frequency_model"]
    bound = compose_epsilon(spend["events"], spend["delta"]).epsilon
    assert float(result["epsilon"]) == pytest.approx(bound, rel=1e-12) and bound <= 3.0
    generator, _, _ = sampling.load_generator(tmp_path / "run", "cpu")
    assert isinstance(generator, TeacherFilter)
    images, labels, _ = sampling.generate(tmp_path / "run", 20, seed=0, device="cpu")
    assert images.shape == (20, 1, 8, 8) and torch.equal(labels.sort().values, labels)


def test_the_plan_composes_with_earlier_spends_and_the_teacher_as_the_stages_do():
    backend = get_method("freq")
    config = backend.config("tiny", {}, DIGITS)
    target = PrivacyTarget(4.0, 1e-5)
    prior = ({"type": "gaussian", "noise_multiplier": 3.0, "count": 1},)
    plan = backend.plan(DIGITS, target, config, prior)
    (event,) = plan.events
    assert plan.epsilon_bound == compose_epsilon(plan.events, 1e-5).epsilon
    assert plan.total_epsilon_bound == compose_epsilon([*prior, event], 1e-5).epsilon <= 4.0
    alone = backend.plan(DIGITS, target, config)
    assert event.noise_multiplier > alone.events[0].noise_multiplier  # less left
    # the 28×28 teacher preset: 70% of ε to the teacher, the release on the rest
    mnist = backend.config("mnist-teacher", {}, MNIST)
    backend.validate_config(mnist, MNIST)
    plan = backend.plan(MNIST, PrivacyTarget(10.0, 1e-5), mnist)
    assert [e.annotation("mechanism") for e in plan.events] == ["dp_classifier", "frequency_model"]
    assert plan.epsilon_bound == compose_epsilon(plan.events, 1e-5).epsilon <= 10.0
    stage = plan.events[1]
    assert stage.annotation("covariance") == "class" and stage.annotation("band") == 10


def test_presets_and_settings():
    backend = get_method("freq")
    assert (
        backend.recommended_preset(DIGITS, 1.0) == backend.recommended_preset(DIGITS, 10) == "small"
    )
    assert backend.recommended_preset(MNIST, 1.0) == "mnist-eps1"
    assert backend.recommended_preset(MNIST, 10.0) == backend.recommended_preset(MNIST, math.inf)
    assert backend.recommended_preset(MNIST, 10.0) == "mnist"
    assert backend.config("mnist-eps1", {}, MNIST)["frequency_covariance"] == "pooled"
    assert backend.config("small", {}, DIGITS)["frequency_band"] == 8
    config = backend.config("tiny", {"frequency_band": "6", "frequency_clip": "3"}, DIGITS)
    assert (config["frequency_band"], config["frequency_clip"]) == (6, 3.0)
    for key in ("frequency_share", "warm_start_share", "frequency_fit_steps"):
        with pytest.raises(UsageError, match=f"--set {key} does not apply"):
            backend.config("tiny", {key: "0.5"}, DIGITS)
    for bad in ({"frequency_band": "0"}, {"frequency_covariance": "full"},
                {"frequency_count_weight": "0"}, {"teacher_share": "1.5"}):  # fmt: skip
        with pytest.raises(UsageError):
            backend.validate_config(backend.config("tiny", bad, DIGITS), DIGITS)
