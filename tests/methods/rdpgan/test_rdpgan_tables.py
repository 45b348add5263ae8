"""RDP-GAN on tables: the CLI round trip on german-credit, and the table path's privacy."""

from __future__ import annotations

import functools
import json
from collections import Counter

import pandas as pd
import torch
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant
from torch.nn import functional as F
from typer.testing import CliRunner

from dpsynth.cli import app
from dpsynth.data.builtin_tables import TABLES_DIR
from dpsynth.data.schema_file import parse_schema
from dpsynth.data.sources import load_table, read_table
from dpsynth.data.table_codec import block_layout, encode_table, read_csv_table
from dpsynth.ledger import Ledger
from dpsynth.methods.base import PrivacyTarget
from dpsynth.methods.blocks import TableHead
from dpsynth.methods.rdpgan import RDPGANMethod
from dpsynth.methods.rdpgan.trainer import RDPGANTrainer
from dpsynth.privacy.mechanisms.randomness import PrivateRandomness

runner = CliRunner()


@functools.lru_cache
def _german():
    return load_table("german-credit")


def _trainer(epsilon: float = 2.0, info=None, **overrides) -> RDPGANTrainer:
    info = info or _german().info()
    method = RDPGANMethod()
    config = method.config("tiny", overrides, info)
    method.validate_config(config, info)
    plan = method.plan(info, PrivacyTarget(epsilon, 1e-5), config)
    return RDPGANTrainer(info, config, plan, torch.device("cpu"), 0, PrivateRandomness(3))


def _pld_epsilon(events: list[dict], delta: float) -> float:
    accountant = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-3)
    for event in events:
        accountant.compose(
            dp_event.PoissonSampledDpEvent(
                event["sampling_rate"], dp_event.GaussianDpEvent(event["noise_multiplier"])
            ),
            event["steps"],
        )
    return accountant.get_epsilon(delta)


def test_cli_train_sample_csv_evaluate_on_german_credit(tmp_path, one_torch_thread):
    ledger = tmp_path / "ledger.jsonl"
    train = runner.invoke(
        app,
        ["train", "--method", "rdpgan", "--data", "german-credit", "--epsilon", "1",
         "--preset", "tiny", "--out", str(tmp_path / "run"), "--ledger", str(ledger),
         "--device", "cpu", "--json"],
    )  # fmt: skip
    assert train.exit_code == 0, train.output
    result = json.loads(train.stdout)
    assert result["private"] and float(result["epsilon"]) <= 1.0
    spend = Ledger(ledger).spend(result["ledger_seq"])
    assert spend["status"] == "completed" and float(spend["epsilon"]) <= 1.0
    assert _pld_epsilon(spend["events"], spend["delta"]) <= float(spend["epsilon"])
    out = tmp_path / "synth.csv"
    sample = runner.invoke(
        app,
        ["sample", str(tmp_path / "run"), "--n", "200", "--out", str(out), "--ledger",
         str(ledger), "--device", "cpu", "--json"],
    )  # fmt: skip
    assert sample.exit_code == 0, sample.output
    header = (TABLES_DIR / "german_credit.csv").read_text().splitlines()[0]
    assert out.read_text().splitlines()[0] == header
    frame = pd.read_csv(out, dtype=str)
    assert len(frame) == 200
    schema = read_table("german-credit")[2]
    for column in schema.columns:
        if column.type == "categorical":
            assert set(frame[column.name]) <= set(column.categories), column.name
        else:
            values = frame[column.name].astype(float)
            assert values.between(column.min, column.max).all(), column.name
    assert Counter(frame["credit_risk"]) == {"1": 100, "2": 100}  # balanced labels
    evaluated = runner.invoke(
        app,
        ["evaluate", "--synthetic", str(out), "--real", "german-credit:test", "--metrics", "ml",
         "--seeds", "1", "--ledger", str(ledger), "--json"],
    )  # fmt: skip
    assert evaluated.exit_code == 0, evaluated.output
    scores = json.loads(evaluated.stdout)["metrics"]["classifiers"]
    assert 0.0 <= scores["logreg"]["roc_auc"]["mean"] <= 1.0


