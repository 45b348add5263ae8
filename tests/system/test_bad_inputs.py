"""Bad inputs a new user might type, as a table: each must end in one clear line on stderr with
the right exit code, and leave everything already on disk exactly as it was.

Every case runs in a fresh copy of one prepared folder (a tiny trained run, its ledger, a
`sample` output, user files) with that copy as the current directory, so that a command that
deletes or writes something it should not is caught by comparing the whole tree before and
after. Ledger lock files (`*.lock`, empty sidecars) are left out of the comparison.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from typer.testing import CliRunner

from dpsynth.cli import app
from dpsynth.ledger import Ledger
from dpsynth.ledger import spends as ledger_module
from dpsynth.sampling import generate, label_chunks, parse_labels, sample_run
from dpsynth.staging import remove_stale_staging
from dpsynth.training import train_run

runner = CliRunner()

TRAIN = (
    "train --method dpkernel --data digits --epsilon 5 --preset tiny --out newrun --device cpu "
    "--ledger ledger.jsonl"
)
TRAIN_PGE = TRAIN.replace("dpkernel", "pge")
SAMPLE = "sample run --n 10 --device cpu --ledger ledger.jsonl"
EVALUATE = (
    "evaluate --synthetic samples --real digits:test --metrics accuracy --classifier logreg "
    "--seeds 1 --device cpu --ledger ledger.jsonl"
)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny dpkernel run on digits, its ledger, a sample folder and assorted user files."""
    base = tmp_path_factory.mktemp("prepared")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train_run(
            method="dpkernel", data="digits", epsilon=1.0, preset="tiny", out=base / "run",
            ledger_path=base / "ledger.jsonl", device="cpu",
        )  # fmt: skip
        sample_run(
            base / "run", 10, base / "samples", ledger_path=base / "ledger.jsonl", device="cpu"
        )
    finally:
        torch.set_num_threads(threads)
    shutil.copytree(base / "samples", base / "samples_plus")
    (base / "samples_plus" / "mine.txt").write_text("a file sample did not write\n")
    (base / "notes.txt").write_text("the user's own notes\n")
    (base / "empty.txt").write_bytes(b"")
    (base / "text.npz").write_text("hello, not an archive\n")
    (base / "user").mkdir()
    (base / "user" / "keep.txt").write_text("keep me\n")
    (base / "ldir").mkdir()
    (base / "ldir" / "inside.txt").write_text("a folder given as --ledger\n")
    (base / "book").mkdir()
    shutil.copy(base / "ledger.jsonl", base / "book" / "ledger.jsonl")
    for name in ("a", "b"):
        (base / "imgs" / name).mkdir(parents=True)
        Image.fromarray(np.full((4, 4), 80, np.uint8)).save(base / "imgs" / name / "0.png")
    lines = (base / "ledger.jsonl").read_bytes().splitlines(keepends=True)
    (base / "torn.jsonl").write_bytes(b"".join(lines[:-1]) + lines[-1][:-20])
    edited = lines[0].replace(b'"command":"train"', b'"command":"other"')
    assert edited != lines[0]
    (base / "edited.jsonl").write_bytes(edited + b"".join(lines[1:]))
    return base


def snapshot(root: Path) -> dict[str, str]:
    """Every path under `root` (hidden ones too) with the SHA-256 of its content."""
    out = {}
    for path in sorted(root.rglob("*")):
        if path.name.endswith(".lock"):
            continue
        key = str(path.relative_to(root))
        out[key] = "dir" if path.is_dir() else hashlib.sha256(path.read_bytes()).hexdigest()
    return out


