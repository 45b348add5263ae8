"""DPAF `mode=paper`: the paper's mechanism behind an explicit flag, recorded as NOT private
and labelled "not a DP guarantee" in the plan, the ledger (`ledger show`), the train result and
the sample manifest; its claimed ε never enters a statement or the data set's total."""

from __future__ import annotations

import json
import math

import pytest
import torch
from typer.testing import CliRunner

from dpsynth.cli import app
from dpsynth.data.images import DataInfo
from dpsynth.errors import UsageError
from dpsynth.methods.base import PrivacyTarget
from dpsynth.methods.dpaf import DPAFMethod
from dpsynth.privacy.accounting.compose import compose_epsilon
from dpsynth.privacy.accounting.events import events_to_json
from dpsynth.privacy.accounting.plan_check import NOT_DP_LABEL, check_plan_parameters, not_dp_label
from dpsynth.privacy.mechanisms.randomness import PrivateRandomness

INFO = DataInfo(
    spec="digits",
    kind="images",
    n=1437,
    shape=(1, 8, 8),
    classes=tuple(str(c) for c in range(10)),
    fingerprint="test",
    dataset_id="digits",
)


def _paper(epsilon: float = 5.0, **overrides):
    method = DPAFMethod()
    config = method.config("tiny", {"mode": "paper", **overrides}, INFO)
    return config, method.plan(INFO, PrivacyTarget(epsilon, 1e-5), config)


def test_strict_is_the_default_and_paper_needs_its_own_learning():
    assert DPAFMethod().config("small", {}, INFO)["mode"] == "strict"
    assert all(p["mode"] == "strict" for p in DPAFMethod.presets.values())
    with pytest.raises(UsageError, match="g_loss=bce"):
        DPAFMethod().config("small", {"mode": "paper"}, INFO)  # small uses the matching loss
    with pytest.raises(UsageError, match=r"needs ε > 0\.2"):
        _paper(0.2)


def test_paper_plan_is_not_private_and_its_claim_is_only_an_annotation():
    config, plan = _paper(5.0)
    assert not plan.private and plan.epsilon_bound == math.inf
    assert all(e.kind == "non_private" for e in plan.events)
    label = next(e for e in events_to_json(plan.events) if e.get("label"))
    assert label["label"] == NOT_DP_LABEL
    # the paper-style claim: three streams, each at its split, composed (≤ the sum of parts)
    assert 0.2 < label["claimed_epsilon"] <= 5.0 + 1e-6
    assert len(label["streams"]) == 3
    assert compose_epsilon(label["streams"], 1e-5).epsilon == pytest.approx(
        label["claimed_epsilon"]
    )
    assert min(label[k] for k in ("c_noise_multiplier", "agg_noise_multiplier")) > 0
    # what the ledger composes for these events: no proven bound at all
    assert compose_epsilon(plan.events, 1e-5).epsilon == math.inf
    assert not_dp_label(plan.events).startswith(NOT_DP_LABEL)
    check_plan_parameters(
        plan.events,
        private=False,
        noise_multiplier=plan.noise_multiplier,
        sampling_rate=plan.sampling_rate,
        steps=plan.steps,
        run_name="r",
    )
    trainer = DPAFMethod().trainer(INFO, config, plan, torch.device("cpu"), 0)
    assert trainer.paper and trainer.agg_sigma == label["agg_noise_multiplier"]
    assert trainer.conv2_sigma == label["conv2_noise_multiplier"]


def test_paper_phase1_and_conv2_use_the_clean_aggregate(one_torch_thread):
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = torch.tensor(bunch.images[:80], dtype=torch.float32)[:, None] / 8.0 - 1.0
    y = torch.tensor(bunch.target[:80], dtype=torch.int64)
    config, plan = _paper(5.0)
    trainer = DPAFMethod().trainer(INFO, config, plan, torch.device("cpu"), 0, PrivateRandomness(3))
    c_params = [p.clone() for p in trainer.classifier.parameters()]
    stats = trainer.step(x, y)  # phase 1: the paper's MSE on class proportions
    assert math.isfinite(stats["c_loss"])
    moved = [
        not torch.equal(a, b)
        for a, b in zip(c_params, trainer.classifier.parameters(), strict=True)
    ]
    assert all(moved)  # conv1 (noisy DP-SGD) and C's conv2 and head (plain) all train
    # the conv2* direction in paper mode: ∂L'/∂a at the noise-free aggregates
    real, fake = torch.randn(5, trainer.rows.dim), torch.randn(7, trainer.rows.dim)
    v_real, v_fake = trainer._clean_aggregate_v(real, fake)
    clean = (torch.stack([real.sum(0), fake.sum(0)]) / trainer.agg_normalizer).requires_grad_()
    logits = trainer.head(clean).squeeze(1)
    torch.nn.functional.softplus(-logits[0]).add(torch.nn.functional.softplus(logits[1])).backward()
    torch.testing.assert_close(v_real, clean.grad[0])
    torch.testing.assert_close(v_fake, clean.grad[1])
    for _ in range(config["c_steps"] + 1):
        trainer.step(x, y)
    assert trainer.classifier is None and trainer.d_steps > 0


def test_paper_run_is_labelled_in_ledger_train_and_sample(tmp_path, one_torch_thread):
    runner = CliRunner()
    ledger = str(tmp_path / "l.jsonl")
    run = str(tmp_path / "run")
    result = runner.invoke(
        app,
        ["train", "--method", "dpaf", "--data", "digits", "--epsilon", "5", "--preset", "tiny",
         "--set", "mode=paper", "--out", run, "--ledger", ledger, "--json"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    trained = json.loads(result.output)
    assert trained["private"] is False and trained["epsilon"] == "inf"
    assert trained["privacy_label"].startswith(NOT_DP_LABEL)
    shown = runner.invoke(app, ["ledger", "show", "--ledger", ledger])
    assert shown.exit_code == 0 and NOT_DP_LABEL in " ".join(shown.output.split())
    as_json = json.loads(
        runner.invoke(app, ["ledger", "show", "--ledger", ledger, "--json"]).output
    )
    # the data set's total is no proven bound: inf, never the claimed ε
    assert as_json["datasets"]["digits"]["total_epsilon"] in ("inf", math.inf)
    assert as_json["datasets"]["digits"]["private"] is False
    sampled = runner.invoke(
        app, ["sample", run, "--n", "10", "--out", str(tmp_path / "s"), "--ledger", ledger]
    )
    assert sampled.exit_code == 0, sampled.output
    manifest = json.loads((tmp_path / "s" / "manifest.json").read_text())
    assert manifest["private"] is False
    assert manifest["privacy"].startswith(f"NOT PRIVATE ({NOT_DP_LABEL}")
    assert "claimed" not in json.dumps(manifest["privacy_source"])
    verify = runner.invoke(app, ["ledger", "verify", "--ledger", ledger])
    assert verify.exit_code == 0, verify.output
