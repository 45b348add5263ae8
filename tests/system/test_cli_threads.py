"""`--threads` (and $DPSYNTH_THREADS): the CPU threads a command's numeric work uses, and
`train`'s advice to use one when the machine is already busy."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from dpsynth.cli import app
from dpsynth.cli import train as train_command
from dpsynth.errors import UsageError
from dpsynth.threads import busy_machine_advice, limit_threads

runner = CliRunner()


@pytest.fixture
def restore_threads(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The commands change this process's thread counts and environment: put them back."""
    threads = torch.get_num_threads()
    monkeypatch.delenv("DPSYNTH_THREADS", raising=False)
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):  # registered, so put back as they were
        if name in os.environ:
            monkeypatch.setenv(name, os.environ[name])
        else:  # set then deleted: the undo removes whatever the command sets
            monkeypatch.setenv(name, "unset")
            monkeypatch.delenv(name)
    from threadpoolctl import threadpool_info, threadpool_limits

    pools = {pool["prefix"]: pool["num_threads"] for pool in threadpool_info()}
    yield
    torch.set_num_threads(threads)
    threadpool_limits(limits=pools)  # each BLAS/OpenMP library back to its own count


def _train(tmp_path: Path, *extra: str, env: dict[str, str] | None = None):
    args = [
        "train", "--method", "mst", "--data", "german-credit", "--epsilon", "2",
        "--preset", "tiny", "--out", str(tmp_path / "run"),
        "--ledger", str(tmp_path / "ledger.jsonl"), "--device", "cpu", *extra,
    ]  # fmt: skip
    return runner.invoke(app, args, env=env)


def test_limit_threads_caps_torch_blas_and_the_processes_it_starts() -> None:
    # In a fresh interpreter: torch's and BLAS's pools are per process and set once here.
    code = (
        "import json, os, torch, numpy, threadpoolctl\n"
        "from dpsynth.threads import limit_threads\n"
        "limit_threads(1)\n"
        "print(json.dumps({'torch': torch.get_num_threads(),"
        " 'blas': [p['num_threads'] for p in threadpoolctl.threadpool_info()],"
        " 'omp': os.environ['OMP_NUM_THREADS']}))\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    seen = json.loads(done.stdout)
    assert seen["torch"] == 1
    assert seen["blas"] and set(seen["blas"]) == {1}
    assert seen["omp"] == "1"


def test_limit_threads_refuses_less_than_one() -> None:
    with pytest.raises(UsageError, match="at least 1"):
        limit_threads(0)


@pytest.mark.parametrize("how", ["flag", "environment"])
def test_train_runs_on_the_threads_it_is_given(
    tmp_path: Path, restore_threads: None, how: str
) -> None:
    torch.set_num_threads(2)
    if how == "flag":
        result = _train(tmp_path, "--threads", "1")
    else:
        result = _train(tmp_path, env={"DPSYNTH_THREADS": "1"})
    assert result.exit_code == 0, result.output
    assert torch.get_num_threads() == 1


@pytest.mark.parametrize("command", ["train", "sample", "evaluate", "audit"])
def test_every_compute_command_takes_threads_and_refuses_zero(command: str) -> None:
    result = runner.invoke(app, [command, "--threads", "0"])
    assert result.exit_code == 2
    assert "--threads" in result.stderr


def test_train_advises_one_thread_on_a_busy_machine(
    tmp_path: Path, restore_threads: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch.set_num_threads(2)
    monkeypatch.setattr(os, "getloadavg", lambda: (7.5, 7.0, 6.0))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    # Not on a terminal (a log, a pipeline, these tests): no advice, stderr as on any machine.
    logged = _train(tmp_path / "logged")
    assert logged.exit_code == 0, logged.output
    assert "machine is busy" not in logged.stderr
    monkeypatch.setattr(train_command, "interactive", lambda: True)
    busy = _train(tmp_path)
    assert busy.exit_code == 0, busy.output
    assert "note: the machine is busy (load 7.5 on 2 cores)" in busy.stderr
    assert "--threads 1" in busy.stderr
    assert "--threads 1" not in busy.stdout  # advice is never part of the result

    told = _train(tmp_path / "one", "--threads", "1")
    assert told.exit_code == 0, told.output
    assert "machine is busy" not in told.stderr


def test_busy_machine_advice_only_when_other_work_fills_the_cores() -> None:
    assert busy_machine_advice(2, load=2.0, cores=2) is not None
    assert busy_machine_advice(2, load=1.9, cores=2) is None
    assert busy_machine_advice(1, load=9.0, cores=2) is None  # one thread waits on no other
    assert busy_machine_advice(8, load=4.0, cores=8) is None