@pytest.fixture
def workdir(prepared: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh copy of the prepared folder, made the current directory."""
    case = tmp_path / "case"
    shutil.copytree(prepared, case)
    monkeypatch.chdir(case)
    monkeypatch.delenv("DPSYNTH_LEDGER", raising=False)
    return case


# (command line, exit code, phrase of the one error line)
CASES: list[tuple[str, int, str]] = [
    # calibrate
    ("calibrate --steps abc", 2, "Invalid value for '--steps'"),
    ("calibrate", 2, "give --sampling-rate"),
    ("calibrate --epsilon 1 --sampling-rate 0.01", 2, "needs --steps"),
    ("calibrate --noise-multiplier 1 --sampling-rate 0.01", 2, "needs --steps"),
    ("calibrate --epsilon 1 --batch-size 5000 --dataset-size 1437 --steps 10", 2, "exceeds"),
    ("calibrate --epsilon -1 --sampling-rate 0.01 --steps 10", 2, "epsilon"),
    ("calibrate --epsilon 1 --delta 2 --sampling-rate 0.01 --steps 10", 2, "delta"),
    ("calibrate --epsilon 1 --sampling-rate 1.5 --steps 10", 2, "sampling rate"),
    ("calibrate --epsilon 1 --sampling-rate 0.01 --steps 0", 2, "steps"),
    ("calibrate --epsilon 1 --sampling-rate 0.01 --steps 10 --epochs 1", 2, "either --steps"),
    ("calibrate --nope", 2, "No such option"),
    (
        "calibrate --epsilon 1 --sampling-rate 0.01 --steps 10 --dataset digits --ledger ldir",
        2,
        "is a folder",
    ),
    # train: every bad value fails before the reservation (no ledger line, no run dir)
    (f"{TRAIN} --set lr=-1", 2, "lr: must be positive"),
    (f"{TRAIN} --set lr=nan", 2, "lr: must be a finite number"),
    (f"{TRAIN_PGE} --set lr=inf", 2, "lr: must be a finite number"),
    (f"{TRAIN} --set batch_size=5000", 2, "exceeds the data set's 1437 records"),
    (f"{TRAIN_PGE} --set batch_size=0", 2, "batch_size"),
    (f"{TRAIN} --set steps=0", 2, "steps"),
    (f"{TRAIN} --set steps=100000000000", 2, "steps: must be in"),
    (f"{TRAIN_PGE} --set max_grad_norm=-1", 2, "max_grad_norm: must be positive"),
    (f"{TRAIN_PGE} --set ema=2", 2, "ema: must be in [0, 1]"),
    (f"{TRAIN_PGE} --set attn_levels=5", 2, "attn_levels"),
    (f"{TRAIN_PGE} --set ch_mult=0", 2, "ch_mult"),
    (f"{TRAIN} --set jitter=nan", 2, "jitter"),
    (f"{TRAIN} --set bandwidths=-1", 2, "bandwidths"),
    (f"{TRAIN} --set optimizer=sgd", 2, "optimizer"),
    (f"{TRAIN} --set nonsense=1", 2, "unknown setting"),
    (f"{TRAIN} --set lr", 2, "key=value"),
    (f"{TRAIN} --set steps=1.5", 2, "expected int"),
    (f"{TRAIN} --checkpoint-every -5", 2, "--checkpoint-every"),
    (f"{TRAIN} --checkpoint-every nan", 2, "--checkpoint-every"),
    (f"{TRAIN} --seed abc", 2, "Invalid value for '--seed'"),
    (f"{TRAIN} --seed 18446744073709551616", 2, "64 bits"),
    (TRAIN.replace("newrun", "run"), 2, "--resume"),
    (TRAIN.replace("newrun", "empty.txt"), 2, "is a file"),
    (TRAIN.replace("newrun", "empty.txt/sub"), 2, "is a file, not a folder"),
    (TRAIN.replace("digits", "npz:text.npz"), 4, "not an .npz file"),
    (TRAIN.replace("digits", "folder:missing"), 2, "no such file or folder"),
    (f"{TRAIN} --image-size 100000", 2, "at most 1024"),
    (f"{TRAIN} --image-size 0", 2, "positive integer"),
    (TRAIN.replace("--epsilon 5", "--epsilon abc"), 2, "--epsilon"),
    (TRAIN.replace("--epsilon 5", "--epsilon 0"), 2, "positive"),
    (f"{TRAIN} --delta 2", 2, "delta"),
    (TRAIN.replace("dpkernel", "nope"), 2, "unknown method"),
    (TRAIN.replace("tiny", "huge"), 2, "unknown preset"),
    (TRAIN.replace("cpu", "tpu"), 2, "--device"),
    (TRAIN.replace("ledger.jsonl", "ldir"), 2, "is a folder"),
    ("train --resume --out user --ledger ledger.jsonl", 2, "not a dpsynth run directory"),
    ("train --data digits --epsilon 1 --out newrun", 2, "missing --method"),
    # sample: --force never replaces anything sample did not write
    (f"{SAMPLE} --out . --force", 2, "current directory"),
    (f"{SAMPLE} --out .. --force", 2, "current directory"),
    (f"{SAMPLE} --out run --force", 2, "the run directory"),
    (f"{SAMPLE} --out samples_plus --force", 2, "did not write"),
    (f"{SAMPLE} --out user --force", 2, "did not write"),
    ("sample run --n 10 --device cpu --ledger book/ledger.jsonl --out book --force", 2, "ledger"),
    (f"{SAMPLE} --out samples", 2, "use --force"),
    (f"{SAMPLE} --out empty.txt", 2, "is a file"),
    (f"{SAMPLE} --out empty.txt --force", 2, "is a file"),
    (f"{SAMPLE} --out notes.txt/sub", 2, "is a file, not a folder"),
    (SAMPLE.replace("--n 10", "--n 0") + " --out new", 2, "--n must be at least 1"),
    (SAMPLE.replace("--n 10", "--n abc") + " --out new", 2, "Invalid value for '--n'"),
    (SAMPLE.replace("--n 10", "--n 10000000000") + " --out new", 2, "at most"),
    (f"{SAMPLE} --out new --format gif", 2, "--format"),
    (f"{SAMPLE} --out new --batch-size 0", 2, "--batch-size"),
    (f"{SAMPLE} --out new --labels 1,2", 2, "--labels needs 10"),
    (f"{SAMPLE} --out new --labels a,b", 2, "--labels must be"),
    (f"{SAMPLE} --out new --labels 1,1,1,1,1,1,1,1,1,2", 2, "sum to 11"),
    (f"{SAMPLE} --out new --device tpu", 2, "--device"),
    (SAMPLE.replace("ledger.jsonl", "ldir") + " --out new", 2, "is a folder"),
    ("sample user --n 10 --out new --ledger ledger.jsonl", 2, "not a dpsynth run directory"),
    ("sample run --out new", 2, "Missing option '--n'"),
    # evaluate
    (f"{EVALUATE} --report empty.txt", 2, "is a file"),
    (f"{EVALUATE} --report user", 2, "did not write"),
    (f"{EVALUATE} --report .", 2, "current directory"),
    (f"{EVALUATE} --seeds abc", 2, "Invalid value for '--seeds'"),
    (f"{EVALUATE} --n 0", 2, "--n must be at least 1"),
    (EVALUATE.replace("accuracy", "nope"), 2, "nope"),
    (EVALUATE.replace("ledger.jsonl", "ldir"), 2, "is a folder"),
    ("evaluate --synthetic samples", 2, "Missing option '--real'"),
    # ledger
    ("ledger show --ledger ldir", 2, "is a folder"),
    ("ledger verify --ledger ldir", 2, "is a folder"),
    ("ledger budget --dataset digits --epsilon 1 --delta 1e-5 --ledger ldir", 2, "is a folder"),
    ("ledger verify --ledger missing.jsonl", 2, "no ledger at missing.jsonl"),
    (
        "ledger budget --dataset digits --epsilon 1 --delta 1e-5 --ledger notes.txt/l.jsonl",
        2,
        "cannot write to it",
    ),
    (TRAIN.replace("ledger.jsonl", "notes.txt/l.jsonl"), 2, "cannot write to it"),
    ("ledger verify --ledger torn.jsonl", 1, "incomplete last line"),
    ("ledger show --ledger torn.jsonl", 1, "incomplete last line"),
    ("ledger verify --ledger edited.jsonl", 1, "hash mismatch"),
    ("ledger show --ledger text.npz", 1, "not valid JSON"),
    (
        "ledger budget --dataset digits --epsilon -1 --delta 1e-5 --ledger ledger.jsonl",
        2,
        "positive",
    ),
    ("ledger budget --dataset digits --epsilon 1 --delta 2 --ledger ledger.jsonl", 2, "delta"),
    ("ledger budget --dataset digits --epsilon 1", 2, "Missing option '--delta'"),
    ("ledger budget --dataset digits --epsilon abc --delta 1e-5", 2, "'--epsilon'"),
    ("ledger show --nope", 2, "No such option"),
    ("ledger nope", 2, "No such command"),
    # data
    ("data inspect folder:imgs --image-size 100000", 2, "at most 1024"),
    ("data inspect digits --image-size 0", 2, "positive integer"),
    ("data inspect npz:text.npz", 4, "not an .npz file"),
    ("data inspect npz:missing.npz", 2, "no such file or folder"),
    ("data inspect folder:missing", 2, "no such file or folder"),
    ("data inspect", 2, "Missing argument"),
    ("data list --nope", 2, "No such option"),
    ("data nope", 2, "No such command"),
    # the app itself
    ("nope", 2, "No such command"),
    ("--nope", 2, "No such option"),
]


def test_the_table_covers_every_command():
    commands = {
        " ".join(args.split()[:2]) if args.split()[0] in ("ledger", "data") else args.split()[0]
        for args, _, _ in CASES
    }
    expected = {"calibrate", "train", "sample", "evaluate", "ledger show", "ledger verify"}
    expected |= {"ledger budget", "data list", "data inspect"}
    assert expected <= commands
    assert len(CASES) >= 60


@pytest.mark.parametrize(("args", "code", "phrase"), CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_and_changes_nothing(
    workdir: Path, args: str, code: int, phrase: str
) -> None:
    before = snapshot(workdir)
    result = runner.invoke(app, shlex.split(args))
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error:"), lines[0]
    assert phrase in lines[0], lines[0]
    assert snapshot(workdir) == before
    assert Path.cwd() == workdir


# ----------------------------------------------------------------- beyond the table


def invoke(*args: str):
    return runner.invoke(app, list(args))


def test_force_still_replaces_an_earlier_sample_output(workdir: Path, one_torch_thread) -> None:
    old = json.loads((workdir / "samples" / "manifest.json").read_text())
    result = invoke(*shlex.split(SAMPLE), "--n", "7", "--out", "samples", "--force")
    assert result.exit_code == 0, result.output
    manifest = json.loads((workdir / "samples" / "manifest.json").read_text())
    assert manifest["n"] == 7 and old["n"] == 10
    assert len(list((workdir / "samples").glob("*/*.png"))) == 7
    assert not [p for p in workdir.iterdir() if ".dpsynth-" in p.name]


def test_stale_staging_of_a_dead_process_is_removed(workdir: Path, one_torch_thread) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = workdir / f".out.dpsynth-{dead.pid}-abc123.tmp"
    stale.mkdir()
    (stale / "half.png").write_bytes(b"partial")
    live = workdir / f".other.dpsynth-{os.getpid()}-xyz789.tmp"
    live.mkdir()
    result = invoke(*shlex.split(SAMPLE), "--out", "out")
    assert result.exit_code == 0, result.output
    assert not stale.exists()
    assert live.is_dir()  # its writer (this process) is alive: not ours to remove


def test_an_output_moved_aside_by_a_killed_replace_is_moved_back(tmp_path: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    aside = tmp_path / f".synth.dpsynth-{dead.pid}-abc123.old"
    aside.mkdir()
    (aside / "manifest.json").write_text("{}")
    remove_stale_staging(tmp_path)
    assert (tmp_path / "synth" / "manifest.json").read_text() == "{}"
    assert not aside.exists()


def test_sigterm_removes_the_staging_folder(workdir: Path) -> None:
    command = [
        sys.executable, "-c", "from dpsynth.cli import main; main()",
        *shlex.split(SAMPLE.replace("--n 10", "--n 5000000")), "--format", "npz", "--out", "big",
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not list(workdir.glob(".big.dpsynth-*.tmp")):
            assert process.poll() is None, process.stderr.read() if process.stderr else ""
            assert time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(0.3)
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 130, err
    assert err.strip() == "interrupted"
    assert not list(workdir.glob(".big.*")) and not (workdir / "big").exists()


def test_a_complete_last_line_without_newline_is_an_entry(workdir: Path) -> None:
    path = workdir / "ledger.jsonl"
    entries = len(path.read_bytes().splitlines())
    path.write_bytes(path.read_bytes().rstrip(b"\n"))
    ok = invoke("ledger", "verify", "--ledger", str(path), "--json")
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.stdout)["entries"] == entries
    budget = invoke(
        "ledger", "budget", "--dataset", "digits", "--epsilon", "9", "--delta", "1e-5",
        "--ledger", str(path),
    )  # fmt: skip
    assert budget.exit_code == 0, budget.output
    raw = path.read_bytes()
    assert raw.endswith(b"\n") and len(raw.splitlines()) == entries + 1
    assert all(json.loads(line) for line in raw.splitlines())
    again = invoke("ledger", "verify", "--ledger", str(path), "--json")
    assert again.exit_code == 0 and json.loads(again.stdout)["entries"] == entries + 1


def _deny(monkeypatch: pytest.MonkeyPatch, target: Path, writing: bool) -> None:
    """Make the OS refuse opening `target` (for writing only, or at all) as it does for
    another user's file; tests run as root here, where chmod does not stop anything."""
    real_open = os.open

    def fake_open(path, flags, *args, **kwargs):
        wants_write = flags & (os.O_WRONLY | os.O_RDWR)
        if Path(path).absolute() == target and (wants_write or not writing):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, flags, *args, **kwargs)

    def fake_builtin_open(path, mode="r", *args, **kwargs):
        if Path(path).absolute() == target and not writing:
            raise PermissionError(13, "Permission denied", str(path))
        return open(path, mode, *args, **kwargs)

    monkeypatch.setattr(ledger_module.os, "open", fake_open)
    monkeypatch.setattr(ledger_module, "open", fake_builtin_open, raising=False)


