"""dpkernel's DP warm start: the generator pretrained on the released central images."""

from __future__ import annotations

import pytest
import torch

from dpsynth.data.sources import load_data
from dpsynth.methods.registry import get_method
from dpsynth.privacy.central import CentralImages
from dpsynth.privacy.plan import PrivacyTarget
from tests.test_central_images import _pld_epsilon


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
    assert all(e.get("mechanism") != "central_images" for e in plan.events)


@pytest.mark.parametrize(
    ("preset", "share", "mechanism"),
    [("mnist", 0.2, "central_images"), ("mnist-eps1", 0.9, "frequency_model")],
)
def test_28x28_presets_plan_the_release_at_their_share(
    preset: str, share: float, mechanism: str
) -> None:
    """`mnist` spends its share of ε on the central images (records clipped at √784 = 28, so
    none is), `mnist-eps1` on the DP frequency model; the rest goes to the DP steps, composed
    within the target, and neither preset releases both warm starts."""
    from dpsynth.data.images import DataInfo
    from dpsynth.privacy.accounting import compose_epsilon

    method = get_method("dpkernel")
    info = DataInfo("mnist-5k", "builtin", 4000, (1, 28, 28), tuple("0123456789"), "f", "m")
    config = method.config(preset, {}, info)
    assert config["warm_start_clip"] == pytest.approx(28.0)
    plan = method.plan(info, PrivacyTarget(10.0, 1e-5), config)
    release = [e for e in plan.events if e.get("mechanism") == mechanism]
    assert len(release) == 1 and release[0]["type"] == "gaussian"
    assert compose_epsilon(release, 1e-5).epsilon == pytest.approx(share * 10.0, rel=0.02)
    other = {"central_images", "frequency_model"} - {mechanism}
    assert all(e.get("mechanism") not in other for e in plan.events)
    assert plan.epsilon_bound <= 10.0 + 1e-9
