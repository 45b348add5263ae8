"""DPAF's matching generator loss on per-class aggregates (`g_loss=match`, the `small` fix):
per-class rows keep the sensitivity, the released sum holds the class sums and counts, the
frozen conv2* window is accounted exactly, the generator step reads only released values,
and resume restores the running released sum."""

from __future__ import annotations

import math

import pytest
import torch
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant

from dpsynth.data.images import DataInfo
from dpsynth.errors import UsageError
from dpsynth.methods.base import PrivacyTarget
from dpsynth.methods.dpaf import DPAFMethod
from dpsynth.methods.dpaf.model import AggregateRows, Features
from dpsynth.privacy.accounting.events import events_to_json
from dpsynth.privacy.mechanisms.aggregation import (
    noisy_feature_sum,
    renorm_rows,
    split_window_noise,
    window_noise_multiplier,
)
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
MATCH = {
    "g_loss": "match",
    "class_aggregates": True,
    "train_conv2": False,
    "window": 1,
    "count_feature": 4.0,
    "g_batch": 20,
}


def _digits(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = torch.tensor(bunch.images[:n], dtype=torch.float32)[:, None] / 8.0 - 1.0
    return x, torch.tensor(bunch.target[:n], dtype=torch.int64)


def _trainer(epsilon: float, seed: int = 0, **overrides):
    method = DPAFMethod()
    config = method.config("tiny", {**MATCH, **overrides}, INFO)
    plan = method.plan(INFO, PrivacyTarget(epsilon, 1e-5), config)
    trainer = method.trainer(INFO, config, plan, torch.device("cpu"), 0, PrivateRandomness(seed))
    return config, plan, trainer


def test_class_rows_keep_the_bound_and_neighbouring_sums_differ_by_at_most_it():
    torch.manual_seed(0)
    features = Features((1, 8, 8), 10, width=8, conv1_layers=1, conv2_layers=1)
    rows = AggregateRows(features.dim, 10, per_class=True, count=4.0)
    assert rows.dim == 10 * (features.dim + 1)
    assert rows.bound == pytest.approx(math.sqrt(features.dim + 16.0))
    x, y = _digits(50)
    onehot = torch.nn.functional.one_hot(y, 10).float()
    with torch.no_grad():
        r = renorm_rows(rows(features(x, onehot), onehot), rows.bound)
    blocks = r.view(50, 10, features.dim + 1)
    # a record fills only its own class's block, and that block's count coordinate is a
    others = torch.ones(50, 10, dtype=torch.bool)
    others[torch.arange(50), y] = False
    assert blocks[others].abs().max() == 0
    assert torch.allclose(blocks[torch.arange(50), y, -1], torch.full((50,), 4.0))
    # add/remove one record: the clean sum moves by that record's row, norm ≤ the bound
    total = r.sum(0)
    for i in range(50):
        keep = torch.ones(50, dtype=torch.bool)
        keep[i] = False
        assert float((total - r[keep].sum(0)).norm()) <= rows.bound * (1 + 1e-5)
    # the class means of the clean sum are the classes' mean features
    with torch.no_grad():
        h = features(x, onehot)
    means = rows.class_means(total)
    for c in range(10):
        torch.testing.assert_close(means[c], h[y == c].mean(0), rtol=1e-4, atol=1e-4)
    assert rows.class_means(torch.zeros(rows.dim)) is None


def test_class_rows_noise_is_sigma_times_the_bound():
    rows = AggregateRows(31, 10, per_class=True, count=8.0)
    gen = torch.Generator().manual_seed(3)
    noisy = noisy_feature_sum(torch.zeros(0, rows.dim), rows.bound, 1.7, gen)
    assert float(noisy.std()) == pytest.approx(1.7 * math.sqrt(31 + 64), rel=0.05)


def test_frozen_conv2_split_and_plan_are_exact_poisson_gaussians():
    agg, conv2 = split_window_noise(1.3, 4, 0.0)
    assert agg == pytest.approx(1.3 * 2) and conv2 == math.inf
    assert window_noise_multiplier(agg, conv2, 4) == pytest.approx(1.3)
    config, plan, trainer = _trainer(5.0)
    _, phase2 = events_to_json(plan.events)
    assert phase2["conv2_noise_multiplier"] is None and "frozen" in phase2["mechanism"]
    assert phase2["agg_noise_multiplier"] == pytest.approx(plan.noise_multiplier)  # window 1
    assert trainer.agg_sigma == pytest.approx(plan.noise_multiplier)
    assert plan.sampling_rate == pytest.approx(config["batch_size"] / INFO.n)
    assert plan.epsilon_bound <= 5.0
    # re-accounted independently (dp-accounting PLD): window 1 without conv2* is exactly a
    # Poisson-subsampled Gaussian per release
    accountant = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-3)
    for event in events_to_json(plan.events):
        accountant.compose(
            dp_event.PoissonSampledDpEvent(
                event["sampling_rate"], dp_event.GaussianDpEvent(event["noise_multiplier"])
            ),
            event["steps"],
        )
    assert accountant.get_epsilon(plan.delta) <= plan.epsilon_bound


