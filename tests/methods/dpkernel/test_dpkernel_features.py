"""dpkernel's `kernel_features`: the kernel sees each image joined to features of an encoder
trained on declared-public images before any private read."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from dpsynth.cli import app
from dpsynth.data.sources import load_data
from dpsynth.errors import UsageError
from dpsynth.ledger import Ledger
from dpsynth.methods.dpkernel import trainer as trainer_module
from dpsynth.methods.dpkernel.basis import KernelView
from dpsynth.methods.dpkernel.features import FeatureView, PublicEncoder, train_public_encoder
from dpsynth.methods.registry import get_method
from dpsynth.privacy.accounting.plan import PrivacyTarget
from dpsynth.rundir import RunDir
from dpsynth.training import train_run
from tests.methods.dpkernel.test_dpkernel import _digits
from tests.methods.dpkernel.test_dpkernel_basis import _digits_trainer

runner = CliRunner()
DIGITS = tuple(str(d) for d in range(10))


@pytest.fixture(scope="module")
def public_sets(tmp_path_factory):
    """Labelled 8×8 public sets with the digits' classes (two different ones: the last 300
    sklearn digits, and the same images mirrored) and an unlabelled one (other classes)."""
    root = tmp_path_factory.mktemp("public")
    x, y = _digits(1797)
    pixels = ((x[-300:, 0] + 1.0) * 127.5).round().clamp(0, 255).to(torch.uint8).numpy()
    labels = y[-300:].numpy()
    sets = {}
    for name, images in (("public", pixels), ("mirrored", pixels[:, :, ::-1])):
        sets[name] = root / f"{name}.npz"
        np.savez(sets[name], x=images[:, None], y=labels, classes=np.array(DIGITS))
    sets["other"] = root / "other.npz"
    np.savez(sets["other"], x=pixels[:, None], y=labels % 2, classes=np.array(["a", "b"]))
    return sets


def test_the_view_is_a_per_record_map_of_pixels_joined_to_scaled_unit_features() -> None:
    """Each record's view depends on that record alone (no batch statistics), keeps its pixels
    and adds `scale`·φ/‖φ‖; it is differentiable in the image, not in the frozen encoder."""
    torch.manual_seed(0)
    encoder = PublicEncoder((1, 8, 8), 16, 10).requires_grad_(False)
    view = FeatureView(KernelView(None), encoder, scale=7.0)
    flat = torch.rand(12, 64, dtype=torch.float64) * 2 - 1
    joined = view(flat)
    assert joined.shape == (12, 80) and joined.dtype == torch.float64
    torch.testing.assert_close(joined[:, :64], flat)
    single = torch.cat([view(flat[i : i + 1]) for i in range(12)])
    # the same up to float32 rounding (batched convolutions sum in another order)
    torch.testing.assert_close(joined, single, rtol=1e-5, atol=1e-5)
    norms = joined[:, 64:].norm(dim=1)
    assert torch.all((norms - 7.0).abs() < 1e-4)
    points = flat.clone().requires_grad_(True)
    view(points)[:, 64:].sum().backward()
    assert points.grad is not None and points.grad.abs().sum() > 0
    assert all(p.grad is None for p in encoder.parameters())


def test_the_encoder_learns_the_public_classes_and_is_then_frozen() -> None:
    x, y = _digits(1797)
    encoder = PublicEncoder((1, 8, 8), 32, 10)
    train_public_encoder(encoder, x[:1000], y[:1000], steps=300, seed=0)
    assert not any(p.requires_grad for p in encoder.parameters())
    with torch.no_grad():
        accuracy = (encoder.head(encoder(x[1000:])).argmax(1) == y[1000:]).float().mean()
    assert accuracy > 0.85


def test_a_step_releases_in_the_joined_space_with_the_pixel_kernels_sensitivity(
    monkeypatch,
) -> None:
    """The privatiser gets (64 + K)-dimensional points and gradients (the noise is drawn in
    the joined space) with the same RKHS sensitivity and σ as the pixel kernel."""
    seen: dict = {}
    real = trainer_module.privatize_embedding_gradient

    def spy(gradient, points, labels, bandwidths, **kwargs):
        seen.update(gradient=gradient.shape, points=points.shape, kwargs=kwargs)
        return real(gradient, points, labels, bandwidths, **kwargs)

    monkeypatch.setattr(trainer_module, "privatize_embedding_gradient", spy)
    _, config, plan, trainer = _digits_trainer(0, kernel_features=16)
    _, _, pixel_plan, _ = _digits_trainer(0)
    x, y = _digits(64)
    trainer.pretrain_public(x, y)
    trainer.step(x, y)
    generated = int(config["generated_points"])
    assert seen["gradient"] == (generated, 80) and seen["points"] == (generated, 80)
    assert seen["kwargs"]["sum_sensitivity"] == pixel_plan.max_grad_norm == plan.max_grad_norm
    assert seen["kwargs"]["noise_multiplier"] == pixel_plan.noise_multiplier


def _start(tmp_path, name, public, privacy_seed=7, stop_after_steps=0, overrides=None):
    return train_run(
        method="dpkernel",
        data="digits",
        epsilon=5,
        preset="tiny",
        out=tmp_path / name,
        ledger_path=tmp_path / f"{name}.jsonl",
        device="cpu",
        seed=0,
        overrides={
            "steps": "3",
            "kernel_features": "16",
            "kernel_encoder_steps": "20",
            **(overrides or {}),
        },
        public=public,
        stop_after_steps=stop_after_steps,
        privacy_seed=privacy_seed,
    )


def _encoder(tmp_path, name):
    tensors, _ = RunDir(tmp_path / name).load_checkpoint()
    found = {k: v for k, v in tensors.items() if k.startswith("trainer/kernel_encoder.")}
    assert found
    return found


def test_the_encoder_is_trained_on_the_public_images_alone(public_sets, tmp_path):
    """Recorded as a public use; its weights follow the public set and the public seed, and
    not the run's secret randomness."""
    record = _start(tmp_path, "a", f"npz:{public_sets['public']}")
    assert "kernel features" in record["public"]["used_by"]
    _start(tmp_path, "b", f"npz:{public_sets['public']}", privacy_seed=8)
    _start(tmp_path, "c", f"npz:{public_sets['mirrored']}")
    a, b, c = (_encoder(tmp_path, name) for name in "abc")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], c[k]) for k in a)


