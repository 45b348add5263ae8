"""dpkernel's DP warm start: the generator pretrained on the released central images."""

from __future__ import annotations

import pytest
import torch

from dpsynth.data.sources import load_data
from dpsynth.methods.registry import get_method
from dpsynth.privacy.accounting.plan import PrivacyTarget
from dpsynth.privacy.releases.central import CentralImages
from tests.privacy.test_central_images import _pld_epsilon


def test_warm_start_pulls_each_class_towards_its_released_mean() -> None:
    """After the warm start the generated images of class c have about the level of the released
    mean of c (mean absolute error of the image's mean level < 0.15; untrained: > 0.3)."""
    method = get_method("dpkernel")
    data = load_data("digits")
    config = method.config(
        "tiny",
        {
            "warm_start_share": 0.5,
            "warm_start_steps": 200,
            "warm_start_jitter": 0.2,
            "bandwidths": [8.0],
            "lr": 5e-3,
            "generated_points": 60,
        },
        data.info(),
    )
    plan = method.plan(data.info(), PrivacyTarget(5.0, 1e-5), config)
    trainer = method.trainer(data.info(), config, plan, torch.device("cpu"), seed=0)
    # well-separated public "means": class c is a constant image at level −0.9 + 0.2c
    levels = torch.linspace(-0.9, 0.9, 10)
    means = levels[:, None, None, None].expand(10, 1, 8, 8).clone()
    release = CentralImages(means=means, counts=torch.full((10,), 100.0))

    def level_error() -> float:
        labels = torch.arange(10).repeat(20)
        latents = torch.Generator().manual_seed(1)
        images = torch.cat(list(trainer.generator().sample(labels, 100, latents)))
        levels_seen = images.float().flatten(1).mean(1) / 127.5 - 1.0  # uint8 back to [-1, 1]
        return float((levels_seen - levels[labels]).abs().mean())

    before = level_error()
    trainer.warm_start(release)
    after = level_error()
    assert after < 0.15 < 0.3 < before


def test_warm_start_on_a_frequency_model_regresses_onto_its_sampling_map() -> None:
    """With a latent of at least the model's dimension the warm start fits G to the model's own
    map z ↦ images_at(y, z[:d]): afterwards G's images at fresh latents are the model's images at
    the same latents up to a small error (a twentieth of the untrained generator's)."""
    from dpsynth.privacy.releases.frequency import FrequencyPlan, release_frequency_model

    method = get_method("dpkernel")
    data = load_data("digits")
    info = data.info()
    config = method.config("tiny", {"latent_dim": 64, "warm_start_steps": 600, "width": 32}, info)
    plan = method.plan(info, PrivacyTarget(5.0, 1e-5), config)
    trainer = method.trainer(info, config, plan, torch.device("cpu"), seed=0)
    model = release_frequency_model(
        data.as_float(),
        data.y,
        10,
        FrequencyPlan(0.0, 10, 4.8, 0.5, "class"),
        torch.Generator().manual_seed(0),
    )
    assert model.dim == 64  # the 10×10 band holds the whole 8×8 image
    release = CentralImages(model.mean_images(), model.counts.float(), model)
    labels = torch.arange(10).repeat(20)
    z = torch.randn(len(labels), 64, generator=torch.Generator().manual_seed(1))
    target = model.images_at(labels, z).flatten(1)

    def error() -> float:
        with torch.no_grad():
            onehot = torch.nn.functional.one_hot(labels, 10).float()
            return float((trainer.net(z, onehot) - target).pow(2).mean())

    before = error()
    trainer.warm_start(release)
    # the MMD warm start on latents it does not pair with the model's gets about 0.1·before
    assert error() < 0.05 * before


def test_warm_start_run_charges_the_release_with_the_steps(tmp_path) -> None:
    """Through the loop: the ledger holds the central-images release and the DP steps, and
    dp-accounting's PLD re-accounts them within the target."""
    from dpsynth import training
    from dpsynth.ledger import Ledger

    training.train_run(
        method="dpkernel",
        data="digits",
        epsilon=2.0,
        delta=1e-5,
        preset="tiny",
        device="cpu",
        seed=3,
        overrides={"steps": 3, "warm_start_share": 0.5, "warm_start_steps": 5},
        privacy_seed=2**127 + 5,
        out=tmp_path / "run",
        ledger_path=tmp_path / "l.jsonl",
    )
    events = Ledger(tmp_path / "l.jsonl").events_for("digits")
    assert events[0].get("mechanism") == "central_images"
    assert len(events) == 2
    assert _pld_epsilon(events, 1e-5) <= 2.0 * 1.001


def test_presets_default_to_no_warm_start() -> None:
    """Off unless a preset or `--set warm_start_share` asks for it (the shipped plans unchanged)."""
    method = get_method("dpkernel")
    info = load_data("digits").info()
    config = method.config("small", {}, info)
    assert config["warm_start_share"] == 0.0
    plan = method.plan(info, PrivacyTarget(1.0, 1e-5), config)
    assert all(e.annotation("mechanism") != "central_images" for e in plan.events)


@pytest.mark.parametrize(
    ("preset", "overrides", "share", "mechanism"),
    [
        ("mnist", {}, 0.5, "frequency_model"),
        ("mnist-eps1", {}, 0.5, "frequency_model"),
        # the central images instead (records clipped at √784 = 28, so none is)
        ("mnist", {"warm_start_share": 0.2, "frequency_share": 0.0}, 0.2, "central_images"),
    ],
)
def test_28x28_presets_plan_the_release_at_their_share(
    preset: str, overrides: dict[str, float], share: float, mechanism: str
) -> None:
    """Both 28×28 presets spend their share of ε on the DP frequency model, or with overrides on
    the central images; the rest goes to the DP steps, composed within the target, and no plan
    releases both warm starts."""
    from dpsynth.data.images import DataInfo
    from dpsynth.privacy.accounting.compose import compose_epsilon

    method = get_method("dpkernel")
    info = DataInfo("mnist-5k", "builtin", 4000, (1, 28, 28), tuple("0123456789"), "f", "m")
    config = method.config(preset, overrides, info)
    assert config["warm_start_clip"] == pytest.approx(28.0)
    plan = method.plan(info, PrivacyTarget(10.0, 1e-5), config)
    release = [e for e in plan.events if e.annotation("mechanism") == mechanism]
    assert len(release) == 1 and release[0].kind == "gaussian"
    assert compose_epsilon(release, 1e-5).epsilon == pytest.approx(share * 10.0, rel=0.02)
    other = {"central_images", "frequency_model"} - {mechanism}
    assert all(e.annotation("mechanism") not in other for e in plan.events)
    assert plan.epsilon_bound <= 10.0 + 1e-9
