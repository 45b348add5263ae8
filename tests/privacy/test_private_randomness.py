"""Secret DP randomness (issue 9.1) and nothing noise-free from private batches in a run (9.6)."""

from __future__ import annotations

import json
import math
import stat

import pytest
import torch
from loop_backend import TemplateTrainer
from safetensors.torch import load_file

from dpsynth.errors import DataError, DpsynthError, UsageError
from dpsynth.methods import registry
from dpsynth.privacy.mechanisms.randomness import PrivateRandomness, derive_seed
from dpsynth.rundir import RunDir
from dpsynth.sampling import sample_run
from dpsynth.training import train_run

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(autouse=True)
def template_backend(monkeypatch):
    monkeypatch.setitem(registry._BACKENDS, "templates", "loop_backend:TemplateMethod")


def train(tmp_path, name, method="templates", steps=None, **kwargs):
    args = dict(
        method=method, data="digits", epsilon=5.0, preset="tiny", out=tmp_path / name,
        ledger_path=tmp_path / f"{name}.jsonl", device="cpu", seed=3,
    )  # fmt: skip
    if steps is not None:
        args["overrides"] = {"steps": steps}
    args.update(kwargs)
    return train_run(**args)


def public_tensors(run) -> dict[str, torch.Tensor]:
    return load_file(str(run / "checkpoint.safetensors"))


def private_log(run) -> list[dict]:
    return [json.loads(x) for x in (run / "private" / "train-loss.jsonl").read_text().splitlines()]


# ---- the randomness type -------------------------------------------------------------------


def test_streams_are_keyed_by_the_whole_secret_and_the_purpose():
    def draws(secret: int, purpose: str) -> torch.Tensor:
        return torch.rand(8, generator=PrivateRandomness(secret).generator(purpose))

    assert torch.equal(draws(5, "a"), draws(5, "a"))
    assert not torch.equal(draws(5, "a"), draws(5, "b"))
    assert not torch.equal(draws(5, "a"), draws(6, "a"))
    # Secrets that differ only above bit 64 give different streams.
    assert not torch.equal(draws(1, "a"), draws(1 + 2**100, "a"))
    # A CPU generator keeps only 32 bits of manual_seed; the keyed one is not that stream.
    plain = torch.Generator().manual_seed(derive_seed(5, "a"))
    assert not torch.equal(draws(5, "a"), torch.rand(8, generator=plain))


def test_fresh_secrets_differ_and_are_never_printed():
    a, b = PrivateRandomness.fresh(), PrivateRandomness.fresh()
    assert a.to_json()["secret"] != b.to_json()["secret"]
    assert len(a.to_json()["secret"]) == 32  # 128 bits
    assert a.to_json()["secret"] not in repr(a)
    assert PrivateRandomness.from_json(a.to_json()).to_json() == a.to_json()
    with pytest.raises(DataError):
        PrivateRandomness.from_json({"format": "other", "secret": "00"})


def test_a_stream_is_handed_out_once_and_its_state_restores_exactly():
    randomness = PrivateRandomness(9)
    gen = randomness.generator("noise")
    with pytest.raises(DpsynthError):
        randomness.generator("noise")
    saved = randomness.state()
    first = torch.randn(4, generator=gen)
    randomness.load_state(saved)
    assert torch.equal(first, torch.randn(4, generator=gen))
    with pytest.raises(DataError):
        PrivateRandomness(9).load_state(saved)  # no "noise" stream handed out there


# ---- two runs with the same --seed --------------------------------------------------------


@pytest.mark.parametrize("method,steps", [("templates", None), ("pge", 3), ("dpkernel", 3)])
def test_same_seed_runs_draw_different_batches_and_noise(tmp_path, method, steps):
    runs = {}
    for name, secret in (("a", None), ("b", None), ("c", 2**120 + 1), ("d", 2**120 + 1)):
        train(tmp_path, name, method, steps, log_private_loss=True, privacy_seed=secret)
        runs[name] = public_tensors(tmp_path / name)
    weights = [k for k in runs["a"] if "weight" in k and runs["a"][k].is_floating_point()]
    assert weights

    def same(x: str, y: str) -> bool:
        return all(torch.equal(runs[x][k], runs[y][k]) for k in weights)

    assert not same("a", "b")  # same --seed, same data: different noise and batches
    assert same("c", "d")  # what differs between a and b is the secret alone
    if method == "pge":  # the realised batch sizes are in PGE's private stats
        sizes = {n: [r["batch_size"] for r in private_log(tmp_path / n)] for n in "abcd"}
        assert sizes["c"] == sizes["d"]
        assert sizes["a"] != sizes["b"]