def test_match_needs_class_aggregates():
    with pytest.raises(UsageError, match="class_aggregates"):
        DPAFMethod().config("tiny", {"g_loss": "match"}, INFO)
    with pytest.raises(UsageError, match="target_decay"):
        DPAFMethod().config("tiny", {**MATCH, "target_decay": "0"}, INFO)


def test_released_sum_holds_class_counts_and_conv2_stays_frozen(one_torch_thread):
    config, _, trainer = _trainer(math.inf)  # no noise: the released sum is exact
    x, y = _digits(40)
    for _ in range(config["c_steps"]):
        trainer.step(x, y)
    conv2 = [p.clone() for p in trainer.conv2_params.values()]
    trainer.step(x, y)  # window 1: every record of the lot is in the one DPAGG step
    blocks = trainer.released_sum.view(10, -1)
    counts = torch.bincount(y, minlength=10).float()
    torch.testing.assert_close(blocks[:, -1] / config["count_feature"], counts)
    trainer.step(x[:10], y[:10])
    counts += torch.bincount(y[:10], minlength=10).float()
    torch.testing.assert_close(
        trainer.released_sum.view(10, -1)[:, -1] / config["count_feature"], counts
    )
    assert all(torch.equal(a, b) for a, b in zip(conv2, trainer.conv2_params.values(), strict=True))


def test_matching_step_reads_only_released_values_and_moves_only_g(one_torch_thread):
    _, _, trainer = _trainer(5.0)
    assert math.isnan(trainer._generator_step())  # nothing released yet: no target
    trainer.released_sum = torch.randn(trainer.rows.dim) + 30.0
    d_before = [p.clone() for p in trainer.features.parameters()]
    g_before = [p.clone() for p in trainer.net_g.parameters()]
    loss = trainer._generator_step()  # takes no data argument
    assert math.isfinite(loss)
    assert all(
        torch.equal(a, b) for a, b in zip(d_before, trainer.features.parameters(), strict=True)
    )
    assert any(
        not torch.equal(a, b) for a, b in zip(g_before, trainer.net_g.parameters(), strict=True)
    )


def test_match_resume_restores_the_released_sum(one_torch_thread):
    _, _, a = _trainer(5.0, seed=9)
    x, y = _digits(30)
    for _ in range(a.c_steps + 2):
        a.step(x, y)
    _, _, b = _trainer(5.0, seed=9)
    b.load_state_tensors(a.state_tensors())
    torch.testing.assert_close(b.released_sum, a.released_sum, rtol=0, atol=0)
    assert b.steps_done == a.steps_done


def straight_and_cut_runs(tmp_path, overrides: dict, cut_after: int, privacy_seed: int):
    """A tiny dpaf digits run at ε = 4 straight through, and the same run cut after
    `cut_after` steps and resumed. Returns (straight summary, cut summary, resumed summary,
    straight checkpoint, resumed checkpoint)."""
    from safetensors.torch import load_file

    from dpsynth.training import train_run

    def run(name: str, **kwargs):
        return train_run(
            method="dpaf",
            data="digits",
            epsilon=4.0,
            preset="tiny",
            overrides=overrides,
            out=tmp_path / name,
            ledger_path=tmp_path / f"{name}.jsonl",
            device="cpu",
            privacy_seed=privacy_seed,
            **kwargs,
        )

    straight = run("straight")
    cut = run("cut", stop_after_steps=cut_after)
    resumed = train_run(
        method="dpaf",
        data="digits",
        epsilon=4.0,
        out=tmp_path / "cut",
        ledger_path=None,
        resume=True,
        device="cpu",
    )
    a = load_file(str(tmp_path / "straight" / "checkpoint.safetensors"))
    b = load_file(str(tmp_path / "cut" / "checkpoint.safetensors"))
    return straight, cut, resumed, a, b


def test_match_run_resumes_exactly_through_the_training_loop(tmp_path, one_torch_thread):
    # cut inside phase 2, with a released sum to restore
    straight, cut, resumed, a, b = straight_and_cut_runs(
        tmp_path, {**MATCH, "windows": 6}, cut_after=4, privacy_seed=77
    )
    assert float(straight["epsilon"]) <= 4.0
    assert cut["interrupted"]
    assert resumed["steps"] == straight["steps"] and resumed["ledger_status"] == "completed"
    assert a.keys() == b.keys() and any("released_sum" in k for k in a)
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=0, msg=key)
