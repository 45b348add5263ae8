"""`train --public SPEC`: declared-public images pretrained on before any private step, at no
privacy cost, recorded in config.json and the ledger, refused when they are the private data
or when nothing of the run would use them."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from dpsynth.cli import app
from dpsynth.data.public import load_public
from dpsynth.data.sources import load_data
from dpsynth.errors import DataError, UsageError
from dpsynth.ledger import Ledger
from dpsynth.ledger.anchors import SpendAnchor, verified_spend
from dpsynth.rundir import RunDir
from dpsynth.training import train_run

runner = CliRunner()
DIGITS = tuple(str(d) for d in range(10))
# pge's tiny preset cut short: two pretraining steps, two DP steps.
QUICK = {"steps": "2", "public_pretrain_steps": "2"}


@pytest.fixture(scope="module")
def sets(tmp_path_factory):
    """Small public sets: 8×8 with the digits' classes, 12×12 colour with other classes, and
    a copy of the private digits themselves."""
    root = tmp_path_factory.mktemp("public")
    rng = np.random.default_rng(0)
    same = root / "same.npz"
    x = rng.integers(0, 256, (30, 1, 8, 8), dtype=np.uint8)
    np.savez(same, x=x, y=np.arange(30) % 10, classes=np.array(DIGITS))
    other = root / "other.npz"
    x3 = rng.integers(0, 256, (20, 12, 12, 3), dtype=np.uint8)
    np.savez(other, x=x3, y=np.arange(20) % 2, classes=np.array(["cat", "dog"]))
    digits = load_data("digits")
    copy = root / "copy.npz"
    np.savez(copy, x=digits.x.numpy(), y=digits.y.numpy(), classes=np.array(digits.classes))
    return {"same": same, "other": other, "copy": copy}


def _start(tmp_path, name, public=None, method="pge", overrides=None, quick=QUICK):
    """A new run stopped before step 0 (after any pretraining), with a fixed secret."""
    return train_run(
        method=method,
        data="digits",
        epsilon=5,
        preset="tiny",
        out=tmp_path / name,
        ledger_path=tmp_path / f"{name}.jsonl",
        device="cpu",
        seed=0,
        overrides={**quick, **(overrides or {})},
        public=public,
        stop_after_steps=0,
        privacy_seed=7,
    )


def _weights(tmp_path, name, prefix):
    tensors, _ = RunDir(tmp_path / name).load_checkpoint()
    return {k: v for k, v in tensors.items() if k.startswith(f"trainer/{prefix}")}


def _differ(a, b) -> bool:
    assert a.keys() == b.keys() and a
    return any(not torch.equal(a[k], b[k]) for k in a)


def _no_spend(path) -> bool:
    return not path.exists() or Ledger(path).entries() == []


def test_load_public_brings_a_set_to_the_private_shape(sets, tmp_path):
    other = load_public(f"npz:{sets['other']}", (1, 8, 8), DIGITS)
    assert other.x.shape == (20, 1, 8, 8) and other.x.dtype == torch.uint8
    assert other.y is None and other.source_shape == (3, 12, 12)
    assert "12×12 → 8×8" in other.describe((1, 8, 8))
    # same class names in another order: labels mapped by name
    reordered = tmp_path / "reordered.npz"
    np.savez(reordered, x=np.zeros((3, 1, 8, 8), np.uint8), y=[0, 1, 2], classes=["b", "c", "a"])
    mapped = load_public(f"npz:{reordered}", (3, 16, 16), ("a", "b", "c"))
    assert mapped.x.shape == (3, 3, 16, 16) and mapped.y.tolist() == [1, 2, 0]
    with pytest.raises(UsageError, match="table"):
        load_public("german-credit", (1, 8, 8), DIGITS)


def test_public_input_recorded_at_no_privacy_cost(sets, tmp_path):
    out, ledger = tmp_path / "run", tmp_path / "l.jsonl"
    args = ["train", "--method", "pge", "--preset", "tiny", "--data", "digits", "--epsilon"]
    args += ["5", "--out", str(out), "--ledger", str(ledger), "--device", "cpu", "--json"]
    args += ["--public", f"npz:{sets['same']}"]
    for key, value in QUICK.items():
        args += ["--set", f"{key}={value}"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    config = json.loads((out / "config.json").read_text())
    public = config["public"]
    expected = load_public(f"npz:{sets['same']}", (1, 8, 8), DIGITS)
    assert public["spec"] == f"npz:{sets['same'].resolve()}" and public["n"] == 30
    assert public["content_digest"] == expected.content_digest
    assert public["used_by"] == ["score network"] and public["labelled"] is True
    assert summary["public"] == public
    spend = Ledger(ledger).entries()[0]
    assert spend["public"] == {k: public[k] for k in ("spec", "n", "content_digest", "used_by")}
    # the anchor binds the public record; ledger show and verify keep working
    anchor = SpendAnchor.from_run_config(config, "run")
    verified_spend(
        Ledger(ledger), anchor, run_id=config["run_id"], dataset_id="digits",
        fingerprint=config["data"]["fingerprint"], events=None, run_name="run",
        run_config=config,
    )  # fmt: skip
    shown = runner.invoke(app, ["ledger", "show", "--ledger", str(ledger)])
    assert shown.exit_code == 0 and "public input" in shown.stdout
    verify = ["ledger", "verify", "--ledger", str(ledger), "--against", str(out)]
    assert runner.invoke(app, verify).exit_code == 0
    # no privacy cost: the plan without --public is the same
    plain = _start(tmp_path, "plain")
    assert plain["epsilon"] == summary["epsilon"]
    assert plain["noise_multiplier"] == summary["noise_multiplier"]


def test_pretraining_changes_the_weights_before_step_0(sets, tmp_path):
    public = f"npz:{sets['same']}"
    _start(tmp_path, "plain")
    _start(tmp_path, "public", public)
    _start(tmp_path, "again", public)
    plain, pretrained = (
        _weights(tmp_path, "plain", "model."),
        _weights(tmp_path, "public", "model."),
    )
    assert _differ(plain, pretrained)
    again = _weights(tmp_path, "again", "model.")
    assert not _differ(pretrained, again)  # deterministic from the public seed


def test_the_teacher_and_dpkernel_pretrain_on_it(sets, tmp_path):
    teacher = {"teacher_share": "0.5", "teacher_epochs": "0.1", "public_teacher_steps": "3"}
    labelled = _start(tmp_path, "t1", f"npz:{sets['same']}", overrides=teacher)
    assert labelled["public"]["used_by"] == ["score network", "DP teacher"]
    _start(tmp_path, "t0", overrides=teacher)
    assert _differ(_weights(tmp_path, "t0", "teacher."), _weights(tmp_path, "t1", "teacher."))
    unlabelled = _start(tmp_path, "t2", f"npz:{sets['other']}", overrides=teacher)
    assert unlabelled["public"]["used_by"] == ["score network"]
    assert "DP teacher (needs labels) skips it" in unlabelled["public"]["notes"][0]
    _start(tmp_path, "k0", method="dpkernel")
    kernel = _start(tmp_path, "k1", f"npz:{sets['other']}", method="dpkernel")
    assert kernel["public"]["used_by"] == ["generator"]
    assert _differ(_weights(tmp_path, "k0", "generator."), _weights(tmp_path, "k1", "generator."))


@pytest.mark.parametrize(
    ("public", "method", "overrides", "message"),
    [
        ("digits", "pge", {}, "is the private data itself"),
        ("copy", "pge", {}, "is the private data itself"),
        ("same", "freq", {}, "not used by --method freq"),
        ("same", "dpaf", {"public_pretrain_steps": "0"}, "not used by --method dpaf"),
        ("other", "dpaf", {}, "not used by --method dpaf"),  # its classifier needs labels
        ("same", "rdpgan", {"public_pretrain_steps": "0"}, "not used by --method rdpgan"),
        # a DP warm start would replace psg's synthetic set; unlabelled images cannot start it
        ("same", "psg", {"warm_start_share": "0.2"}, "not used by --method psg"),
        ("other", "psg", {}, "not used by --method psg"),
        ("same", "pge", {"public_pretrain_steps": "0"}, "not used by --method pge"),
        ("other", "pge", {"public_pretrain_steps": "0", "teacher_share": "0.5"}, "needs"),
    ],
)
def test_refused_before_the_reservation(sets, tmp_path, public, method, overrides, message):
    spec = public if public == "digits" else f"npz:{sets[public]}"
    args = ["train", "--method", method, "--preset", "tiny", "--data", "digits", "--epsilon"]
    args += ["5", "--out", str(tmp_path / "run"), "--ledger", str(tmp_path / "l.jsonl")]
    args += ["--device", "cpu", "--public", spec]
    for key, value in overrides.items():
        args += ["--set", f"{key}={value}"]
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert _no_spend(tmp_path / "l.jsonl") and not (tmp_path / "run").exists()


def test_resume_reuses_the_recorded_public_set(sets, tmp_path):
    spec = tmp_path / "mine.npz"
    shutil.copy(sets["same"], spec)
    _start(tmp_path, "first", f"npz:{spec}")
    pretrained = _weights(tmp_path, "first", "model.")
    _start(tmp_path, "restart", f"npz:{spec}")
    run = RunDir(tmp_path / "restart")
    (run.path / "checkpoint.safetensors").unlink()  # as if stopped before its first checkpoint
    assert not run.has_checkpoint()
    resume = {"out": run.path, "resume": True, "device": "cpu"}
    with pytest.raises(UsageError, match="differs from the set"):
        train_run(method="", data="", epsilon=1, ledger_path=None, public="digits:test", **resume)
    # restarted from scratch: the recorded set is read again and pretrained on again
    train_run(method="", data="", epsilon=1, ledger_path=None, stop_after_steps=0, **resume)
    assert not _differ(pretrained, _weights(tmp_path, "restart", "model."))
    # from a checkpoint, the run finishes without reading the set again
    finished = train_run(
        method="", data="", epsilon=1, ledger_path=None, public=f"npz:{spec}", **resume
    )
    assert finished["ledger_status"] == "completed" and finished["public"]["n"] == 30
    # a changed set is refused when it would have to be read again
    first = RunDir(tmp_path / "first")
    (first.path / "checkpoint.safetensors").unlink()
    np.savez(spec, x=np.zeros((30, 1, 8, 8), np.uint8), y=np.arange(30) % 10, classes=DIGITS)
    with pytest.raises(DataError, match="changed"):
        train_run(method="", data="", epsilon=1, ledger_path=None, out=first.path, resume=True)


def test_rdpgan_pretrains_its_gan_on_it(sets, tmp_path):
    gan = {"public_pretrain_steps": "4"}
    _start(tmp_path, "g0", method="rdpgan", quick=gan)
    run = _start(tmp_path, "g1", f"npz:{sets['same']}", method="rdpgan", quick=gan)
    assert run["public"]["used_by"] == ["generator", "discriminator"]
    for part in ("generator.", "discriminator."):
        assert _differ(_weights(tmp_path, "g0", part), _weights(tmp_path, "g1", part))
    _start(tmp_path, "g2", f"npz:{sets['same']}", method="rdpgan", quick=gan)
    assert not _differ(
        _weights(tmp_path, "g1", "generator."), _weights(tmp_path, "g2", "generator.")
    )
    # unlabelled images train G and D too (with random labels)
    other = _start(tmp_path, "g3", f"npz:{sets['other']}", method="rdpgan", quick=gan)
    assert other["public"]["used_by"] == ["generator", "discriminator"]
    assert _differ(_weights(tmp_path, "g0", "generator."), _weights(tmp_path, "g3", "generator."))
    # the DP phase's optimisers start fresh: no Adam state in the checkpoint before step 0
    assert not _weights(tmp_path, "g1", "opt_d.") and not _weights(tmp_path, "g1", "opt_g.")


def test_rdpgan_discriminator_learns_the_public_images(tmp_path):
    from dpsynth.methods.blocks import one_hot_labels
    from dpsynth.methods.rdpgan.generator import build_discriminator, build_generator

    # the digits' test split as the public set; D then tells the train split from G's images
    test = load_data("digits:test")
    spec = tmp_path / "test.npz"
    np.savez(spec, x=test.x.numpy(), y=test.y.numpy(), classes=np.array(test.classes))
    _start(tmp_path, "d1", f"npz:{spec}", method="rdpgan", quick={"public_pretrain_steps": "60"})
    config = json.loads((tmp_path / "d1" / "config.json").read_text())["config"]
    digits = load_data("digits")
    nets = {"discriminator": build_discriminator(digits.info(), config)}
    nets["generator"] = build_generator(digits.info(), config)
    for name, net in nets.items():
        state = _weights(tmp_path, "d1", f"{name}.")
        net.load_state_dict({k.split(f"{name}.", 1)[1]: v for k, v in state.items()})
    onehot = one_hot_labels(digits.y[:200], 10)
    with torch.no_grad():
        fakes = nets["generator"](torch.randn(200, nets["generator"].latent_dim), onehot)
        real = nets["discriminator"](digits.as_float()[:200], onehot).mean()
        assert real > nets["discriminator"](fakes, onehot).mean()


def test_psg_starts_its_synthetic_set_from_public_images(sets, tmp_path):
    run = _start(tmp_path, "s1", f"npz:{sets['same']}", method="psg", quick={})
    assert run["public"]["used_by"] == ["synthetic set"]
    tensors, _ = RunDir(tmp_path / "s1").load_checkpoint()
    images, labels = tensors["trainer/synthetic.images"], tensors["trainer/synthetic.labels"]
    public = load_public(f"npz:{sets['same']}", (1, 8, 8), DIGITS)
    pool = public.as_float()
    for image, label in zip(images, labels, strict=True):
        # each member is one of the public images of its own class
        match = (pool - image).flatten(1).abs().amax(1) < 1e-6
        assert match.any() and (public.y[match] == label).all()


def test_dpaf_pretrains_its_phase1_classifier(tmp_path):
    from dpsynth.methods.dpaf.generator import build_features
    from dpsynth.methods.dpaf.model import Classifier

    test = load_data("digits:test")  # a public stand-in: not the private train split
    spec = tmp_path / "test.npz"
    np.savez(spec, x=test.x.numpy(), y=test.y.numpy(), classes=np.array(test.classes))
    quick = {"public_pretrain_steps": "40"}
    run = _start(tmp_path, "c1", f"npz:{spec}", method="dpaf", quick=quick)
    assert run["public"]["used_by"] == ["phase-1 classifier"]
    _start(tmp_path, "c0", method="dpaf", quick={})
    digits = load_data("digits")
    accuracy = {}
    for name in ("c0", "c1"):
        config = json.loads((tmp_path / name / "config.json").read_text())["config"]
        net = Classifier(build_features(digits.info(), config), int(config["fc_hidden"]))
        state = _weights(tmp_path, name, "classifier.")
        net.load_state_dict({k.split("classifier.", 1)[1]: v for k, v in state.items()})
        with torch.no_grad():
            logits = net.eval()(digits.as_float(), torch.zeros(digits.n, 10))
        accuracy[name] = float((logits.argmax(1) == digits.y).float().mean())
    # C classifies the private digits before any DP step only after the public pretraining
    assert accuracy["c1"] > 0.5 > accuracy["c0"]