def test_same_secret_gives_the_same_batches_different_secret_different(tmp_path):
    # The Poisson sampler draws from the secret: compare the realised batches directly.
    from dpsynth.privacy.mechanisms.poisson import PoissonSampler

    def batches(randomness: PrivateRandomness) -> list[list[int]]:
        sampler = PoissonSampler(1000, 0.05, randomness.generator("loop/batches"))
        return [sampler.next().tolist() for _ in range(3)]

    assert batches(PrivateRandomness(4)) == batches(PrivateRandomness(4))
    assert batches(PrivateRandomness(4)) != batches(PrivateRandomness(5))


# ---- resume ----------------------------------------------------------------------------------


def test_resumed_run_equals_its_uninterrupted_run_with_the_same_secret(tmp_path):
    secret = 0xFEEDFACE_CAFEBEEF_00000000_12345678
    train(tmp_path, "straight", privacy_seed=secret)
    train(tmp_path, "cut", privacy_seed=secret, stop_after_steps=4)
    # The resumed run reads its secret from private/, whatever is passed here.
    train(tmp_path, "cut", resume=True, ledger_path=tmp_path / "cut.jsonl")
    a, b = public_tensors(tmp_path / "straight"), public_tensors(tmp_path / "cut")
    assert torch.equal(a["trainer/weight"], b["trainer/weight"])
    other = train(tmp_path, "other", privacy_seed=secret + 1)
    assert other["steps"] == 12
    assert not torch.equal(
        a["trainer/weight"], public_tensors(tmp_path / "other")["trainer/weight"]
    )


def test_resume_without_the_private_secret_is_refused(tmp_path):
    train(tmp_path, "cut", stop_after_steps=3)
    (tmp_path / "cut" / "private" / "secret.json").unlink()
    with pytest.raises(UsageError, match="secret"):
        train(tmp_path, "cut", resume=True)


def test_private_state_survives_a_crash_between_the_two_checkpoint_writes(tmp_path):
    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    run.save_checkpoint(
        {"w": torch.ones(2)}, {"step": 5}, private_state={"generators": {"x": "05"}}
    )
    # The private file is written first; suppose the weights write of step 8 then failed.
    run._save_private_state(8, {"generators": {"x": "08"}})
    _, state = run.load_checkpoint()
    assert run.load_private_state(state["step"]) == {"generators": {"x": "05"}}
    run.save_checkpoint(
        {"w": torch.ones(2)}, {"step": 9}, private_state={"generators": {"x": "09"}}
    )
    assert run.load_private_state(9) == {"generators": {"x": "09"}}


def test_a_backend_that_publishes_a_secret_stream_state_is_stopped(tmp_path, monkeypatch):
    def leaky_state(self):
        return {"weight": self.model.weight.detach().clone(), "rng": self.rng.get_state()}

    monkeypatch.setattr(TemplateTrainer, "state_tensors", leaky_state)
    with pytest.raises(DpsynthError, match="secret random stream"):
        train(tmp_path, "leak")
    assert not (tmp_path / "leak" / "checkpoint.safetensors").exists()


# ---- nothing secret outside RUN/private -------------------------------------------------------


def _secret_forms(value: int, width_bytes: int) -> list[bytes]:
    forms = [str(value).encode(), f"{value:x}".encode(), f"{value:X}".encode()]
    forms += [f"{value:0{2 * width_bytes}x}".encode()]
    forms += [value.to_bytes(width_bytes, "big"), value.to_bytes(width_bytes, "little")]
    return forms


