"""The privacy ledger: lifecycle and counting rule, composition, budget caps, tamper detection,
concurrent appends and non-private runs.

Events are mostly plain Gaussian mechanisms: the accountant composes them in a fraction of a
second, and their composition has a closed form to check the ledger's totals against.
"""

from __future__ import annotations

import hashlib
import json
import math
import multiprocessing
import shutil
import time
from datetime import datetime
from pathlib import Path

import pytest
from scipy.optimize import brentq
from scipy.stats import norm

from dpsynth.errors import BudgetExceededError, DpsynthError, LedgerIntegrityError
from dpsynth.ledger import GENESIS_HASH, Ledger, default_ledger_path
from dpsynth.ledger import spends as ledger_module
from dpsynth.privacy.accounting.compose import compose_epsilon

DELTA = 1e-5


def gaussian(sigma: float, count: int = 1) -> dict:
    return {"type": "gaussian", "noise_multiplier": sigma, "count": count}


def reserve(ledger: Ledger, events: list[dict], dataset: str = "digits", run: str = "r") -> dict:
    return ledger.reserve(
        dataset_id=dataset,
        fingerprint=f"fp-{dataset}",
        command="train",
        method="pge",
        run_id=run,
        events=events,
        delta=DELTA,
    )


def owner(spend: dict) -> dict:
    """The run id and fingerprint a spend must be closed with."""
    return {"run_id": spend["run_id"], "fingerprint": spend["fingerprint"]}


def release(ledger: Ledger, dataset: str = "digits", run: str = "r", **details) -> dict:
    return ledger.record_release(
        dataset_id=dataset,
        fingerprint=f"fp-{dataset}",
        command="sample",
        method="pge",
        run_id=run,
        output_sha256="ab" * 32,
        details=details,
    )


def exact_gaussian_epsilon(sigmas: list[float], delta: float) -> float:
    """Exact ε(δ) of composed sensitivity-1 Gaussians (Balle & Wang 2018, Dong et al. GDP)."""
    mu = math.sqrt(sum(1.0 / s**2 for s in sigmas))

    def delta_of(eps: float) -> float:
        return norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2)

    return brentq(lambda eps: delta_of(eps) - delta, 0.0, 100.0)


def raw_lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def rehash(entry: dict) -> dict:
    """What someone forging a line would do: recompute its hash per the documented rule."""
    body = {k: v for k, v in entry.items() if k != "hash"}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return {**body, "hash": hashlib.sha256(canonical.encode()).hexdigest()}


def rechain(entries: list[dict]) -> list[bytes]:
    """Re-number, re-link and re-hash a list of entries into a self-consistent chain."""
    out, prev = [], GENESIS_HASH
    for seq, entry in enumerate(entries):
        entry = rehash({**entry, "seq": seq, "prev_hash": prev})
        prev = entry["hash"]
        out.append((json.dumps(entry, sort_keys=True, separators=(",", ":")) + "\n").encode())
    return out


# ---------------------------------------------------------------- format and basics


def test_missing_file_is_an_empty_ledger(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "none" / "ledger.jsonl")
    assert ledger.entries() == []
    assert ledger.events_for("digits") == ()
    assert ledger.total_epsilon("digits", DELTA) == 0.0
    assert ledger.summary()["datasets"] == {}
    assert ledger.verify()["entries"] == 0
    assert not (tmp_path / "none").exists()


