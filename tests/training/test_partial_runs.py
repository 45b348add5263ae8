"""A run whose training did not finish (issue 44, item 6).

`sample` refuses its checkpoint (exit 2, one line, nothing written, no ledger line) unless
`--partial`, and then the manifest and its privacy statement say it is a partial release;
`evaluate` says so too, from the manifest or from a ledger spend that is not completed. The
first SIGINT/SIGTERM while training is told on stderr at once, since the loop stops only after
the step in progress.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from dpsynth.cli import app
from dpsynth.ledger import Ledger
from dpsynth.methods.registry import get_method
from dpsynth.training import train_run
from dpsynth.training.interrupts import deferred_interrupts

runner = CliRunner()
STOPPED = "training stopped at step 1 of 2"
PARTIAL = f"partial release: {STOPPED}"


def _invoke(*args: Any) -> Any:
    return runner.invoke(app, [str(a) for a in args])


def _signal_in_first_step(monkeypatch: pytest.MonkeyPatch, method: str) -> None:
    """The backend's trainer sends this process SIGINT in its first step (a first signal: a
    stop request, honoured after that step)."""
    backend_class = type(get_method(method))
    make_trainer = backend_class.trainer
    fired = {"done": False}

    def trainer(self: Any, *args: Any, **kwargs: Any) -> Any:
        made = make_trainer(self, *args, **kwargs)
        step = made.step

        def signalling_step(x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
            if not fired["done"]:
                fired["done"] = True
                os.kill(os.getpid(), signal.SIGINT)
            return step(x, y)

        made.step = signalling_step
        return made

    monkeypatch.setattr(backend_class, "trainer", trainer)


@pytest.fixture(scope="module")
def table_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """An mst run on german-credit (`tiny`: 2 steps) stopped by SIGINT in its first step
    through the CLI, with `--json`: the notice on stderr, stdout empty, exit 130."""
    base = tmp_path_factory.mktemp("partial-table")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with pytest.MonkeyPatch.context() as patch:
            _signal_in_first_step(patch, "mst")
            trained = _invoke(
                "train", "--method", "mst", "--data", "german-credit", "--epsilon", "2",
                "--preset", "tiny", "--out", base / "run", "--ledger", base / "ledger.jsonl",
                "--device", "cpu", "--checkpoint-every", "0", "--json",
            )  # fmt: skip
    finally:
        torch.set_num_threads(threads)
    return {"base": base, "run": base / "run", "ledger": base / "ledger.jsonl", "train": trained}


def test_the_first_signal_is_told_at_once_on_stderr_and_never_on_stdout(
    table_run: dict[str, Any],
) -> None:
    trained = table_run["train"]
    assert trained.exit_code == 130, trained.output
    assert "SIGINT: stopping after the step in progress (0 of 2 done)" in trained.stderr
    assert "a second signal stops at once; the spend stays counted" in trained.stderr
    assert trained.stdout == ""  # --json: no document for an interrupted run, and no notice
    state = json.loads((table_run["run"] / "state.json").read_text())
    assert state["step"] == 1
    assert Ledger(table_run["ledger"]).spend(0)["status"] == "reserved"


def test_sample_refuses_an_unfinished_table_run_and_writes_nothing(
    table_run: dict[str, Any],
) -> None:
    run, ledger, out = table_run["run"], table_run["ledger"], table_run["base"] / "refused.csv"
    before = ledger.read_bytes()
    result = _invoke("sample", run, "--n", "50", "--out", out, "--ledger", ledger)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and STOPPED in lines[0]
    assert f"dpsynth train --resume --out {run}" in lines[0] and "--partial" in lines[0]
    assert not out.exists() and not out.with_name(out.name + ".manifest.json").exists()
    assert ledger.read_bytes() == before  # no release line, nothing spent


def test_partial_table_sample_says_so_and_evaluate_repeats_it(table_run: dict[str, Any]) -> None:
    run, ledger, out = table_run["run"], table_run["ledger"], table_run["base"] / "partial.csv"
    result = _invoke(
        "sample", run, "--n", "50", "--out", out, "--ledger", ledger, "--partial", "--json"
    )
    assert result.exit_code == 0, result.output
    manifest = json.loads(out.with_name(out.name + ".manifest.json").read_text())
    assert PARTIAL in manifest["privacy"]
    # The ε stated is the run's whole reservation: a reserved spend counts in full.
    spend = Ledger(ledger).spend(0)
    assert manifest["privacy_source"]["status"] == "reserved"
    assert manifest["privacy_source"]["epsilon"] == pytest.approx(spend["reserved_epsilon"])
    assert len(out.read_text().splitlines()) == 51
    evaluated = _invoke(
        "evaluate", "--synthetic", out, "--real", "german-credit:test", "--metrics",
        "marginals", "--ledger", ledger, "--json",
    )  # fmt: skip
    assert evaluated.exit_code == 0, evaluated.output
    assert PARTIAL in json.loads(evaluated.stdout)["privacy"]


def _table_statement(synthetic: Path, ledger: Path) -> str:
    evaluated = _invoke(
        "evaluate", "--synthetic", synthetic, "--real", "german-credit:test", "--metrics",
        "marginals", "--ledger", ledger, "--json",
    )  # fmt: skip
    assert evaluated.exit_code == 0, evaluated.output
    return str(json.loads(evaluated.stdout)["privacy"])


def test_evaluate_says_unfinished_from_the_ledger_and_keeps_partial_after_a_resume(
    table_run: dict[str, Any],
) -> None:
    # The last test on the table run: it resumes the run to its end.
    run, ledger, base = table_run["run"], table_run["ledger"], table_run["base"]
    early, kept = base / "early.csv", base / "kept.csv"
    for out in (early, kept):
        sampled = _invoke("sample", run, "--n", "20", "--out", out, "--ledger", ledger, "--partial")
        assert sampled.exit_code == 0, sampled.output
    # A sample that a dpsynth before --partial drew: its manifest says nothing of the steps,
    # but the run's spend is still reserved in the ledger.
    manifest_path = early.with_name(early.name + ".manifest.json")
    old = json.loads(manifest_path.read_text())
    old["privacy"] = plain = old["privacy"].split("; partial release")[0]
    manifest_path.write_text(json.dumps(old))
    assert _table_statement(early, ledger) == (
        f"{plain}; from an unfinished run: its ledger spend is reserved, not completed (the ε "
        "is the run's whole reserved spend, which counts in full)"
    )
    # Resumed to the end, the run samples without --partial; the sample drawn at step 1 of 2
    # stays partial (its manifest says so), though the spend is now completed.
    resumed = _invoke("train", "--out", run, "--resume", "--device", "cpu", "--json")
    assert resumed.exit_code == 0, resumed.output
    assert Ledger(ledger).spend(0)["status"] == "completed"
    whole = base / "whole.csv"
    finished = _invoke("sample", run, "--n", "20", "--out", whole, "--ledger", ledger, "--json")
    assert finished.exit_code == 0, finished.output
    assert "partial" not in json.loads(finished.stdout)["privacy"]
    assert PARTIAL in _table_statement(kept, ledger)
    statement = _table_statement(whole, ledger)
    assert "unfinished" not in statement and "partial" not in statement


@pytest.fixture(scope="module")
def image_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A dpkernel run on digits (`tiny`, 4 steps) stopped after 2 of them."""
    base = tmp_path_factory.mktemp("partial-images")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        stopped = train_run(
            method="dpkernel", data="digits", epsilon=5, preset="tiny", out=base / "run",
            ledger_path=base / "ledger.jsonl", device="cpu", overrides={"steps": 4},
            stop_after_steps=2, checkpoint_every_s=0,
        )  # fmt: skip
    finally:
        torch.set_num_threads(threads)
    assert stopped["interrupted"] and (stopped["steps"], stopped["total_steps"]) == (2, 4)
    return {"base": base, "run": base / "run", "ledger": base / "ledger.jsonl"}


