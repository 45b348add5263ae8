"""The frequency anchor (config `frequency_anchor` = λ): a frozen copy G₀ of a generator as
fitted to the DP frequency model, towards which each later generator step is pulled.

A backend that fits its generator to the frequency model's samples (`fit_generator_to_model`)
before its own mechanism takes over can lose the model's variety there: RDP-GAN's DP
discriminator and DPAF's per-class mean matching both pull each class towards a few
templates. With λ > 0 the backend adds λ · MSE(G(z, y), G₀(z, y)) at the same latents to each
generator loss. G₀ is a function of the model's release and public latents only, so the
penalty is post-processing (no data read, no ε); it is kept in checkpoints, so a resumed run
pulls towards the same copy.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from dpsynth.errors import UsageError


def check_anchor_config(config: Mapping[str, Any]) -> None:
    """Refuse a negative λ, and an anchor without the frequency stage it copies."""
    weight = float(config.get("frequency_anchor", 0.0))
    if not weight >= 0:
        raise UsageError(f"--set frequency_anchor: must be ≥ 0, got {weight}")
    if weight > 0 and not float(config.get("frequency_share", 0.0)) > 0:
        raise UsageError(
            "--set frequency_anchor: the anchor is the generator fitted to the frequency "
            "model; it needs frequency_share > 0"
        )


class GeneratorAnchor:
    """λ and, once taken, the frozen copy G₀ (`net`; None until `take`, and always with λ = 0)."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        self.weight = float(config.get("frequency_anchor", 0.0))
        self.net: nn.Module | None = None

    def take(self, net_g: nn.Module) -> None:
        """Freeze a copy of `net_g` as it is now (after its fit to the model), if λ > 0."""
        if self.weight > 0:
            self.restore(net_g)

    def restore(self, net_g: nn.Module) -> None:
        """Make a frozen copy of `net_g` to load a checkpoint's anchor weights into."""
        self.net = copy.deepcopy(net_g).requires_grad_(False)

    def penalty(self, fakes: torch.Tensor, z: torch.Tensor, onehot: torch.Tensor) -> torch.Tensor:
        """λ · MSE(fakes, G₀(z, onehot)), or 0 when no anchor has been taken."""
        if self.net is None:
            return fakes.new_zeros(())
        with torch.no_grad():
            anchored = self.net(z, onehot)
        return self.weight * F.mse_loss(fakes, anchored)

    def modules(self) -> dict[str, nn.Module]:
        """{"anchor": G₀} for a checkpoint once taken, else {}."""
        return {"anchor": self.net} if self.net is not None else {}

    @staticmethod
    def in_checkpoint(tensors: Mapping[str, torch.Tensor]) -> bool:
        """Whether a trainer's saved tensors hold an anchor."""
        return any(name.startswith("anchor.") for name in tensors)
