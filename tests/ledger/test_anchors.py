"""A run is bound to its own ledger spend: closing, resuming, stating ε, grouping by data, and
verifying a ledger against run anchors and published heads (issues 9.2, 9.5, 10.4, 10.8)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dpsynth.cli import app
from dpsynth.errors import (
    AnchorError,
    BudgetExceededError,
    DataError,
    RunConfigEditedError,
    UsageError,
)
from dpsynth.ledger import GENESIS_HASH, Ledger, canonical_json, entry_hash
from dpsynth.methods import registry
from dpsynth.privacy.accounting.compose import compose_epsilon
from dpsynth.sampling import sample_run
from dpsynth.training import train_run

DELTA = 1e-5
runner = CliRunner()


@pytest.fixture(autouse=True)
def template_backend(monkeypatch):
    monkeypatch.setitem(registry._BACKENDS, "templates", "loop_backend:TemplateMethod")


def gaussian(sigma: float, count: int = 1) -> dict:
    return {"type": "gaussian", "noise_multiplier": sigma, "count": count}


def reserve(ledger: Ledger, events: list[dict], dataset: str, fingerprint: str, run: str) -> dict:
    return ledger.reserve(
        dataset_id=dataset, fingerprint=fingerprint, command="train", method="pge",
        run_id=run, events=events, delta=DELTA,
    )  # fmt: skip


def train(tmp_path: Path, name: str = "run", ledger: str = "ledger.jsonl", **kwargs) -> dict:
    args = dict(
        method="templates", data="digits", epsilon=5.0, preset="tiny", out=tmp_path / name,
        ledger_path=tmp_path / ledger, device="cpu", seed=3, delta=DELTA,
    )  # fmt: skip
    args.update(kwargs)
    return train_run(**args)


def resume(tmp_path: Path, name: str = "run", ledger: str = "ledger.jsonl") -> dict:
    return train(tmp_path, name, ledger, resume=True)


def edit_config(run: Path, change) -> None:
    config = json.loads((run / "config.json").read_text())
    change(config)
    (run / "config.json").write_text(json.dumps(config))


def invoke(*args: str):
    return runner.invoke(app, [str(a) for a in args])


def one_line_error(result, code: int) -> str:
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


# ---------------------------------------------------------------- closing a spend (9.2)


def test_only_the_spends_own_run_and_data_can_close_it(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "l.jsonl")
    spend = reserve(ledger, [gaussian(5.0)], "digits", "fp-a", "run-a")
    before = ledger.path.read_bytes()
    with pytest.raises(UsageError, match="belongs to run 'run-a'"):
        ledger.complete(spend["seq"], [gaussian(5.0)], run_id="run-b", fingerprint="fp-a")
    with pytest.raises(UsageError, match="belongs to run 'run-a'"):
        ledger.abort(spend["seq"], run_id="run-a", fingerprint="fp-other")
    assert ledger.path.read_bytes() == before  # nothing written
    ledger.complete(spend["seq"], [gaussian(5.0)], run_id="run-a", fingerprint="fp-a")
    assert ledger.spend(spend["seq"])["status"] == "completed"


def test_a_status_line_is_refused_for_a_spend_that_is_not_reserved(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "l.jsonl")
    spend = reserve(ledger, [gaussian(5.0)], "digits", "fp-a", "run-a")
    ledger.abort(spend["seq"], run_id="run-a", fingerprint="fp-a")
    before = ledger.path.read_bytes()
    for close in (ledger.complete, ledger.abort):
        with pytest.raises(UsageError, match="already aborted, not reserved"):
            close(spend["seq"], [gaussian(5.0)], run_id="run-a", fingerprint="fp-a")
    assert ledger.path.read_bytes() == before


def test_verify_rejects_a_status_line_naming_another_run(tmp_path: Path) -> None:
    path = tmp_path / "l.jsonl"
    ledger = Ledger(path)
    spend = reserve(ledger, [gaussian(5.0)], "digits", "fp-a", "run-a")
    ledger.complete(spend["seq"], [gaussian(5.0)], run_id="run-a", fingerprint="fp-a")
    entries = [json.loads(line) for line in path.read_text().splitlines()]
    entries[1]["run_id"] = "run-b"
    entries[1]["hash"] = entry_hash(entries[1])  # a forger re-hashes the line
    path.write_text("".join(canonical_json(e) + "\n" for e in entries))
    with pytest.raises(Exception, match="status line names another run_id"):
        Ledger(path).verify()


# ---------------------------------------------------------------- resume (9.2)


def test_resume_refuses_another_ledger_and_leaves_it_untouched(tmp_path: Path) -> None:
    other = Ledger(tmp_path / "other.jsonl")
    foreign = reserve(other, [gaussian(0.5)], "someone-else", "fp-x", "their-run")
    train(tmp_path, stop_after_steps=3)
    before = other.path.read_bytes()
    with pytest.raises(AnchorError, match="another hash"):
        resume(tmp_path, ledger="other.jsonl")
    assert other.path.read_bytes() == before
    assert other.spend(foreign["seq"])["status"] == "reserved"
    # Through the command line: one line, exit 2.
    result = invoke(
        "train", "--out", tmp_path / "run", "--resume", "--ledger", other.path, "--device", "cpu"
    )
    assert "spend (ledger seq 0)" in one_line_error(result, 2)
    assert other.path.read_bytes() == before
    # Its own ledger still resumes and completes it.
    assert resume(tmp_path)["ledger_status"] == "completed"


def test_resume_refuses_an_edited_noise_multiplier(tmp_path: Path) -> None:
    train(tmp_path, stop_after_steps=3)
    run = tmp_path / "run"
    edit_config(run, lambda c: c["privacy"]["gaussian_sum"].update(noise_multiplier=0.05))
    with pytest.raises(AnchorError, match="does not match its mechanism events"):
        resume(tmp_path)
    # Editing the events in config.json too does not help: the ledger's events differ.
    edit_config(run, lambda c: c["privacy"]["events"][0].update(noise_multiplier=0.05))
    with pytest.raises(AnchorError, match="other mechanism events"):
        resume(tmp_path)
    spends = [e for e in Ledger(tmp_path / "ledger.jsonl").entries() if e["kind"] != "spend"]
    assert spends == []  # nothing was closed


def test_resume_refuses_a_plan_whose_gaussian_sum_was_removed(tmp_path: Path) -> None:
    """A DP-SGD run whose config.json claims no loop noise (as an mst plan has none) reads
    Poisson batches that nothing accounts for: refused before any data is read."""
    train(tmp_path, stop_after_steps=3)
    edit_config(tmp_path / "run", lambda c: c["privacy"].update(gaussian_sum=None))
    with pytest.raises(AnchorError, match="read data but no noise"):
        resume(tmp_path)


def test_resume_refuses_edited_settings_bound_by_the_spend(tmp_path: Path) -> None:
    train(tmp_path, stop_after_steps=3)
    edit_config(tmp_path / "run", lambda c: c["config"].update(lr=50.0))
    with pytest.raises(RunConfigEditedError):
        resume(tmp_path)
    result = invoke(
        "train", "--out", tmp_path / "run", "--resume", "--ledger", tmp_path / "ledger.jsonl"
    )
    assert "config.json was edited" in one_line_error(result, 4)
    assert Ledger(tmp_path / "ledger.jsonl").spend(0)["status"] == "reserved"


def test_resume_refuses_an_anchor_moved_to_another_runs_spend(tmp_path: Path) -> None:
    train(tmp_path, "one", stop_after_steps=3)
    train(tmp_path, "two", stop_after_steps=3, epsilon=8.0)
    book = Ledger(tmp_path / "ledger.jsonl")
    first = book.entries()[0]
    edit_config(
        tmp_path / "two",
        lambda c: c["ledger"].update(spend_seq=first["seq"], spend_hash=first["hash"]),
    )
    with pytest.raises(AnchorError, match="belongs to run_id"):
        resume(tmp_path, "two")
    assert [e["kind"] for e in book.entries()] == ["spend", "spend"]


def test_a_finished_run_is_reported_finished_only_from_its_own_entry(tmp_path: Path) -> None:
    train(tmp_path)
    assert resume(tmp_path)["already_finished"]
    edit_config(tmp_path / "run", lambda c: c.update(run_id="someone-else"))
    with pytest.raises(AnchorError, match="belongs to run_id"):
        resume(tmp_path)


def test_resume_without_ledger_uses_the_runs_recorded_ledger(tmp_path: Path, monkeypatch) -> None:
    train(tmp_path, stop_after_steps=3)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # its default ledger would be elsewhere/dpsynth-ledger.jsonl
    monkeypatch.delenv("DPSYNTH_LEDGER", raising=False)
    result = invoke("train", "--out", tmp_path / "run", "--resume", "--device", "cpu", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["ledger_status"] == "completed"
    assert not (elsewhere / "dpsynth-ledger.jsonl").exists()
    assert Ledger(tmp_path / "ledger.jsonl").spend(0)["status"] == "completed"


# ---------------------------------------------------------------- grouping by data (9.5)


def test_a_new_dataset_id_for_the_same_records_composes_with_the_old_one(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "l.jsonl")
    a = reserve(ledger, [gaussian(3.0)], "A", "fp-1", "r1")
    b = reserve(ledger, [gaussian(4.0)], "B", "fp-1", "r2")  # same records, new id
    both = compose_epsilon([gaussian(3.0), gaussian(4.0)], DELTA).epsilon
    assert b["total_epsilon"] == both > a["total_epsilon"]
    assert ledger.events_for("B") == (gaussian(3.0), gaussian(4.0))
    # A converted file (new fingerprint) under an id of the group joins it too, transitively.
    c = reserve(ledger, [gaussian(5.0)], "B", "fp-2", "r3")
    d = reserve(ledger, [gaussian(6.0)], "C", "fp-2", "r4")
    assert ledger.events_for("A") == tuple(gaussian(s) for s in (3.0, 4.0, 5.0, 6.0))
    assert d["total_epsilon"] > c["total_epsilon"] > b["total_epsilon"]
    row = ledger.summary()["datasets"]["A"]
    assert row["total_epsilon"] == ledger.summary()["datasets"]["C"]["total_epsilon"]
    assert row["linked_ids"] == ["B", "C"]
    report = ledger.verify()
    assert report["datasets"]["A"]["total_epsilon"] == report["datasets"]["C"]["total_epsilon"]
    shown = invoke("ledger", "show", "--ledger", ledger.path)
    assert shown.exit_code == 0 and "A: total includes the linked ids B, C" in shown.stdout
    # Another data set (another id and fingerprint) stays on its own.
    e = reserve(ledger, [gaussian(3.0)], "D", "fp-9", "r5")
    assert e["total_epsilon"] == e["epsilon"]


def test_a_budget_on_one_id_caps_the_same_data_under_another_id(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "l.jsonl")
    reserve(ledger, [gaussian(1.0)], "A", "fp-1", "r1")
    ledger.set_budget("A", compose_epsilon([gaussian(1.0)], DELTA).epsilon * 1.05, DELTA)
    before = ledger.path.read_bytes()
    with pytest.raises(BudgetExceededError, match="set on 'A'"):
        reserve(ledger, [gaussian(1.0)], "B", "fp-1", "r2")
    assert ledger.path.read_bytes() == before


def test_training_under_a_new_dataset_id_plans_with_the_earlier_spends(tmp_path: Path) -> None:
    first = train(tmp_path, "one", dataset_id="A", epsilon=3.0)
    second = train(tmp_path, "two", dataset_id="B", epsilon=6.0)
    book = Ledger(tmp_path / "ledger.jsonl")
    spends = [e for e in book.entries() if e["kind"] == "spend"]
    assert [s["dataset_id"] for s in spends] == ["A", "B"]
    assert spends[0]["fingerprint"] == spends[1]["fingerprint"]
    # The second plan composed the first: its own ε is below the target, the total reaches it.
    assert float(second["epsilon"]) < 6.0
    assert spends[1]["total_epsilon"] > spends[1]["epsilon"]
    assert second["dataset_total_epsilon"] <= 6.0 + 1e-9
    assert len(book.events_for("B")) == 2
    with pytest.raises(BudgetExceededError):
        train(tmp_path, "three", dataset_id="fresh-name", epsilon=float(first["epsilon"]))


def test_calibrate_with_a_dataset_composes_its_linked_spends(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "l.jsonl")
    reserve(ledger, [gaussian(2.0)], "A", "fp-1", "r1")
    reserve(ledger, [gaussian(2.0)], "B", "fp-1", "r2")
    ledger.set_budget("A", 50.0, DELTA)
    args = ["calibrate", "--noise-multiplier", "1.0", "--sampling-rate", "0.01", "--steps", "10"]
    result = invoke(*args, "--dataset", "B", "--ledger", ledger.path, "--delta", DELTA, "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    both = compose_epsilon([gaussian(2.0), gaussian(2.0)], DELTA).epsilon
    assert out["prior_epsilon"] == pytest.approx(both, rel=1e-6)
    assert out["budget"]["epsilon"] == 50.0  # the cap set on A covers B


# ---------------------------------------------------------------- privacy statements (10.4)


def test_sample_states_the_ledgers_epsilon_and_refuses_an_edited_one(tmp_path: Path) -> None:
    train(tmp_path)
    run, ledger = tmp_path / "run", tmp_path / "ledger.jsonl"
    spend = Ledger(ledger).spend(0)
    pristine = (run / "config.json").read_text()
    edit_config(run, lambda c: c["privacy"].update(epsilon_bound=0.01, target_epsilon=0.01))
    result = invoke("sample", run, "--n", "5", "--out", tmp_path / "s")
    assert "config.json was edited" in one_line_error(result, 4)
    assert not (tmp_path / "s").exists()
    (run / "config.json").write_text(pristine)
    out = sample_run(run, 10, tmp_path / "s", device="cpu", ledger_path=ledger)
    manifest = json.loads((tmp_path / "s" / "manifest.json").read_text())
    assert f"ε ≤ {spend['epsilon']:.4g}," in manifest["privacy"] == out["privacy"]
    source = manifest["privacy_source"]
    assert (source["ledger_seq"], source["ledger_hash"]) == (0, spend["hash"])
    assert source["epsilon"] == spend["epsilon"] and source["status"] == "completed"


def test_sample_refuses_a_ledger_without_the_runs_spend(tmp_path: Path) -> None:
    train(tmp_path)
    path = tmp_path / "ledger.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("")  # the run's spend (and its status) cut from the ledger
    result = invoke("sample", tmp_path / "run", "--n", "5", "--out", tmp_path / "s")
    assert "not in the ledger" in one_line_error(result, 2)
    assert not (tmp_path / "s").exists()
    path.write_text("".join(lines))
    assert invoke("sample", tmp_path / "run", "--n", "5", "--out", tmp_path / "s").exit_code == 0


def test_a_non_private_run_samples_labelled_from_the_ledger(tmp_path: Path) -> None:
    train(tmp_path, epsilon="inf")
    edit_config(tmp_path / "run", lambda c: c.update(private=True))
    out = sample_run(tmp_path / "run", 5, tmp_path / "s", device="cpu")
    assert out["private"] is False and "NOT PRIVATE" in out["privacy"]


def test_evaluate_of_a_run_dir_states_and_checks_its_spend(tmp_path: Path) -> None:
    from dpsynth.evaluation.report import run_evaluation

    train(tmp_path)
    kwargs = dict(
        synthetic=str(tmp_path / "run"), real="digits:test", metrics=["accuracy"],
        classifier="logreg", seeds=1, n=20, device="cpu",
    )  # fmt: skip
    result = run_evaluation(ledger_path=tmp_path / "ledger.jsonl", **kwargs)
    assert result["privacy"]["epsilon"] == Ledger(tmp_path / "ledger.jsonl").spend(0)["epsilon"]
    other = Ledger(tmp_path / "other.jsonl")
    reserve(other, [gaussian(5.0)], "x", "fp-x", "r")
    with pytest.raises(AnchorError):
        run_evaluation(ledger_path=other.path, **kwargs)


@pytest.mark.parametrize(
    "change",
    [
        lambda c: c.update(method="no-such-method"),
        lambda c: c["data"].update(classes=[*c["data"]["classes"], "extra"]),
        lambda c: c["data"].update(shape=[1, 16, 16]),
        lambda c: c.pop("config"),
    ],
    ids=["method", "classes", "shape", "no-config"],
)
def test_an_edited_run_config_is_one_line_and_exit_4(tmp_path: Path, change) -> None:
    from dpsynth.sampling import load_generator

    train(tmp_path)
    edit_config(tmp_path / "run", change)
    with pytest.raises(DataError):
        sample_run(tmp_path / "run", 5, tmp_path / "s", device="cpu")
    with pytest.raises(DataError):  # also without the ledger's digest to compare against
        load_generator(tmp_path / "run", "cpu")
    result = invoke("sample", tmp_path / "run", "--n", "5", "--out", tmp_path / "s")
    one_line_error(result, 4)
    assert not (tmp_path / "s").exists()


# ---------------------------------------------------------------- anchors outside (10.8)


def _rewrite_without_tail(path: Path, keep: int) -> None:
    """A consistent rewrite: the first `keep` lines, re-chained and re-hashed."""
    entries = [json.loads(line) for line in path.read_text().splitlines()][:keep]
    prev = GENESIS_HASH
    for seq, entry in enumerate(entries):
        entry.update(seq=seq, prev_hash=prev)
        entry["hash"] = entry_hash(entry)
        prev = entry["hash"]
    path.write_text("".join(canonical_json(e) + "\n" for e in entries))


def test_verify_against_runs_and_heads_catches_a_consistent_rewrite(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    train(tmp_path, "one", epsilon=3.0)
    train(tmp_path, "two", epsilon=6.0)
    head = invoke("ledger", "head", "--ledger", path, "--json")
    assert head.exit_code == 0, head.output
    published = json.loads(head.stdout)
    last = Ledger(path).entries()[-1]
    assert (published["seq"], published["hash"]) == (last["seq"], last["hash"])
    text = invoke("ledger", "head", "--ledger", path)
    assert text.exit_code == 0 and last["hash"] in text.stdout
    ok = invoke(
        "ledger", "verify", "--ledger", path, "--against", tmp_path / "one", tmp_path / "two",
        "--head", published["hash"],
    )  # fmt: skip
    assert ok.exit_code == 0, ok.output

    _rewrite_without_tail(path, 2)  # run two's spend dropped, the chain rebuilt
    assert invoke("ledger", "verify", "--ledger", path).exit_code == 0  # alone: undetectable
    bad = invoke("ledger", "verify", "--ledger", path, "--against", tmp_path / "one",
                 tmp_path / "two")  # fmt: skip
    message = one_line_error(bad, 1)
    assert str(tmp_path / "two") in message and "missing" in message
    stale = invoke("ledger", "verify", "--ledger", path, "--head", published["hash"])
    assert "published head" in one_line_error(stale, 1)
    kept = invoke("ledger", "verify", "--ledger", path, "--against", tmp_path / "one")
    assert kept.exit_code == 0, kept.output


def test_verify_against_a_rehashed_spend_names_the_run(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    train(tmp_path, "one")
    entries = [json.loads(line) for line in path.read_text().splitlines()]
    entries[0]["time"] = "2000-01-01T00:00:00.000000Z"
    path.write_text("".join(canonical_json(e) + "\n" for e in entries))
    _rewrite_without_tail(path, len(entries))
    assert invoke("ledger", "verify", "--ledger", path).exit_code == 0
    bad = invoke("ledger", "verify", "--ledger", path, "--against", tmp_path / "one")
    message = one_line_error(bad, 1)
    assert str(tmp_path / "one") in message and "differs" in message


def test_head_and_against_usage_errors(tmp_path: Path) -> None:
    assert "no ledger" in one_line_error(
        invoke("ledger", "head", "--ledger", tmp_path / "none.jsonl"), 2
    )
    train(tmp_path)
    result = invoke("ledger", "verify", "--ledger", tmp_path / "ledger.jsonl", tmp_path / "run")
    assert "--against" in one_line_error(result, 2)
    not_a_run = invoke(
        "ledger", "verify", "--ledger", tmp_path / "ledger.jsonl", "--against", tmp_path
    )
    one_line_error(not_a_run, 2)


def test_an_edited_pge_width_is_one_line_and_exit_4_not_a_state_dict_dump(tmp_path: Path) -> None:
    from dpsynth.sampling import load_generator

    train(tmp_path, method="pge", stop_after_steps=1, overrides={"steps": 2})
    edit_config(tmp_path / "run", lambda c: c["config"].update(nf=16))
    result = invoke("sample", tmp_path / "run", "--n", "2", "--out", tmp_path / "s")
    assert "config.json was edited" in one_line_error(result, 4)  # the ledger's digest
    assert not (tmp_path / "s").exists()
    # Without a digest to compare (a spend recorded before there was one), loading the
    # checkpoint itself fails with one line.
    with pytest.raises(DataError, match=r"does not match config\.json") as failed:
        load_generator(tmp_path / "run", "cpu")
    assert "\n" not in str(failed.value) and len(str(failed.value)) < 400
