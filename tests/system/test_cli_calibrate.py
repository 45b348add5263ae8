"""`dpsynth calibrate` and `dpsynth data` as a user runs them: output, JSON, exit codes."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from dpsynth.cli import app
from dpsynth.ledger import Ledger
from dpsynth.privacy.accounting.compose import compose_epsilon, poisson_gaussian_event

runner = CliRunner()


def run_json(*args: str) -> dict:
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_calibrate_solves_for_sigma_and_reports_the_bound():
    out = run_json(
        "calibrate",
        "--epsilon",
        "2",
        "--delta",
        "1e-5",
        "--sampling-rate",
        "0.02",
        "--steps",
        "200",
    )
    assert out["mode"] == "noise_multiplier"
    assert out["epsilon"] <= 2.0
    assert out["steps"] == 200 and out["sampling_rate"] == 0.02
    assert "upper bound" in out["accountant"]
    # The reported ε is what the accountant gives for the reported σ.
    event = poisson_gaussian_event(out["noise_multiplier"], 0.02, 200)
    assert compose_epsilon([event], 1e-5).epsilon == pytest.approx(out["epsilon"], rel=1e-9)


def test_calibrate_batch_size_and_epochs_define_q_and_t():
    out = run_json(
        "calibrate", "--noise-multiplier", "1.0", "--batch-size", "64",
        "--dataset-size", "1437", "--epochs", "10", "--delta", "1e-5",
    )  # fmt: skip
    q = 64 / 1437
    assert out["sampling_rate"] == pytest.approx(q)
    assert out["steps"] == math.ceil(10 / q)
    assert out["mode"] == "epsilon" and out["epsilon"] > 0


def test_calibrate_with_both_reports_the_largest_number_of_steps():
    out = run_json(
        "calibrate", "--epsilon", "2", "--noise-multiplier", "1.0",
        "--sampling-rate", "0.02", "--delta", "1e-5",
    )  # fmt: skip
    assert out["mode"] == "max_steps"
    longer = compose_epsilon([poisson_gaussian_event(1.0, 0.02, out["steps"] + 1)], 1e-5)
    assert out["epsilon"] <= 2.0 < longer.epsilon


def test_calibrate_composes_earlier_spends_and_budget(tmp_path):
    ledger_path = tmp_path / "ledger.jsonl"
    book = Ledger(ledger_path)
    book.set_budget("digits", 4.0, 1e-5)
    seq = book.reserve(
        dataset_id="digits", fingerprint="f" * 64, command="train", method="pge", run_id="r1",
        events=[poisson_gaussian_event(1.0, 0.02, 200)], delta=1e-5,
    )["seq"]  # fmt: skip
    book.complete(seq, [poisson_gaussian_event(1.0, 0.02, 200)], run_id="r1", fingerprint="f" * 64)
    alone = run_json("calibrate", "--epsilon", "4", "--sampling-rate", "0.02", "--steps", "200")
    # No --epsilon: the budget cap is the target, at the budget's δ.
    out = run_json(
        "calibrate", "--sampling-rate", "0.02", "--steps", "200",
        "--ledger", str(ledger_path), "--dataset", "digits",
    )  # fmt: skip
    assert out["delta"] == 1e-5
    assert out["prior_epsilon"] > 0
    assert out["total_epsilon"] <= 4.0
    assert out["noise_multiplier"] > alone["noise_multiplier"]
    assert out["budget"]["epsilon"] == 4.0


@pytest.mark.parametrize(
    "args",
    [
        ["--epsilon", "0", "--delta", "1e-5", "--sampling-rate", "0.1", "--steps", "10"],
        ["--epsilon", "nan", "--delta", "1e-5", "--sampling-rate", "0.1", "--steps", "10"],
        ["--epsilon", "inf", "--delta", "1e-5", "--sampling-rate", "0.1", "--steps", "10"],
        ["--epsilon", "1", "--delta", "1", "--sampling-rate", "0.1", "--steps", "10"],
        ["--epsilon", "1", "--delta", "1e-5", "--sampling-rate", "1.5", "--steps", "10"],
        ["--epsilon", "1", "--delta", "1e-5", "--sampling-rate", "0.1", "--steps", "0"],
        ["--epsilon", "1", "--delta", "1e-5", "--sampling-rate", "0.1"],
        ["--epsilon", "1", "--sampling-rate", "0.1", "--batch-size", "5", "--steps", "3"],
        ["--epsilon", "1", "--sampling-rate", "0.1", "--steps", "3", "--epochs", "2"],
        [
            "--epsilon", "1", "--noise-multiplier", "1", "--sampling-rate", "0.1",
            "--steps", "3",
        ],
    ],
)  # fmt: skip
def test_bad_input_is_one_line_and_exit_2(args):
    result = runner.invoke(app, ["calibrate", *args])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert result.stdout == ""


def test_delta_above_one_over_n_warns():
    out = run_json(
        "calibrate", "--epsilon", "5", "--delta", "0.01", "--batch-size", "10",
        "--dataset-size", "200", "--steps", "10",
    )  # fmt: skip
    assert any("1/N" in w for w in out["warnings"])


def test_data_inspect_json_has_public_fields_only():
    out = run_json("data", "inspect", "digits")
    assert out["n"] == 1437 and out["shape"] == [1, 8, 8]
    assert out["classes"] == [str(d) for d in range(10)]
    # no plain digest of the records (a membership test): a keyed one once the ledger has a key
    assert out["fingerprint"] is None and "content_digest" not in out
    assert not any("count" in key for key in out)


def test_data_list_names_the_builtins():
    names = {item["name"] for item in run_json("data", "list")}
    assert {"digits", "mnist-5k"} <= names


def test_console_script_exit_codes_without_traceback(tmp_path):
    missing = subprocess.run(
        [sys.executable, "-m", "dpsynth.cli", "data", "inspect", f"folder:{tmp_path}/nope"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert missing.returncode == 2
    assert "Traceback" not in missing.stderr and len(missing.stderr.strip().splitlines()) == 1
    corrupt = tmp_path / "bad.npz"
    corrupt.write_bytes(b"not a zip file")
    bad = subprocess.run(
        [sys.executable, "-m", "dpsynth.cli", "data", "inspect", f"npz:{corrupt}"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert bad.returncode == 4
    assert str(corrupt) in bad.stderr and "Traceback" not in bad.stderr


# --- extreme settings (issues 9.7 and 10.3): a valid bound or exit 2, never an OOM kill --------


def run_calibrate_subprocess(*args: str) -> subprocess.CompletedProcess:
    """Run calibrate in its own process with a memory cap and a timeout.

    Before the fix these settings allocated tens of GB or ran for minutes; the address-space
    cap turns such an allocation into a failure here instead of an OOM kill of the test run.
    """

    def limit_memory() -> None:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (6 * 2**30, 6 * 2**30))

    return subprocess.run(
        [sys.executable, "-m", "dpsynth.cli", "calibrate", *args, "--json"],
        capture_output=True, text=True, timeout=120, preexec_fn=limit_memory,
    )  # fmt: skip


def test_huge_prv_mesh_falls_back_to_the_rdp_bound_and_says_so():
    done = run_calibrate_subprocess(
        "--noise-multiplier", "2", "--sampling-rate", "0.5", "--steps", "100000",
        "--delta", "1e-6",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert "RDP upper bound" in out["accountant"]
    assert any("PRV mesh of" in note for note in out["notes"])
    # the RDP bound is an upper bound: at least the PLD accountant's ε of the same run
    from privacy.test_accounting import pld_epsilon  # tests/ is on the path

    event = poisson_gaussian_event(2.0, 0.5, 100_000)
    assert math.isfinite(out["epsilon"]) and out["epsilon"] >= pld_epsilon([event], 1e-6) * 0.999


@pytest.mark.parametrize(
    ("args", "phrase"),
    [
        (["--epsilon", "1e300", "--sampling-rate", "0.01", "--steps", "1000"], "at most 1000"),
        (["--epsilon", "1e6", "--sampling-rate", "0.01", "--steps", "100"], "at most 1000"),
        (["--epsilon", "1", "--sampling-rate", "0.01", "--steps", "1000000000000"], "at most"),
        (
            ["--noise-multiplier", "1e-5", "--sampling-rate", "0.1", "--steps", "10"],
            "at least 0.01",
        ),
    ],
)
def test_out_of_range_values_are_exit_2_in_one_line(args, phrase):
    done = run_calibrate_subprocess(*args)
    assert done.returncode == 2, done.stderr
    assert phrase in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert done.stdout == ""


def test_largest_epsilon_allowed_still_gives_a_valid_bound():
    done = run_calibrate_subprocess(
        "--epsilon", "1000", "--sampling-rate", "0.5", "--steps", "10000000"
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["epsilon"] <= 1000
    check = compose_epsilon(
        [poisson_gaussian_event(out["noise_multiplier"], 0.5, 10_000_000)], out["delta"]
    )
    assert check.epsilon <= 1000


def test_train_with_an_absurd_epsilon_reserves_nothing(tmp_path):
    ledger_path = tmp_path / "ledger.jsonl"
    result = runner.invoke(
        app,
        [
            "train", "--method", "dpkernel", "--data", "digits", "--epsilon", "1e300",
            "--preset", "tiny", "--out", str(tmp_path / "run"), "--ledger", str(ledger_path),
            "--device", "cpu",
        ],
    )  # fmt: skip
    assert result.exit_code == 2, result.output
    assert "at most 1000" in result.output
    assert not ledger_path.exists() or not Ledger(ledger_path).events_for("digits")
    assert not (tmp_path / "run" / "config.json").exists()