def test_lines_are_hash_chained_json_with_consecutive_seqs(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "dir" / "ledger.jsonl"  # parent dirs are created
    ledger = Ledger(path)
    reserve(ledger, [gaussian(5.0)])
    release(ledger)
    ledger.set_budget("digits", 3.0, DELTA)
    lines = path.read_text().splitlines()
    assert len(lines) == 3
    prev = GENESIS_HASH
    for seq, line in enumerate(lines):
        entry = json.loads(line)
        assert entry["seq"] == seq
        assert entry["prev_hash"] == prev
        assert entry == rehash(entry)  # hash = SHA-256 of the canonical JSON without `hash`
        assert datetime.fromisoformat(entry["time"].replace("Z", "+00:00")).tzinfo is not None
        prev = entry["hash"]
    kinds = [json.loads(line)["kind"] for line in lines]
    assert kinds == ["spend", "release", "budget"]
    spend = json.loads(lines[0])
    assert spend["status"] == "reserved" and spend["private"] is True
    assert spend["accountant"] == compose_epsilon([gaussian(5.0)], DELTA).accountant
    assert ledger.verify()["counts"] == {"spend": 1, "status": 0, "release": 1, "budget": 1}


def test_a_second_ledger_object_sees_appends_from_the_first(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    reader, writer = Ledger(path), Ledger(path)
    assert reader.entries() == []
    reserve(writer, [gaussian(5.0)])
    assert [e["seq"] for e in reader.entries()] == [0]
    release(writer)
    reserve(reader, [gaussian(3.0)])  # the reader appends after the writer's lines
    assert [e["seq"] for e in writer.entries()] == [0, 1, 2]
    assert writer.events_for("digits") == (gaussian(5.0), gaussian(3.0))


def test_default_path_follows_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DPSYNTH_LEDGER", raising=False)
    assert default_ledger_path() == Path("dpsynth-ledger.jsonl")
    monkeypatch.setenv("DPSYNTH_LEDGER", str(tmp_path / "x.jsonl"))
    assert default_ledger_path() == tmp_path / "x.jsonl"


# ---------------------------------------------------------------- counting and composition


def test_reserve_complete_abort_lifecycle_and_what_counts(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.jsonl")
    first = reserve(ledger, [gaussian(5.0, count=4)], run="a")
    assert ledger.events_for("digits") == (gaussian(5.0, count=4),)  # reserved counts in full

    # stopped after 2 of 4
    done = ledger.complete(first["seq"], [gaussian(5.0, count=2)], **owner(first))
    assert done["ref"] == first["seq"] and done["status"] == "completed"
    assert ledger.events_for("digits") == (gaussian(5.0, count=2),)
    assert done["epsilon"] == compose_epsilon([gaussian(5.0, count=2)], DELTA).epsilon
    assert done["epsilon"] < first["epsilon"]

    crashed = reserve(ledger, [gaussian(4.0)], run="b")  # never closed: a crash
    aborted_full = reserve(ledger, [gaussian(3.0)], run="c")
    # nothing said about the part spent: all of it counts
    ledger.abort(aborted_full["seq"], **owner(aborted_full))
    aborted_part = reserve(ledger, [gaussian(2.0, count=3)], run="d")
    ledger.abort(aborted_part["seq"], [gaussian(2.0, count=1)], **owner(aborted_part))
    release(ledger, run="a", n=100)

    expected = (gaussian(5.0, count=2), gaussian(4.0), gaussian(3.0), gaussian(2.0, count=1))
    assert ledger.events_for("digits") == expected
    assert ledger.total_epsilon("digits", DELTA) == compose_epsilon(expected, DELTA).epsilon
    assert ledger.entries()[-2]["total_epsilon"] == compose_epsilon(expected, DELTA).epsilon

    assert ledger.spend(first["seq"])["status"] == "completed"
    assert ledger.spend(crashed["seq"])["status"] == "reserved"
    merged = ledger.spend(aborted_part["seq"])
    assert merged["status"] == "aborted"
    assert merged["events"] == [gaussian(2.0, count=1)]
    assert merged["reserved_events"] == [gaussian(2.0, count=3)]

    with pytest.raises(DpsynthError, match="already completed"):
        ledger.complete(first["seq"], [gaussian(5.0)], **owner(first))
    with pytest.raises(DpsynthError, match="no spend with seq"):
        ledger.abort(99, **owner(first))
    assert ledger.verify()["open_spends"] == [crashed["seq"]]


def test_totals_are_composed_not_summed(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.jsonl")
    one = reserve(ledger, [gaussian(5.0)])
    two = reserve(ledger, [gaussian(3.0)])
    total = ledger.total_epsilon("digits", DELTA)
    assert two["total_epsilon"] == total
    assert total == compose_epsilon([gaussian(5.0), gaussian(3.0)], DELTA).epsilon
    assert max(one["epsilon"], two["epsilon"]) < total < one["epsilon"] + two["epsilon"]
    # Independent reference: composed Gaussians are one Gaussian; its exact ε(δ) has a closed
    # form. The ledger's total must be an upper bound on it, and a tight one.
    exact = exact_gaussian_epsilon([5.0, 3.0], DELTA)
    assert exact <= total <= exact * 1.02
    # Each dataset is composed on its own.
    reserve(ledger, [gaussian(2.0)], dataset="mnist-5k")
    assert ledger.total_epsilon("digits", DELTA) == total
    assert ledger.events_for("mnist-5k") == (gaussian(2.0),)


def test_spends_for_fingerprint_lists_spends_with_their_status(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.jsonl")
    a = reserve(ledger, [gaussian(5.0)], run="a")
    reserve(ledger, [gaussian(5.0)], dataset="other", run="b")
    c = reserve(ledger, [gaussian(4.0)], run="c")
    ledger.complete(a["seq"], [gaussian(5.0)], **owner(a))
    found = ledger.spends_for_fingerprint("fp-digits")
    assert [(s["run_id"], s["status"]) for s in found] == [("a", "completed"), ("c", "reserved")]
    assert found[1]["seq"] == c["seq"]


def test_release_entries_are_zero_cost(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.jsonl")
    reserve(ledger, [gaussian(5.0)])
    before = ledger.total_epsilon("digits", DELTA)
    line = release(ledger, n=60000, fid=float("inf"))
    assert line["events"] == [] and line["epsilon"] == 0.0
    assert line["details"] == {"n": 60000, "fid": "inf"}  # JSON has no inf
    assert line["output_sha256"] == "ab" * 32
    assert ledger.total_epsilon("digits", DELTA) == before
    assert ledger.events_for("digits") == (gaussian(5.0),)
    row = ledger.summary()["datasets"]["digits"]
    assert (row["spends"], row["releases"], row["entries"]) == (1, 1, 2)


# ---------------------------------------------------------------- budget cap


def test_budget_cap_refuses_a_spend_and_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    ledger = Ledger(path)
    one = compose_epsilon([gaussian(5.0)], DELTA).epsilon
    two = compose_epsilon([gaussian(5.0, count=2)], DELTA).epsilon
    cap = (one + two) / 2
    budget = ledger.set_budget("digits", cap, DELTA)
    assert budget["total_epsilon"] == 0.0 and budget["remaining"] == cap
    reserve(ledger, [gaussian(5.0)])
    before = path.read_bytes()
    with pytest.raises(BudgetExceededError) as refused:
        reserve(ledger, [gaussian(5.0)])
    assert refused.value.exit_code == 3
    message = str(refused.value)
    assert "\n" not in message and f"{two:.4g}" in message and f"{cap:g}" in message
    assert path.read_bytes() == before
    assert Ledger(path).entries()[-1]["kind"] == "spend"  # nothing appended
    # Other datasets are not capped; a non-private run on a capped dataset is refused.
    reserve(ledger, [gaussian(5.0)], dataset="other")
    with pytest.raises(BudgetExceededError):
        reserve(ledger, [{"type": "non_private"}])
    row = ledger.summary()["datasets"]["digits"]
    assert row["budget"] == {"epsilon": cap, "delta": DELTA}
    assert row["remaining"] == pytest.approx(cap - one)


def test_reserve_refuses_a_total_over_the_planned_target(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    ledger = Ledger(path)
    alone = compose_epsilon([gaussian(5.0)], DELTA).epsilon
    reserve(ledger, [gaussian(5.0)], dataset="other")
    planned = ledger.reserve(
        dataset_id="digits",
        fingerprint="fp-digits",
        command="train",
        method="pge",
        run_id="planned",
        events=[gaussian(5.0)],
        delta=DELTA,
        max_total_epsilon=alone,
    )
    assert planned["total_epsilon"] == alone
    before = path.read_bytes()
    with pytest.raises(BudgetExceededError, match="plan again"):
        ledger.reserve(
            dataset_id="digits",
            fingerprint="fp-digits",
            command="train",
            method="pge",
            run_id="stale-plan",
            events=[gaussian(5.0)],
            delta=DELTA,
            max_total_epsilon=alone,  # planned as if the first spend were not there
        )
    assert path.read_bytes() == before


def test_budget_is_checked_at_the_budgets_delta(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.jsonl")
    at_budget_delta = compose_epsilon([gaussian(5.0)], 1e-8).epsilon
    at_spend_delta = compose_epsilon([gaussian(5.0)], DELTA).epsilon
    assert at_spend_delta < at_budget_delta
    ledger.set_budget("digits", (at_spend_delta + at_budget_delta) / 2, 1e-8)
    with pytest.raises(BudgetExceededError):
        reserve(ledger, [gaussian(5.0)])  # fits at δ=1e-5 but not at the budget's δ=1e-8


def test_setting_a_budget_below_the_spent_total_is_recorded_with_negative_remaining(
    tmp_path: Path,
) -> None:
    ledger = Ledger(tmp_path / "ledger.jsonl")
    spent = reserve(ledger, [gaussian(2.0)])["total_epsilon"]
    line = ledger.set_budget("digits", 0.5, DELTA)
    assert line["remaining"] == pytest.approx(0.5 - spent) and line["remaining"] < 0
    assert ledger.budget_for("digits")["epsilon"] == 0.5
    with pytest.raises(BudgetExceededError):
        reserve(ledger, [gaussian(50.0)])


# ---------------------------------------------------------------- non-private runs


def test_non_private_spend_makes_the_total_infinite(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    ledger = Ledger(path)
    reserve(ledger, [gaussian(5.0)])
    line = ledger.reserve(
        dataset_id="digits",
        fingerprint="fp-digits",
        command="train",
        method="pge",
        run_id="baseline",
        events=[{"type": "non_private", "steps": 10}],
        delta=DELTA,
        private=False,
    )
    assert line["epsilon"] == "inf" and line["total_epsilon"] == "inf"
    assert line["private"] is False
    assert "Infinity" not in path.read_text()
    assert math.isinf(ledger.total_epsilon("digits", DELTA))
    ledger.complete(line["seq"], [{"type": "non_private", "steps": 10}], **owner(line))
    row = ledger.summary()["datasets"]["digits"]
    assert row["private"] is False and math.isinf(row["total_epsilon"])
    assert math.isinf(ledger.verify()["datasets"]["digits"]["total_epsilon"])
    reserve(ledger, [gaussian(5.0)], dataset="other")  # other datasets stay finite
    assert math.isfinite(ledger.total_epsilon("other", DELTA))


# ---------------------------------------------------------------- tamper detection


@pytest.fixture(scope="module")
def intact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small intact ledger: spend, release, spend, status, budget, release."""
    path = tmp_path_factory.mktemp("intact") / "ledger.jsonl"
    ledger = Ledger(path)
    first = reserve(ledger, [gaussian(5.0, count=2)], run="a")
    release(ledger, run="a")
    reserve(ledger, [gaussian(3.0)], run="b")
    ledger.complete(first["seq"], [gaussian(5.0)], **owner(first))
    ledger.set_budget("digits", 10.0, DELTA)
    release(ledger, run="b")
    return path


def tampered(intact: Path, tmp_path: Path, lines: list[bytes]) -> Ledger:
    path = tmp_path / "ledger.jsonl"
    path.write_bytes(b"".join(lines))
    return Ledger(path)


def test_verify_passes_on_an_intact_ledger(intact: Path) -> None:
    report = Ledger(intact).verify()
    assert report["ok"] and report["entries"] == 6
    assert report["counts"] == {"spend": 2, "status": 1, "release": 2, "budget": 1}
    expected = compose_epsilon([gaussian(5.0), gaussian(3.0)], DELTA).epsilon
    assert report["datasets"]["digits"]["total_epsilon"] == expected
    assert report["head_hash"] == json.loads(raw_lines(intact)[-1])["hash"]


def _edit(lines: list[bytes], index: int, **changes) -> list[bytes]:
    entry = {**json.loads(lines[index]), **changes}
    return [*lines[:index], (json.dumps(entry) + "\n").encode(), *lines[index + 1 :]]


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        ("edited", "line 3: hash mismatch"),
        ("edited_and_rehashed", "line 4: prev_hash does not match"),
        ("bad_json", "line 2: not valid JSON"),
        ("removed_middle", "line 2: seq 2 where 1 was expected"),
        ("removed_first", "line 1: seq 1 where 0 was expected"),
        ("removed_and_renumbered", "line 2: prev_hash does not match"),
        ("reordered", "line 2: seq 2 where 1 was expected"),
        ("truncated_last", "line 6: incomplete last line"),
        ("forged_total", "line 3: recorded total_epsilon"),
        ("forged_epsilon", "line 1: recorded epsilon"),
        ("status_unknown_spend", "line 4: status line refers to unknown spend seq 1"),
    ],
)
def test_verify_fails_with_the_reason(intact: Path, tmp_path: Path, case: str, reason: str) -> None:
    lines = raw_lines(intact)
    entries = [json.loads(line) for line in lines]
    if case == "edited":
        lines = _edit(lines, 2, run_id="someone-else")
    elif case == "edited_and_rehashed":
        entry = rehash({**entries[2], "run_id": "someone-else"})
        lines[2] = (json.dumps(entry) + "\n").encode()
    elif case == "bad_json":
        lines[1] = lines[1][:10] + b"}" + lines[1][10:]
    elif case == "removed_middle":
        del lines[1]
    elif case == "removed_first":
        del lines[0]
    elif case == "removed_and_renumbered":
        del entries[1]
        lines = [
            (json.dumps(rehash({**e, "seq": i})) + "\n").encode() for i, e in enumerate(entries)
        ]
    elif case == "reordered":
        lines[1], lines[2] = lines[2], lines[1]
    elif case == "truncated_last":
        lines[-1] = lines[-1][: len(lines[-1]) // 2]
    elif case == "forged_total":  # a whole re-forged chain still fails the recomputation
        entries[2]["total_epsilon"] = entries[2]["total_epsilon"] / 2
        lines = rechain(entries)
    elif case == "forged_epsilon":
        entries[0]["epsilon"] = entries[0]["epsilon"] * 0.9
        lines = rechain(entries)
    elif case == "status_unknown_spend":
        entries[3]["ref"] = 1  # seq 1 is a release, not a spend
        lines = rechain(entries)
    with pytest.raises(LedgerIntegrityError) as failed:
        tampered(intact, tmp_path, lines).verify()
    message = str(failed.value)
    assert reason in message and "\n" not in message


def test_quick_verify_checks_the_chain_but_not_the_totals(intact: Path, tmp_path: Path) -> None:
    entries = [json.loads(line) for line in raw_lines(intact)]
    entries[2]["total_epsilon"] = entries[2]["total_epsilon"] / 2
    ledger = tampered(intact, tmp_path, rechain(entries))
    assert ledger.verify(recompute=False)["entries"] == 6
    with pytest.raises(LedgerIntegrityError, match="recorded total_epsilon"):
        ledger.verify()
    with pytest.raises(LedgerIntegrityError, match="hash mismatch"):
        tampered(intact, tmp_path, _edit(raw_lines(intact), 2, run_id="x")).verify(recompute=False)


@pytest.mark.parametrize(("factor", "passes"), [(1.02, True), (0.98, True), (0.9, False)])
def test_lines_from_another_version_are_checked_loosely(
    intact: Path, tmp_path: Path, factor: float, passes: bool
) -> None:
    entries = [json.loads(line) for line in raw_lines(intact)]
    entries[2]["dpsynth_version"] = "0.0.1"  # written by an older dpsynth and accountant
    entries[2]["total_epsilon"] = entries[2]["total_epsilon"] * factor
    ledger = tampered(intact, tmp_path, rechain(entries))
    if passes:
        assert ledger.verify()["other_accountant_seqs"] == [2]
    else:
        with pytest.raises(LedgerIntegrityError, match="line 3: recorded total_epsilon"):
            ledger.verify()


def test_cut_off_tail_is_caught_with_anchors(intact: Path, tmp_path: Path) -> None:
    lines = raw_lines(intact)
    last = json.loads(lines[-1])
    ledger = tampered(intact, tmp_path, lines[:-1])
    ledger.verify()  # a chain alone cannot tell that its end is gone
    with pytest.raises(LedgerIntegrityError, match=f"seq {last['seq']}"):
        ledger.verify(anchors={last["seq"]: last["hash"]})
    Ledger(intact).verify(anchors={last["seq"]: last["hash"]})


def test_a_damaged_ledger_refuses_reads_and_appends(intact: Path, tmp_path: Path) -> None:
    lines = raw_lines(intact)
    lines[-1] = lines[-1][:-5]
    ledger = tampered(intact, tmp_path, lines)
    before = ledger.path.read_bytes()
    with pytest.raises(LedgerIntegrityError, match="line 6: incomplete"):
        ledger.entries()
    with pytest.raises(LedgerIntegrityError):
        reserve(Ledger(ledger.path), [gaussian(5.0)])
    assert ledger.path.read_bytes() == before
    edited = tmp_path / "edited.jsonl"
    edited.write_bytes(b"".join(_edit(raw_lines(intact), 0, epsilon=0.001)))
    with pytest.raises(LedgerIntegrityError, match="line 1: hash mismatch"):
        Ledger(edited).total_epsilon("digits", DELTA)


def test_lines_removed_under_a_live_ledger_are_noticed(intact: Path, tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    shutil.copy(intact, path)
    ledger = Ledger(path)
    assert len(ledger.entries()) == 6
    with path.open("r+b") as handle:  # same file, cut short in place
        handle.truncate(sum(len(line) for line in raw_lines(intact)[:3]))
    with pytest.raises(LedgerIntegrityError, match="shrank"):
        ledger.entries()


# ---------------------------------------------------------------- concurrency


def _append_entries(path: str, worker: int, count: int, start) -> None:
    """Worker: one reserve + complete on its own dataset, then releases, all at once."""
    ledger = Ledger(path)
    start.wait()
    spend = reserve(ledger, [gaussian(5.0)], dataset=f"d{worker}", run=f"w{worker}")
    ledger.complete(spend["seq"], [gaussian(5.0)], **owner(spend))
    for i in range(count - 2):
        release(ledger, dataset=f"d{worker}", run=f"w{worker}", i=i)


def _reserve_under_cap(path: str, worker: int, start) -> None:
    """Worker: one reservation on the shared, capped dataset; exit 3 when refused."""
    ledger = Ledger(path)
    start.wait()
    try:
        reserve(ledger, [gaussian(5.0)], run=f"w{worker}")
    except BudgetExceededError as exc:
        raise SystemExit(exc.exit_code) from None


def _run_workers(target, args_per_worker: list[tuple]) -> list[int]:
    # fork: the children need no fresh imports, and they touch only files and numpy.
    context = multiprocessing.get_context("fork")
    start = context.Barrier(len(args_per_worker))
    workers = [context.Process(target=target, args=(*args, start)) for args in args_per_worker]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=120)
    return [worker.exitcode for worker in workers]


def test_eight_processes_appending_at_once_lose_nothing(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    codes = _run_workers(_append_entries, [(str(path), w, 20) for w in range(8)])
    assert codes == [0] * 8
    entries = Ledger(path).entries()
    assert [e["seq"] for e in entries] == list(range(160))
    for worker in range(8):
        mine = [e for e in entries if e["run_id"] == f"w{worker}"]
        assert len(mine) == 20
        assert [e["details"]["i"] for e in mine if e["kind"] == "release"] == list(range(18))
    report = Ledger(path).verify()
    assert report["entries"] == 160 and report["counts"]["status"] == 8


def test_concurrent_reservations_respect_the_cap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "ledger.jsonl"
    # Give composition the latency the real accountant has (the forked workers inherit this),
    # so that reservations which did not re-read the ledger under the lock would overlap.
    compose = ledger_module.compose_at

    def slow_compose(events, delta):
        time.sleep(0.1)
        return compose(events, delta)

    monkeypatch.setattr(ledger_module, "compose_at", slow_compose)
    two = compose_epsilon([gaussian(5.0, count=2)], DELTA).epsilon
    three = compose_epsilon([gaussian(5.0, count=3)], DELTA).epsilon
    Ledger(path).set_budget("digits", (two + three) / 2, DELTA)
    codes = _run_workers(_reserve_under_cap, [(str(path), w) for w in range(6)])
    assert sorted(codes) == [0, 0, 3, 3, 3, 3]  # exactly two fit, whoever came first
    ledger = Ledger(path)
    assert ledger.events_for("digits") == (gaussian(5.0), gaussian(5.0))
    ledger.verify()