def test_sample_refuses_an_unfinished_image_run_and_partial_releases_it(
    image_run: dict[str, Path],
) -> None:
    run, ledger, base = image_run["run"], image_run["ledger"], image_run["base"]
    before = ledger.read_bytes()
    refused = _invoke("sample", run, "--n", "12", "--out", base / "no", "--ledger", ledger)
    assert refused.exit_code == 2, refused.output
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and "training stopped at step 2 of 4" in lines[0]
    assert not (base / "no").exists() and ledger.read_bytes() == before
    released = _invoke(
        "sample", run, "--n", "12", "--out", base / "yes", "--ledger", ledger, "--partial",
        "--device", "cpu",
    )  # fmt: skip
    assert released.exit_code == 0, released.output
    assert "partial release: training stopped at step 2 of 4" in released.stdout
    manifest = json.loads((base / "yes" / "manifest.json").read_text())
    assert manifest["training"] == {"steps": 2, "total_steps": 4, "partial": True}
    assert "partial release: training stopped at step 2 of 4" in manifest["privacy"]
    assert len(list((base / "yes").glob("*/*.png"))) == 12
    releases = [e for e in Ledger(ledger).entries() if e["kind"] == "release"]
    assert len(releases) == 1 and releases[0]["events"] == []  # zero cost, as any sample


