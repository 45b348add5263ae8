"""DPAF's fit penalty (`frequency_anchor` = λ, `dpsynth.methods.blocks.fit_penalty`): the
generator's matching steps are pulled towards a frozen copy of G as fitted to the DP frequency
model; the copy is kept in checkpoints, and the option is refused where it has no model."""

from __future__ import annotations

import copy

import pytest
import torch
from torch.nn import functional as F

from dpsynth.errors import UsageError
from dpsynth.methods.dpaf import DPAFMethod
from tests.methods.dpaf.test_dpaf_match import INFO, _digits, straight_and_cut_runs
from tests.methods.dpaf.test_dpaf_once import ONCE, _trainer

FREQUENCY = {"frequency_share": 0.5, "frequency_fit_steps": 20, "windows": 12, "lr": 1e-2}


def _distance(net: torch.nn.Module, anchor: torch.nn.Module) -> float:
    """Mean squared distance of `net`'s images to `anchor`'s at the same public latents."""
    z = torch.randn(64, net.latent_dim, generator=torch.Generator().manual_seed(3))
    onehot = F.one_hot(torch.arange(64) % 10, 10).float()
    with torch.no_grad():
        return float(F.mse_loss(net(z, onehot), anchor(z, onehot)))


def test_anchor_holds_g_near_its_fit_to_the_model(one_torch_thread):
    # The matching steps move G away from its fit to the frequency model; a heavy anchor keeps
    # it closer (λ is large because the tiny matching loss is ~4,000). Off, no anchor in the state.
    x, y = _digits(64)
    distances = {}
    for weight in (0.0, 1e4):
        config, _plan, trainer = _trainer(4.0, **FREQUENCY, frequency_anchor=weight)
        trainer.release_whole_data(0, x, y)  # the frequency model and G's fit to it
        fitted = copy.deepcopy(trainer.net_g)
        for step in range(config["c_steps"] + config["windows"]):
            if step > 0:  # step 0's release was made above; the loop asks once a step
                trainer.release_whole_data(step, x, y)
            trainer.step(x[:32], y[:32])
        on = weight > 0
        assert any(k.startswith("anchor.") for k in trainer.own_state_tensors()) == on
        if on:  # frozen at the fit
            pairs = zip(trainer.fit_penalty.net.parameters(), fitted.parameters(), strict=True)
            for frozen, start in pairs:
                assert torch.equal(frozen, start) and not frozen.requires_grad
        distances[weight] = _distance(trainer.net_g, fitted)
    assert distances[0.0] > 0
    assert distances[1e4] < 0.5 * distances[0.0], distances


def test_resume_with_the_anchor_is_bit_identical(tmp_path, one_torch_thread):
    overrides = {**ONCE, **FREQUENCY, "windows": 6, "frequency_anchor": 10.0}
    straight, cut, resumed, a, b = straight_and_cut_runs(
        tmp_path, overrides, cut_after=4, privacy_seed=5
    )
    assert cut["interrupted"]
    assert resumed["steps"] == straight["steps"] and resumed["ledger_status"] == "completed"
    assert a.keys() == b.keys() and any(k.startswith("trainer/anchor.") for k in a)
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=0, msg=key)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"frequency_anchor": 1.0}, "frequency_share > 0"),
        ({"frequency_anchor": -1.0, "frequency_share": 0.5}, "frequency_anchor"),
    ],
)
def test_anchor_refused_without_a_model_or_below_zero(overrides, message):
    with pytest.raises(UsageError, match=message):
        DPAFMethod().config("tiny", {**ONCE, **overrides}, INFO)
