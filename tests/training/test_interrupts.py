"""A training step is all or nothing under interrupts (issue 26, leak 1).

Every draw a mechanism makes from the run's secret streams (Poisson batches, Gaussian noise,
a one-off release) is recorded by its digest. A run cut inside a step and resumed must make
exactly the draws of the same run left alone: replaying a step from the saved streams repeats
draws (same digests), a fresh draw would be a release the ledger does not count.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from dpsynth.ledger import Ledger
from dpsynth.methods.registry import get_method, method_names
from dpsynth.privacy.mechanisms.randomness import PrivateRandomness
from dpsynth.training import train_run
from dpsynth.training.interrupts import TrainingInterrupted, deferred_interrupts

DRAWS = ("randn", "rand", "randint", "randperm", "normal", "bernoulli", "multinomial")
IMAGE_METHODS = [m for m in method_names() if "image" in get_method(m).modalities]


class SecretDraws:
    """Digests of every draw made from a generator that `PrivateRandomness` handed out."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.generators: list[torch.Generator] = []  # kept alive, so ids stay unique
        self.digests: list[str] = []
        original_generator = PrivateRandomness.generator

        def generator(randomness: PrivateRandomness, *args: Any, **kwargs: Any) -> torch.Generator:
            made = original_generator(randomness, *args, **kwargs)
            self.generators.append(made)
            return made

        monkeypatch.setattr(PrivateRandomness, "generator", generator)
        for name in DRAWS:
            monkeypatch.setattr(torch, name, self._recording(name, getattr(torch, name)))

    def _recording(self, name: str, original: Any) -> Any:
        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            out = original(*args, **kwargs)
            generator = kwargs.get("generator")
            if any(generator is g for g in self.generators):
                data = out.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()
                self.digests.append(f"{name}:{hashlib.sha256(data.tobytes()).hexdigest()}")
            return out

        return wrapper

    def take(self) -> list[str]:
        """The digests recorded so far, and a fresh start."""
        taken, self.digests = self.digests, []
        return taken


def _cut_inside_step(monkeypatch: pytest.MonkeyPatch, method: str, at: int, how: str) -> None:
    """Make the backend's trainer end its step number `at` (0-based) after the private
    update: by raising KeyboardInterrupt there (an exception inside a step, or a second
    signal), or by sending this process SIGINT there (a first signal: a stop request)."""
    backend_class = type(get_method(method))
    make_trainer = backend_class.trainer
    done = {"fired": False}

    def trainer(self: Any, *args: Any, **kwargs: Any) -> Any:
        made = make_trainer(self, *args, **kwargs)
        step = made.step
        calls = [0]

        def cut_step(x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
            stats = step(x, y)
            calls[0] += 1
            if calls[0] == at + 1 and not done["fired"]:
                done["fired"] = True
                if how == "exception":
                    raise KeyboardInterrupt
                os.kill(os.getpid(), signal.SIGINT)
            return stats

        made.step = cut_step
        return made

    monkeypatch.setattr(backend_class, "trainer", trainer)


def _train(tmp_path: Path, name: str, method: str, overrides: dict, **kwargs: Any) -> dict:
    return train_run(
        method=method, data="digits", epsilon=5, preset="tiny", out=tmp_path / name,
        ledger_path=tmp_path / f"{name}.jsonl", device="cpu", seed=0, privacy_seed=1234,
        overrides=overrides, **kwargs,
    )  # fmt: skip


def _straight_and_cut(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, method: str, overrides: dict, at: int, how: str
) -> tuple[list[str], list[str], Path, Path]:
    draws = SecretDraws(monkeypatch)
    straight = _train(tmp_path, "straight", method, overrides)
    straight_draws = draws.take()
    _cut_inside_step(monkeypatch, method, at, how)
    expected = TrainingInterrupted if how == "signal" else KeyboardInterrupt
    with pytest.raises(expected):
        _train(tmp_path, "cut", method, overrides, checkpoint_every_s=0)
    resumed = train_run(
        method=method, data="digits", epsilon=5, out=tmp_path / "cut", ledger_path=None,
        device="cpu", resume=True,
    )  # fmt: skip
    assert resumed["steps"] == straight["steps"] == straight["total_steps"]
    return straight_draws, draws.take(), tmp_path / "straight", tmp_path / "cut"


def _weights(run: Path) -> dict[str, torch.Tensor]:
    return load_file(str(run / "checkpoint.safetensors"))


# Short runs: a few steps are enough to cut one in the middle.
SHORT = {"pge": {"steps": 6}}
# The step each backend is cut in: the second, or for freq (one loop step, its release made
# before it) the only one, which a resume replays with the release.
CUT_AT = {"freq": 0}
# DPAF's phase 2 as one release (tiny: phase 1 is steps 0-1, the release comes before step 2).
DPAF_ONCE = {
    "g_loss": "match", "class_aggregates": True, "train_conv2": False, "window": 1,
    "g_batch": 20, "phase2_release": "once", "windows": 4,
}  # fmt: skip
CASES = [
    *[pytest.param(m, SHORT.get(m, {}), CUT_AT.get(m, 1), id=m) for m in IMAGE_METHODS],
    # the one-off whole-data release, cut in the generator step that follows it
    pytest.param("dpaf", DPAF_ONCE, 2, id="dpaf-once"),
    # the central-images warm start released before step 1, cut in step 1
    pytest.param(
        "dpkernel", {"warm_start_share": 0.3, "warm_start_steps": 5}, 0, id="dpkernel-warm-start"
    ),
]


@pytest.mark.parametrize(("method", "overrides", "at"), CASES)
def test_an_exception_inside_a_step_leaves_no_half_step_to_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, method: str, overrides: dict, at: int
) -> None:
    straight, cut, straight_run, cut_run = _straight_and_cut(
        tmp_path, monkeypatch, method, overrides, at, "exception"
    )
    # The resumed run replayed the lost step from the saved streams: every draw it made is
    # one the uninterrupted run made, and it made them all.
    assert set(cut) == set(straight)
    assert len(cut) > len(straight)  # the lost step was really drawn twice (a replay)
    a, b = _weights(straight_run), _weights(cut_run)
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize("method", ["dpaf", "rdpgan"])
def test_a_signal_inside_a_step_stops_at_the_boundary_with_a_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, method: str
) -> None:
    overrides = DPAF_ONCE if method == "dpaf" else {}
    straight, cut, straight_run, cut_run = _straight_and_cut(
        tmp_path, monkeypatch, method, overrides, 2, "signal"
    )
    # The step in which the signal came finished and was checkpointed: nothing is replayed.
    assert cut == straight
    for name, tensor in _weights(straight_run).items():
        torch.testing.assert_close(tensor, _weights(cut_run)[name], msg=name)