@pytest.mark.parametrize("method,steps", [("templates", None), ("pge", 2), ("dpkernel", 2)])
def test_the_secret_and_its_streams_appear_in_no_file_outside_private(tmp_path, method, steps):
    secret = 0x9E3779B97F4A7C15F39CC0605CEDC834
    result = train(tmp_path, "run", method, steps, privacy_seed=secret, log_private_loss=True)
    assert result["ledger_status"] == "completed"
    run = tmp_path / "run"
    sample_run(run, 12, tmp_path / "synth", device="cpu", ledger_path=tmp_path / "run.jsonl")
    private = run / "private"
    secret_file = private / "secret.json"
    assert stat.S_IMODE(secret_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(private.stat().st_mode) == 0o700
    assert f"{secret:032x}".encode() in secret_file.read_bytes()  # the search below is real

    needles = _secret_forms(secret, 16)
    states = json.loads((private / "random-state.json").read_text())["by_step"]
    purposes = {p for entry in states.values() for p in entry["generators"]}
    assert "loop/batches" in purposes and len(purposes) >= 2  # the backend's own streams too
    for purpose in purposes:
        needles += _secret_forms(derive_seed(secret, purpose), 8)
    # The generator states themselves: any 32 bytes of them must not be published.
    for entry in states.values():
        for hex_state in entry["generators"].values():
            raw = bytes.fromhex(hex_state)
            needles += [raw[24 + i : 56 + i] for i in range(0, 4096, 512)]
            needles.append(hex_state[48:112].encode())

    published = [p for p in tmp_path.rglob("*") if p.is_file() and private not in p.parents]
    assert any(p.name == "checkpoint.safetensors" for p in published)
    assert any(p.name == "manifest.json" for p in published)
    assert any(p.suffix == ".jsonl" and p.parent == tmp_path for p in published)  # the ledger
    for path in published:
        data = path.read_bytes()
        for needle in needles:
            assert needle not in data, (path, needle[:16])


# ---- 9.6: no loss of private batches in the run dir by default --------------------------------


@pytest.mark.parametrize("method,steps", [("templates", None), ("pge", 2), ("dpkernel", 2)])
def test_private_losses_are_opt_in_and_only_in_the_private_folder(tmp_path, method, steps):
    shown: list = []
    train(tmp_path, "quiet", method, steps, progress=shown.append)
    quiet = tmp_path / "quiet"
    assert shown and all(p.loss is None for p in shown)  # the progress bar has no loss either
    for record in (json.loads(x) for x in (quiet / "train-log.jsonl").read_text().splitlines()):
        assert "loss" not in record and "batch_size" not in record, record
        assert {"step", "epsilon"} <= set(record.keys())
        released = set(record) - {"step", "epsilon"}
        assert released <= {"yy_term", "released_grad_norm"}, record  # dpkernel's releases
    assert not (quiet / "private" / "train-loss.jsonl").exists()
    for path in quiet.glob("*"):
        if path.is_file() and path.suffix in (".json", ".jsonl"):
            assert b'"loss"' not in path.read_bytes(), path

    shown.clear()
    train(tmp_path, "loud", method, steps, progress=shown.append, log_private_loss=True)
    loud = tmp_path / "loud"
    losses = [r["loss"] for r in private_log(loud)]
    assert losses and all(v is None or math.isfinite(v) for v in losses)
    assert any(v is not None for v in losses)
    assert any(p.loss is not None for p in shown)
    assert b'"loss"' not in (loud / "train-log.jsonl").read_bytes()


def test_cli_log_private_loss_flag(tmp_path):
    from typer.testing import CliRunner

    from dpsynth.cli import app

    # Two independent runs, one ledger each: the second would otherwise get only the
    # headroom the first left (under the 0.5% of ε a run needs).
    args = ["train", "--method", "templates", "--data", "digits", "--epsilon", "4",
            "--preset", "tiny", "--device", "cpu", "--json"]  # fmt: skip
    runner = CliRunner()
    plain = runner.invoke(
        app, [*args, "--out", str(tmp_path / "plain"), "--ledger", str(tmp_path / "p.jsonl")]
    )
    assert plain.exit_code == 0, plain.output
    assert not (tmp_path / "plain" / "private" / "train-loss.jsonl").exists()
    assert (tmp_path / "plain" / "private" / "secret.json").is_file()
    secret = json.loads((tmp_path / "plain" / "private" / "secret.json").read_text())["secret"]
    for name in ("config.json", "train-log.jsonl", "state.json"):
        assert secret not in (tmp_path / "plain" / name).read_text(), name
    loud = runner.invoke(
        app,
        [*args, "--out", str(tmp_path / "loud"), "--ledger", str(tmp_path / "l.jsonl"),
         "--log-private-loss"],
    )  # fmt: skip
    assert loud.exit_code == 0, loud.output
    assert private_log(tmp_path / "loud")


def test_the_secret_is_on_disk_before_the_first_batch_is_drawn(tmp_path, monkeypatch):
    from dpsynth.privacy.mechanisms.poisson import PoissonSampler

    seen: list[bool] = []
    original = PoissonSampler.next

    def checked_next(self):
        secret = tmp_path / "run" / "private" / "secret.json"
        seen.append(secret.is_file() and stat.S_IMODE(secret.stat().st_mode) == 0o600)
        return original(self)

    monkeypatch.setattr(PoissonSampler, "next", checked_next)
    train(tmp_path, "run")
    assert seen and all(seen)
    state_file = tmp_path / "run" / "private" / "random-state.json"
    assert stat.S_IMODE(state_file.stat().st_mode) == 0o600