def test_a_resumed_run_keeps_the_encoder_and_ends_as_an_uninterrupted_one(public_sets, tmp_path):
    spec = f"npz:{public_sets['public']}"
    _start(tmp_path, "whole", spec, stop_after_steps=None)
    _start(tmp_path, "cut", spec, stop_after_steps=1)
    resume = {"out": tmp_path / "cut", "resume": True, "device": "cpu"}
    train_run(method="", data="", epsilon=5, ledger_path=tmp_path / "cut.jsonl", **resume)
    whole, _ = RunDir(tmp_path / "whole").load_checkpoint()
    cut, _ = RunDir(tmp_path / "cut").load_checkpoint()
    kept = [k for k in whole if k.startswith(("trainer/generator.", "trainer/kernel_encoder."))]
    assert kept and all(torch.equal(whole[k], cut[k]) for k in kept)


@pytest.mark.parametrize(
    ("public", "message"),
    [(None, "kernel_features"), ("other", "labelled with the data's classes")],
)
def test_refused_without_labelled_public_images_before_any_spend(
    public_sets, tmp_path, public, message
):
    args = ["train", "--method", "dpkernel", "--preset", "tiny", "--data", "digits"]
    args += ["--epsilon", "5", "--out", str(tmp_path / "run")]
    args += ["--ledger", str(tmp_path / "l.jsonl"), "--device", "cpu"]
    args += ["--set", "kernel_features=16", "--set", "public_pretrain_steps=2"]
    if public is not None:
        args += ["--public", f"npz:{public_sets[public]}"]
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert message in result.output
    path = tmp_path / "l.jsonl"
    assert not path.exists() or not [e for e in Ledger(path).entries() if e["kind"] != "budget"]
    assert not (tmp_path / "run").exists()


def test_kernel_features_is_checked() -> None:
    method = get_method("dpkernel")
    info = load_data("digits").info()
    for bad in ({"kernel_features": -1}, {"kernel_features": 8, "kernel_feature_scale": 0.0}):
        with pytest.raises(UsageError, match="kernel_feature"):
            method.validate_config(method.config("tiny", bad, info), info)


def test_the_public_preset_is_mnist_with_the_measured_kernel_features() -> None:
    """`mnist-public` is the measured variant (docs/leaderboard.md): `mnist` with 64 public
    features at one kernel width; it needs --public, `auto` never picks it, and its plan is
    `mnist`'s (the features cost no ε)."""
    from tests.methods.dpkernel.test_dpkernel import MNIST_INFO

    method = get_method("dpkernel")
    named = method.config("mnist-public", {}, MNIST_INFO)
    measured = method.config("mnist", {"kernel_features": 64}, MNIST_INFO)
    assert {**named, "preset": "mnist"} == measured
    assert named["kernel_feature_scale"] == 1.0
    assert "kernel_features" in method.public_requirement("mnist-public", named)
    assert method.public_requirement("mnist", method.config("mnist", {}, MNIST_INFO)) is None
    assert "mnist-public" not in {method.recommended_preset(MNIST_INFO, e) for e in (1.0, 10.0)}
    target = PrivacyTarget(10.0, 1e-5)
    plain = method.plan(MNIST_INFO, target, method.config("mnist", {}, MNIST_INFO))
    plan = method.plan(MNIST_INFO, target, named)
    assert plan.noise_multiplier == plain.noise_multiplier and plan.events == plain.events