def test_the_interrupted_spend_stays_reserved_until_the_resumed_run_completes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _cut_inside_step(monkeypatch, "rdpgan", 1, "signal")
    with pytest.raises(TrainingInterrupted, match="--resume"):
        _train(tmp_path, "run", "rdpgan", {})
    assert Ledger(tmp_path / "run.jsonl").spend(0)["status"] == "reserved"
    train_run(
        method="rdpgan", data="digits", epsilon=5, out=tmp_path / "run", ledger_path=None,
        device="cpu", resume=True,
    )  # fmt: skip
    assert Ledger(tmp_path / "run.jsonl").spend(0)["status"] == "completed"


def test_the_first_signal_is_a_request_and_the_second_stops_at_once() -> None:
    # What was in place before (Python's default_int_handler, or SIG_IGN when the suite runs
    # as a background job of a non-interactive shell, which starts with SIGINT ignored).
    before = (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM))
    with deferred_interrupts() as interrupts:
        assert not interrupts.requested
        os.kill(os.getpid(), signal.SIGTERM)
        assert interrupts.requested and interrupts.signum == signal.SIGTERM
        with pytest.raises(KeyboardInterrupt, match="second signal"):
            os.kill(os.getpid(), signal.SIGINT)
    # the handlers in place before are back
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
    assert before[0] in (signal.default_int_handler, signal.SIG_IGN)


def test_real_signals_at_random_times_then_resume_give_the_straight_run(
    tmp_path: Path, one_torch_thread: None
) -> None:
    """`dpsynth train` as a process, sent SIGINT at random moments of its loop and resumed
    each time: the finished run equals a straight run from the same secret, so no step was
    ever released twice with fresh noise. The straight run uses one torch thread like the
    processes (OMP_NUM_THREADS=1): with another thread count the float round-off differs from
    the first step on, and 120 steps of training can grow it past the tolerance."""
    run, ledger = tmp_path / "run", tmp_path / "ledger.jsonl"
    cli = [sys.executable, "-c", "from dpsynth.cli import main; main()", "train"]
    new = [
        "--method", "dpkernel", "--data", "digits", "--epsilon", "5", "--preset", "tiny",
        "--set", "steps=120", "--ledger", str(ledger),
    ]  # fmt: skip
    common = ["--out", str(run), "--device", "cpu", "--checkpoint-every", "0", "--quiet"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    pace = random.Random(2026)
    interrupted = 0
    for attempt in range(4):
        resume = (run / "private" / "secret.json").is_file()
        args = [*cli, *common, *(["--resume"] if resume else new)]
        process = subprocess.Popen(args, env=env, stderr=subprocess.PIPE, text=True)
        if attempt < 3:  # the last attempt runs to the end
            deadline = time.monotonic() + 120
            log = run / "train-log.jsonl"
            logged = len(log.read_text().splitlines()) if log.is_file() else 0
            while process.poll() is None and time.monotonic() < deadline:
                if log.is_file() and len(log.read_text().splitlines()) > logged:
                    break  # this process is in its loop
                time.sleep(0.02)
            time.sleep(pace.uniform(0.0, 0.4))
            process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=300)
        if process.returncode == 130:
            interrupted += 1
            assert "interrupted" in err and "--resume" in err, err
            assert err.count("\n") == 1, err  # one line, no traceback
        else:
            assert process.returncode == 0, err
            break
    assert interrupted >= 1
    secret = int(json.loads((run / "private" / "secret.json").read_text())["secret"], 16)
    straight = train_run(
        method="dpkernel", data="digits", epsilon=5, preset="tiny", out=tmp_path / "straight",
        ledger_path=tmp_path / "straight.jsonl", device="cpu", privacy_seed=secret,
        overrides={"steps": 120},
    )  # fmt: skip
    assert Ledger(ledger).spend(0)["status"] == "completed"
    assert (
        Ledger(ledger).spend(0)["events"] == Ledger(tmp_path / "straight.jsonl").spend(0)["events"]
    )
    assert straight["steps"] == 120
    a, b = _weights(tmp_path / "straight"), _weights(run)
    for name in a:  # bit for bit: the same draws and the same arithmetic on one thread
        torch.testing.assert_close(b[name], a[name], rtol=0, atol=0, msg=name)
