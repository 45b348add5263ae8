"""No plain digest of the private records in anything publishable (issue 26, leak 2).

The plain SHA-256 of a data set is a membership test: whoever knows every other record can
hash the data with and without a candidate. The ledger links spends on the same records by
an HMAC of that digest under a key kept beside the ledger instead.
"""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dpsynth.cli import app
from dpsynth.data.sources import load_data, load_table
from dpsynth.errors import UsageError
from dpsynth.ledger import Ledger
from dpsynth.ledger.key import FingerprintKey, create_key, is_keyed, key_path_for
from dpsynth.privacy.accounting.compose import poisson_gaussian_event
from dpsynth.training import train_run

runner = CliRunner()
EVENT = poisson_gaussian_event(1.5, 0.05, 100)


def _files(*roots: Path) -> list[Path]:
    found = []
    for root in roots:
        found += [root] if root.is_file() else [p for p in root.rglob("*") if p.is_file()]
    return found


def _publishable(run: Path) -> list[Path]:
    """A run directory's public files: everything but `private/`."""
    return [p for p in _files(run) if "private" not in p.relative_to(run).parts]


def _holding(digest: str, files: list[Path]) -> list[str]:
    return [str(p) for p in files if digest.encode() in p.read_bytes()]


def test_nothing_publishable_holds_the_plain_digest_of_an_image_data_set(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.jsonl"
    run, synth, report = tmp_path / "run", tmp_path / "synth", tmp_path / "report"
    digest = load_data("digits").content_digest
    common = ["--ledger", str(ledger), "--device", "cpu"]
    steps = [
        ["train", "--method", "dpkernel", "--data", "digits", "--epsilon", "5", "--preset",
         "tiny", "--out", str(run)],
        ["sample", str(run), "--n", "20", "--out", str(synth)],
        ["evaluate", "--synthetic", str(synth), "--real", "digits", "--metrics", "accuracy",
         "--classifier", "logreg", "--report", str(report)],
    ]  # fmt: skip
    outputs = []
    for args in steps:
        result = runner.invoke(app, [*args, *common, "--json"])
        assert result.exit_code == 0, result.output
        outputs.append(result.stdout)
    inspect = runner.invoke(app, ["data", "inspect", "digits", "--ledger", str(ledger), "--json"])
    assert inspect.exit_code == 0, inspect.output
    outputs.append(inspect.stdout)
    # The test set is evaluated against the train split here: digits is trained on, so the
    # report also names it (by the keyed fingerprint only).
    assert _holding(digest, [*_publishable(run), *_files(synth, report, ledger)]) == []
    assert not any(digest in text for text in outputs)
    keyed = json.loads(outputs[-1])["fingerprint"]
    assert is_keyed(keyed)
    assert {e["fingerprint"] for e in Ledger(ledger).entries()} == {keyed}
    assert json.loads((run / "config.json").read_text())["data"]["fingerprint"] == keyed
    assert json.loads(outputs[2])["real_fingerprint"] == keyed
    key_file = key_path_for(ledger)
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600


def test_nothing_publishable_holds_the_plain_digest_of_a_table(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.jsonl"
    run, synth, report = tmp_path / "run", tmp_path / "synth.csv", tmp_path / "report"
    digest = load_table("german-credit").content_digest
    common = ["--ledger", str(ledger)]
    steps = [
        ["train", "--method", "dpkernel", "--data", "german-credit", "--epsilon", "5",
         "--preset", "tiny", "--out", str(run), "--device", "cpu",
         "--class-weights-epsilon", "0.5"],
        ["sample", str(run), "--n", "50", "--out", str(synth), "--device", "cpu"],
        ["evaluate", "--synthetic", str(synth), "--real", "german-credit:test", "--metrics",
         "ml", "--seeds", "1", "--report", str(report)],
    ]  # fmt: skip
    for args in steps:
        result = runner.invoke(app, [*args, *common, "--json"])
        assert result.exit_code == 0, result.output
        assert digest not in result.stdout
    manifest = next(tmp_path.glob("synth*.json"))
    files = [*_publishable(run), *_files(synth, manifest, report, ledger)]
    assert _holding(digest, files) == []
    # the schema release and the training spend name the same (keyed) data
    assert len({e["fingerprint"] for e in Ledger(ledger).entries() if "fingerprint" in e}) == 1


def test_one_row_less_is_another_fingerprint_and_the_same_rows_link_under_another_id(
    tmp_path: Path,
) -> None:
    ledger = Ledger(tmp_path / "ledger.jsonl")
    full = load_data("digits")
    fewer = full.x[1:], full.y[1:]
    from dpsynth.data.images import image_content_digest

    a = ledger.data_fingerprint(full.content_digest)
    b = ledger.data_fingerprint(image_content_digest(*fewer, full.classes))
    assert a is not None and b is not None and a != b
    assert ledger.data_fingerprint(full.content_digest) == a  # stable under one key
    # under another ledger's key the same records get another fingerprint
    other = Ledger(tmp_path / "other.jsonl").data_fingerprint(full.content_digest)
    assert other != a
    ledger.reserve(
        dataset_id="hospital", fingerprint=a, command="train", method="pge", run_id="r1",
        events=[EVENT], delta=1e-5,
    )  # fmt: skip
    # the same records under a new id never get a fresh budget
    assert ledger.events_for("renamed", a) == (EVENT.to_json(),)


def test_a_ledger_without_its_key_refuses_to_fingerprint(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    ledger = Ledger(path)
    fingerprint = ledger.data_fingerprint("ab" * 32)
    assert fingerprint is not None
    ledger.reserve(
        dataset_id="d", fingerprint=fingerprint, command="train", method="pge", run_id="r",
        events=[EVENT], delta=1e-5,
    )  # fmt: skip
    key_path_for(path).unlink()
    with pytest.raises(UsageError, match="missing: restore that file"):
        Ledger(path).data_fingerprint("ab" * 32)
    with pytest.raises(UsageError, match="missing"):  # looking up without creating, too
        Ledger(path).data_fingerprint("ab" * 32, create=False)
    # a different key is refused as well (its fingerprints would link nothing)
    create_key(key_path_for(path))
    with pytest.raises(UsageError, match="not the key this ledger"):
        Ledger(path).data_fingerprint("ab" * 32)
    # verification needs no key
    assert Ledger(path).verify()["ok"]


def test_a_missing_key_is_refused_by_train_before_anything_is_spent(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    kwargs = dict(
        method="dpkernel", data="digits", epsilon=5, preset="tiny", ledger_path=path,
        device="cpu", stop_after_steps=1,
    )  # fmt: skip
    train_run(out=tmp_path / "a", **kwargs)
    key_path_for(path).unlink()
    entries = len(Ledger(path).entries())
    with pytest.raises(UsageError, match="key"):
        train_run(out=tmp_path / "b", **kwargs)
    assert len(Ledger(path).entries()) == entries


@pytest.mark.parametrize(
    ("preset", "epsilon", "refusal"),
    # a setting refused, then a plan that cannot be made
    [("bogus", 5, "preset"), ("tiny", 1e-9, "noise multiplier")],
)
def test_a_refused_train_leaves_no_ledger_key_behind(
    tmp_path: Path, preset: str, epsilon: float, refusal: str
) -> None:
    path = tmp_path / "ledger.jsonl"
    kwargs = dict(
        method="dpkernel", data="digits", preset=preset, ledger_path=path, device="cpu",
        stop_after_steps=1,
    )  # fmt: skip
    with pytest.raises(UsageError, match=refusal):
        train_run(out=tmp_path / "refused", epsilon=epsilon, **kwargs)
    assert not key_path_for(path).exists() and not path.exists()
    # the first command that goes on makes the key, and its spend is fingerprinted with it
    train_run(out=tmp_path / "run", epsilon=5, **{**kwargs, "preset": "tiny"})
    assert key_path_for(path).exists()
    (spend,) = Ledger(path).entries()[:1]
    assert is_keyed(spend["fingerprint"])


def test_a_spend_on_records_a_legacy_ledger_knew_by_plain_digest_links_to_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / "ledger.jsonl"
    digest = "cd" * 32
    old = Ledger(path)
    old.reserve(  # as dpsynth 0.1 wrote it: the plain digest
        dataset_id="hospital", fingerprint=digest, command="train", method="pge", run_id="r0",
        events=[EVENT], delta=1e-5,
    )  # fmt: skip
    ledger = Ledger(path)
    keyed = ledger.data_fingerprint(digest)
    assert keyed is not None and keyed != digest
    assert ledger.events_for("renamed", keyed) == (EVENT.to_json(),)  # linked in memory
    line = ledger.reserve(
        dataset_id="renamed", fingerprint=keyed, command="train", method="pge", run_id="r1",
        events=[EVENT], delta=1e-5,
    )  # fmt: skip
    assert line["links"] == [0] and digest not in json.dumps(line)
    # the link is in the file: a reader without the key composes both, and verify agrees
    fresh = Ledger(path)
    assert fresh.events_for("renamed") == (EVENT.to_json(), EVENT.to_json())
    assert fresh.verify()["ok"]


def test_concurrent_first_uses_share_one_key(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl.key"
    first = create_key(path)
    second = create_key(path)  # loses the race: reads the key on disk
    assert first.key_id == second.key_id
    assert first.fingerprint("00") == second.fingerprint("00")
    assert FingerprintKey.fresh().key_id != first.key_id


def test_verify_names_the_lines_that_hold_a_plain_digest(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    old = Ledger(path)
    old.reserve(  # as dpsynth 0.1 wrote it
        dataset_id="a", fingerprint="ab" * 32, command="train", method="pge", run_id="r0",
        events=[EVENT], delta=1e-5,
    )  # fmt: skip
    keyed = old.data_fingerprint("cd" * 32)
    assert keyed is not None
    old.reserve(
        dataset_id="b", fingerprint=keyed, command="train", method="pge", run_id="r1",
        events=[EVENT], delta=1e-5,
    )  # fmt: skip
    assert Ledger(path).verify()["plain_digest_seqs"] == [0]
    shown = runner.invoke(app, ["ledger", "verify", "--ledger", str(path)])
    assert shown.exit_code == 0 and "do not publish this ledger as it is; lines 0" in shown.stdout
