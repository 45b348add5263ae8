"""The typed training request: built once (by the CLI or Python code), checked by the library."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch
from loop_backend import TemplateMethod

from dpsynth.cli.flags import cli_message
from dpsynth.data.engines import EngineChoice
from dpsynth.errors import UsageError
from dpsynth.ledger import Ledger
from dpsynth.methods import registry
from dpsynth.training import TrainRequest, train, train_run


@pytest.fixture(autouse=True)
def template_backend(monkeypatch):
    monkeypatch.setitem(registry._BACKENDS, "templates", "loop_backend:TemplateMethod")
    return TemplateMethod


def _fields(tmp_path) -> dict:
    return dict(
        out=tmp_path / "run", method="templates", data="digits", epsilon=5.0, preset="tiny",
        ledger=tmp_path / "ledger.jsonl", device="cpu", seed=3,
    )  # fmt: skip


def request(tmp_path, **changes) -> TrainRequest:
    return TrainRequest.build(**{**_fields(tmp_path), **changes})


def test_a_request_holds_parsed_fields(tmp_path) -> None:
    made = request(tmp_path, epsilon="inf", classes="a,b", overrides=None, engine="duckdb")
    assert made.privacy.epsilon == math.inf and made.target_epsilon == math.inf
    assert made.images.classes == ("a", "b") and made.backend.overrides == {}
    assert request(tmp_path, epsilon="2.5").privacy.epsilon == 2.5
    # the engine and the device are resolved once, when the request is built
    assert made.table.engine == EngineChoice("duckdb")
    assert made.run.torch_device == torch.device("cpu")
    assert request(tmp_path, memory_budget="4G").table.memory_budget == 4 << 30


def test_a_request_cannot_be_changed_after_it_is_built(tmp_path) -> None:
    made = request(tmp_path)
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.privacy.epsilon = 50.0  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.privacy = made.privacy  # type: ignore[misc]


@pytest.mark.parametrize(
    ("changes", "message", "printed"),
    [
        (
            {"method": None, "data": None},
            "missing method, data (or use resume)",
            "missing --method, --data (or use --resume)",
        ),
        (
            {"epsilon": None},
            "missing epsilon (or use resume)",
            "missing --epsilon (or use --resume)",
        ),
        ({"ledger": None}, "a new run needs a ledger path", "a new run needs a ledger path"),
        (
            {"checkpoint_every_s": -1.0},
            "checkpoint_every_s must be a number of seconds",
            "--checkpoint-every must be a number of seconds",
        ),
        ({"seed": 2**64}, "seed must fit in 64 bits", "--seed must fit in 64 bits"),
        ({"epsilon": "lots"}, "epsilon must be a number or 'inf', got 'lots'", "--epsilon must"),
        (
            {"memory_budget": "lots"},
            "memory_budget 'lots': expected a size in bytes",
            "--memory-budget 'lots': expected a size in bytes",
        ),
        ({"engine": "spark"}, "engine must be one of", "--engine must be one of"),
    ],
)
def test_the_library_refuses_a_bad_request_before_anything_is_written(
    tmp_path, changes, message, printed
) -> None:
    # Parsed and checked once, when built: a request that exists can start.
    with pytest.raises(UsageError) as refused:
        request(tmp_path, **changes)
    # The library names the parameter, never a flag; the CLI prints the flag.
    assert str(refused.value).startswith(message) and "--" not in str(refused.value)
    assert cli_message(refused.value).startswith(printed)
    with pytest.raises(UsageError):
        train_run(**{**_fields(tmp_path), **changes})
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no run dir, no ledger line


def test_a_resumed_run_needs_only_its_directory(tmp_path) -> None:
    TrainRequest.build(out=tmp_path / "run", resume=True).validate()


def test_an_unknown_field_is_refused(tmp_path) -> None:
    with pytest.raises(TypeError, match="ledger_path"):
        TrainRequest.build(**_fields(tmp_path), ledger_path=tmp_path / "other.jsonl")


def test_train_with_a_request_is_train_run_with_keywords(tmp_path) -> None:
    secret = 0x0123456789ABCDEF0123456789ABCDEF
    progress: list[int] = []
    by_request = train(
        request(tmp_path, out=tmp_path / "a", ledger=tmp_path / "a.jsonl", privacy_seed=secret),
        lambda p: progress.append(p.step),
    )
    by_keywords = train_run(
        method="templates", data="digits", epsilon=5.0, preset="tiny", out=tmp_path / "b",
        ledger_path=tmp_path / "b.jsonl", device="cpu", seed=3, privacy_seed=secret,
    )  # fmt: skip
    assert progress and progress[-1] == by_request["steps"] == 12
    for key in ("steps", "epsilon", "noise_multiplier", "sampling_rate", "ledger_status"):
        assert by_request[key] == by_keywords[key], key
    a = json.loads((tmp_path / "a" / "config.json").read_text())
    b = json.loads((tmp_path / "b" / "config.json").read_text())
    assert a["config"] == b["config"] and a["privacy"] == b["privacy"]
    assert [e["kind"] for e in Ledger(tmp_path / "a.jsonl").entries()] == ["spend", "status"]