def test_an_unreadable_ledger_is_exit_4(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _deny(monkeypatch, workdir / "ledger.jsonl", writing=False)
    for args in (["ledger", "show"], ["ledger", "verify"]):
        result = invoke(*args, "--ledger", "ledger.jsonl")
        assert result.exit_code == 4, result.output
        assert result.stderr.strip().splitlines() == [
            "error: ledger ledger.jsonl: cannot read it (Permission denied)"
        ]


def test_a_read_only_ledger_is_exit_2_and_nothing_is_written(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = snapshot(workdir)
    _deny(monkeypatch, workdir / "ledger.jsonl", writing=True)
    budget = invoke(
        "ledger", "budget", "--dataset", "digits", "--epsilon", "9", "--delta", "1e-5",
        "--ledger", "ledger.jsonl",
    )  # fmt: skip
    assert budget.exit_code == 2, budget.output
    assert "cannot write to it" in budget.stderr and len(budget.stderr.splitlines()) == 1
    train = invoke(*shlex.split(TRAIN), "--epsilon", "9")
    assert train.exit_code == 2, train.output
    assert snapshot(workdir) == before  # no run dir, no ledger line


def test_labels_are_made_per_batch_in_the_same_order() -> None:
    counts = [3, 0, 5, 2]
    chunks = list(label_chunks(counts, 4))
    assert [len(c) for c in chunks] == [4, 4, 2]
    assert torch.equal(torch.cat(chunks), parse_labels("3,0,5,2", 10, 4))
    # A trillion labels: the first batch comes at once, nothing of size N is built.
    first = next(label_chunks([10**12, 10**12], 500))
    assert first.shape == (500,) and int(first.max()) == 0


def test_streamed_npz_holds_what_generate_makes(workdir: Path, one_torch_thread) -> None:
    result = invoke(
        *shlex.split(SAMPLE.replace("--n 10", "--n 23")), "--out", "n", "--format", "npz"
    )
    assert result.exit_code == 0, result.output
    with np.load(workdir / "n" / "samples.npz") as archive:
        x, y, classes = archive["x"], archive["y"], archive["classes"]
    images, labels, names = generate(workdir / "run", 23, device="cpu")
    assert np.array_equal(x, images.numpy()) and np.array_equal(y, labels.numpy())
    assert y.dtype == np.int64 and list(classes) == list(names)
    manifest = json.loads((workdir / "n" / "manifest.json").read_text())
    digest = hashlib.sha256(b"samples.npz\0" + hashlib.sha256(
        (workdir / "n" / "samples.npz").read_bytes()).digest()).hexdigest()  # fmt: skip
    assert manifest["output_sha256"] == digest
    assert Ledger(workdir / "ledger.jsonl").entries()[-1]["output_sha256"] == digest