def test_evaluate_of_an_unfinished_image_run_or_its_sample_says_so(
    image_run: dict[str, Path],
) -> None:
    run, ledger, base = image_run["run"], image_run["ledger"], image_run["base"]
    common = ["--real", "digits:test", "--metrics", "accuracy", "--classifier", "logreg"]
    common += ["--seeds", "1", "--ledger", str(ledger), "--device", "cpu", "--json"]
    from_run = _invoke("evaluate", "--synthetic", run, "--n", "50", *common)
    assert from_run.exit_code == 0, from_run.output
    result = json.loads(from_run.stdout)
    assert "partial release: training stopped at step 2 of 4" in result["privacy"]["statement"]
    assert any("unfinished run" in w for w in result["warnings"])
    folder = base / "evaluated"
    sampled = _invoke(
        "sample", run, "--n", "30", "--out", folder, "--ledger", ledger, "--partial",
        "--device", "cpu",
    )  # fmt: skip
    assert sampled.exit_code == 0, sampled.output
    from_folder = _invoke("evaluate", "--synthetic", folder, *common)
    assert from_folder.exit_code == 0, from_folder.output
    warnings = json.loads(from_folder.stdout)["warnings"]
    assert any("step 2 of 4" in w and "unfinished run" in w for w in warnings)


def test_the_request_callback_runs_once_and_cannot_break_the_step() -> None:
    before = (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM))
    told: list[int] = []

    def on_request(signum: int) -> None:
        told.append(signum)
        raise RuntimeError("a stream written from inside the handler")

    with deferred_interrupts(on_request) as interrupts:
        os.kill(os.getpid(), signal.SIGTERM)
        assert interrupts.requested and told == [signal.SIGTERM]  # the error was dropped
        with pytest.raises(KeyboardInterrupt, match="second signal"):
            os.kill(os.getpid(), signal.SIGTERM)
        assert told == [signal.SIGTERM]
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


def test_the_stop_notice_goes_to_stderr_and_not_at_all_when_quiet(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from dpsynth.cli.render import TrainProgressView
    from dpsynth.training.progress import StopNotice

    notice = StopNotice("SIGTERM", 5, 7)
    TrainProgressView(None, tell_stops=False).on_stop_request(notice)
    assert capsys.readouterr() == ("", "")  # --quiet: the interruption's last line only
    TrainProgressView(None).on_stop_request(notice)
    told = capsys.readouterr()
    assert told.out == ""
    assert told.err.startswith("SIGTERM: stopping after the step in progress (5 of 7 done)")