def test_table_generator_ends_in_the_table_head(one_torch_thread):
    trainer = _trainer()
    rows, _ = trainer._fakes(32)
    layout = block_layout(trainer.info)
    assert rows.shape == (32, trainer.info.shape[0])
    start = 0
    for kind, size in layout:
        part = rows[:, start : start + size]
        if kind == "softmax":
            torch.testing.assert_close(part.sum(1), torch.ones(32))
            assert (part >= 0).all()
        else:
            assert (part.abs() <= 1).all()
        start += size
    sampled = next(trainer.generator().sample(torch.tensor([0, 1, 1]), 8, torch.Generator()))
    assert sampled.dtype == torch.float32 and sampled.shape == (3, trainer.info.shape[0])


def test_table_head_reads_each_block_from_its_own_outputs():
    head = TableHead((("tanh", 1), ("softmax", 2), ("tanh", 1)))
    raw = torch.tensor([[0.5, 0.0, 10.0, -0.25]])
    out = head(raw)
    torch.testing.assert_close(out[0, 0], torch.tanh(torch.tensor(0.5)))
    torch.testing.assert_close(out[0, 1:3], torch.softmax(torch.tensor([0.0, 10.0]), 0))
    torch.testing.assert_close(out[0, 3], torch.tanh(torch.tensor(-0.25)))


def test_table_real_term_is_clipped_and_the_only_private_input(one_torch_thread):
    data = _german()
    x, y = data.x[:40], data.y[:40]
    # Per-record clip: one record moves D's real-term sum by at most C (σ = 0).
    trainer = _trainer()
    with torch.no_grad():
        for p in trainer.net_d.parameters():
            p.mul_(4.0)
    trainer.private_d.noise_multiplier = 0.0
    stats = trainer.private_d.compute(x[:1], F.one_hot(y[:1], 2).float())
    m, clip = trainer.plan.expected_batch_size, trainer.plan.max_grad_norm
    flat = torch.cat([p.grad.flatten() * m for p in trainer.net_d.parameters()])
    assert stats["clip_fraction"] == 1.0 and float(flat.norm()) <= clip * (1 + 1e-5)
    # With D frozen, G's update is the same whatever the private batch (post-processing).
    after = []
    for batch in (slice(0, 20), slice(20, 40)):
        trainer = _trainer(n_d="1")
        trainer.opt_d.param_groups[0]["lr"] = 0.0
        trainer.step(x[batch], y[batch])
        after.append(torch.cat([p.detach().flatten() for p in trainer.net_g.parameters()]))
    assert torch.equal(*after)


def test_generated_labels_follow_the_declared_public_weights(one_torch_thread):
    raw = read_csv_table(TABLES_DIR / "german_credit.csv")
    bundled = read_table("german-credit")[2].to_json()
    bundled["columns"][-1]["weights"] = [0.9, 0.1]
    info = encode_table(raw, parse_schema(bundled), "g", "csv").info()
    trainer = _trainer(info=info)
    _, onehot = trainer._fakes(4000)
    share = float(onehot[:, 1].mean())
    assert abs(share - 0.1) < 0.02
    _, uniform = _trainer()._fakes(4000)
    assert abs(float(uniform[:, 1].mean()) - 0.5) < 0.04


def test_tables_need_the_mlp(tmp_path):
    result = runner.invoke(
        app,
        ["train", "--method", "rdpgan", "--data", "german-credit", "--epsilon", "1",
         "--preset", "tiny", "--set", "arch=conv", "--out", str(tmp_path / "run"),
         "--ledger", str(tmp_path / "l.jsonl")],
    )  # fmt: skip
    assert result.exit_code == 2 and "arch=mlp" in result.output
    assert not (tmp_path / "l.jsonl").exists() or not Ledger(tmp_path / "l.jsonl").entries()
