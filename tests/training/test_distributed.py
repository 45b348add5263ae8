"""Data-parallel training (torchrun, gloo on the CPU, 2 processes) is the mechanism of one
process: the same plan and ledger entry, the same clipped sums, one noise draw of std σC,
identical models on every rank, and a rank lost mid-run leaves the spend counted.

The mechanism checks run in 2 spawned gloo processes (`ddp_worker.run`) and are compared with
the same code run in this process without a group; the CLI checks launch `torchrun`.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import ddp_worker
import pytest
import torch
import torch.multiprocessing as mp

from dpsynth.ledger import Ledger
from dpsynth.training import train_run

ROOT = Path(__file__).resolve().parents[2]
TORCHRUN = Path(sys.executable).with_name("torchrun")
BACKENDS = ("psg", "pge", "dpaf", "dpkernel")

pytestmark = pytest.mark.skipif(
    not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
    reason="needs torch.distributed with gloo",
)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """(each rank's `ddp_worker.checks()` under a 2-process gloo group, the same checks in this
    process without a group), computed side by side."""
    out = tmp_path_factory.mktemp("ddp")
    context = mp.start_processes(
        ddp_worker.run,
        args=(2, _free_port(), str(out)),
        nprocs=2,
        start_method="spawn",
        join=False,
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        reference = ddp_worker.checks()
    finally:
        torch.set_num_threads(threads)
    while not context.join():
        pass
    ranks = [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]
    return ranks, reference


@pytest.fixture(scope="module")
def ranks(results):
    return results[0]


@pytest.fixture(scope="module")
def reference(results):
    return results[1]


def _close(a, b):
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            _close(a[key], b[key])
    elif isinstance(a, torch.Tensor):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    else:
        assert a == pytest.approx(b, rel=1e-6, nan_ok=True)


def _equal(a, b):
    if isinstance(a, dict):
        for key in a:
            _equal(a[key], b[key])
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b)
    else:
        assert a == b or (a != a and b != b)


@pytest.mark.parametrize(
    "check", ["clipped_sum", "dpsgd", "nonprivate", "clipped_sum_ghost", "dpsgd_ghost"]
)
def test_dpsgd_step_equals_one_process_on_the_same_batch(ranks, reference, check):
    # σ = 0: the summed clipped gradient / qN; σ > 0 with the same stream: the same noise
    # draw, added once (twice would double it, never would drop it); and the stats.
    for rank in ranks:
        _close(rank[check], reference[check])
    _equal(ranks[0][check], ranks[1][check])  # every rank gets the same released gradient


def test_the_noise_on_the_global_sum_has_std_sigma_c(ranks, reference):
    noise = ranks[0]["noise"]
    expected = ddp_worker.NOISE["sigma"] * ddp_worker.NOISE["clip"]
    # 10,100 draws: the std's relative error is ~0.7 %; added on both ranks it would be 2σC
    assert noise.std().item() == pytest.approx(expected, rel=0.03)
    assert abs(noise.mean().item()) < 4 * expected / noise.numel() ** 0.5
    torch.testing.assert_close(noise, reference["noise"])  # the one draw of one process
    assert torch.equal(ranks[0]["noise"], ranks[1]["noise"])


@pytest.mark.parametrize("check", ["dpaf_mechanisms", "dpkernel_mechanism"])
def test_sharded_aggregation_and_functional_mechanisms(ranks, reference, check):
    for rank in ranks:
        _close(rank[check], reference[check])
    _equal(ranks[0][check], ranks[1][check])


@pytest.mark.parametrize("method", BACKENDS)
def test_backend_steps_equal_one_process_and_ranks_stay_identical(ranks, reference, method):
    _equal(ranks[0][method], ranks[1][method])
    # The sums differ from one process's by rounding only; Adam's first steps turn a gradient
    # that is ~0 (DPAF's generator biases before a normalisation) into ±lr, so up to lr=2e-4.
    atol = 2e-4 if method == "dpaf" else 1e-5
    for name, value in reference[method].items():
        if value.is_floating_point():
            torch.testing.assert_close(ranks[0][method][name], value, rtol=1e-4, atol=atol)
        else:
            assert torch.equal(ranks[0][method][name], value), name


def test_diverged_ranks_are_caught_on_every_rank(ranks):
    assert [rank["agreement"] for rank in ranks] == [{"caught_mismatch": True}] * 2


def test_launch_from_torchrun_environment(monkeypatch):
    from dpsynth.distributed import _device, is_main_process, launch_from_env
    from dpsynth.errors import UsageError

    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    assert launch_from_env() is None and is_main_process()  # one process: as always
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_RANK", "1")
    launch = launch_from_env()
    assert (launch.rank, launch.world_size, launch.local_rank) == (3, 4, 1)
    assert not launch.is_main and not is_main_process()
    assert _device(launch, "cpu") == torch.device("cpu")
    with pytest.raises(UsageError, match="cuda:LOCAL_RANK"):
        _device(launch, "cuda:0")  # each rank's GPU is its LOCAL_RANK's
    if not torch.cuda.is_available():
        assert _device(launch, "auto") == torch.device("cpu")
        with pytest.raises(UsageError):
            _device(launch, "cuda")
    monkeypatch.setenv("RANK", "4")
    with pytest.raises(UsageError, match="does not fit"):
        launch_from_env()


def _torchrun(*args: str, script: str | None = None, env: dict[str, str] | None = None):
    program = [sys.executable, str(ROOT / "tests" / script)] if script else [
        sys.executable, "-m", "dpsynth.cli",
    ]  # fmt: skip
    command = [
        str(TORCHRUN), "--nproc-per-node", "2", "--master-port", str(_free_port()),
        "--no-python", *program, *args,
    ]  # fmt: skip
    environment = {
        **os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **(env or {}),
    }  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, env=environment, timeout=300)


def _train_args(out: Path, ledger: Path) -> list[str]:
    return [
        "train", "--method", "psg", "--data", "digits", "--epsilon", "4", "--preset", "tiny",
        "--out", str(out), "--ledger", str(ledger), "--device", "cpu", "--seed", "3",
    ]  # fmt: skip


def _comparable(entry: dict) -> dict:
    drop = {"seq", "time", "run_id", "hash", "prev_hash"}
    return {k: v for k, v in entry.items() if k not in drop}


@pytest.mark.skipif(not TORCHRUN.exists(), reason="torchrun not installed beside python")
def test_torchrun_killed_rank_stays_counted_and_resume_spends_what_one_process_does(
    tmp_path, one_torch_thread
):
    # One torchrun launch loses rank 1 (SIGKILL at its 4th batch), a second resumes the run
    # under torchrun; the result must be the plan and ledger of one process's run.
    run, ledger = tmp_path / "ddp", tmp_path / "ddp.jsonl"
    killed = _torchrun(
        *_train_args(run, ledger), "--checkpoint-every", "0", "--quiet",
        script="ddp_kill.py", env={"KILL_RANK": "1", "KILL_AT": "4"},
    )  # fmt: skip
    assert killed.returncode != 0
    book = Ledger(ledger)
    entries = book.entries()
    assert [e["kind"] for e in entries] == ["spend"] and entries[0]["status"] == "reserved"
    config = json.loads((run / "config.json").read_text())
    assert config["launch"] == {"world_size": 2}
    # counted in full: the dataset's total is this run's planned ε
    planned = config["privacy"]
    assert book.total_epsilon("digits", planned["delta"]) >= planned["epsilon_bound"] - 1e-9
    state = json.loads((run / "state.json").read_text())
    assert 1 <= state["step"] <= 3  # checkpointed before the kill at the 4th batch

    resumed = _torchrun("train", "--resume", "--out", str(run), "--json")
    assert resumed.returncode == 0, resumed.stderr
    result = json.loads(resumed.stdout)  # one JSON document: only rank 0 writes to stdout
    assert result["steps"] == result["total_steps"] and result["ledger_status"] == "completed"

    # the same ledger key, so that the keyed data fingerprints of both ledgers compare equal
    shutil.copy(ledger.with_name(ledger.name + ".key"), tmp_path / "one.jsonl.key")
    single = train_run(
        method="psg", data="digits", epsilon=4, preset="tiny", out=tmp_path / "one",
        ledger_path=tmp_path / "one.jsonl", device="cpu", seed=3,
    )  # fmt: skip
    one_config = json.loads((tmp_path / "one" / "config.json").read_text())
    assert config["privacy"] == one_config["privacy"]
    assert result["epsilon"] == single["epsilon"]
    ddp_entries = Ledger(ledger).entries()
    one_entries = Ledger(tmp_path / "one.jsonl").entries()
    assert [e["kind"] for e in ddp_entries] == ["spend", "status"]  # charged once
    assert [_comparable(e) for e in ddp_entries] == [_comparable(e) for e in one_entries]


def test_other_commands_refuse_several_torchrun_processes(monkeypatch, tmp_path):
    from typer.testing import CliRunner

    from dpsynth.cli import app

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    ledger = str(tmp_path / "ledger.jsonl")
    result = CliRunner().invoke(app, ["ledger", "show", "--ledger", ledger])
    assert result.exit_code == 2
    assert "only `dpsynth train` runs under torchrun" in result.output
    monkeypatch.setenv("WORLD_SIZE", "1")  # one process under torchrun: as usual
    assert CliRunner().invoke(app, ["ledger", "show", "--ledger", ledger]).exit_code == 0
