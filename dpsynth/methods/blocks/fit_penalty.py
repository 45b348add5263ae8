"""The fit penalty (config `frequency_anchor` = λ): a frozen copy G₀ of a generator as fitted
to the DP frequency model, towards which each later generator step is pulled.

A backend that fits its generator to the frequency model's samples (`fit_generator_to_model`)
before its own mechanism takes over can lose the model's variety there: RDP-GAN's DP
discriminator and DPAF's per-class mean matching both pull each class towards a few
templates. With λ > 0 the backend adds λ · MSE(G(z, y), G₀(z, y)) at the same latents to each
generator loss. G₀ is a function of the model's release and public latents only, so the
penalty is post-processing (no data read, no ε); it is kept in checkpoints (as `anchor.*`,
the name the config key and the saved runs keep), so a resumed run pulls towards the same copy.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from dpsynth.errors import UsageError

# The saved tensors' prefix of G₀ in a trainer's checkpoint.
_SAVED = "anchor"


def check_fit_penalty_config(config: Mapping[str, Any]) -> None:
    """Refuse a negative λ, and a penalty without the frequency stage whose fit it copies."""
    weight = float(config.get("frequency_anchor", 0.0))
    if not weight >= 0:
        raise UsageError(f"--set frequency_anchor: must be ≥ 0, got {weight}")
    if weight > 0 and not float(config.get("frequency_share", 0.0)) > 0:
        raise UsageError(
            "--set frequency_anchor: the anchor is the generator fitted to the frequency "
            "model; it needs frequency_share > 0"
        )


class FitPenalty:
    """λ and, once taken, the frozen copy G₀ (`net`; None until `take`, and always with λ = 0)."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        self.weight = float(config.get("frequency_anchor", 0.0))
        self.net: nn.Module | None = None

    def take(self, net_g: nn.Module) -> None:
        """Freeze a copy of `net_g` as it is now (after its fit to the model), if λ > 0."""
        if self.weight > 0:
            self.restore(net_g)

    def restore(self, net_g: nn.Module) -> None:
        """Make a frozen copy of `net_g` to load a checkpoint's G₀ weights into."""
        self.net = copy.deepcopy(net_g).requires_grad_(False)

    def penalty(self, fakes: torch.Tensor, z: torch.Tensor, onehot: torch.Tensor) -> torch.Tensor:
        """λ · MSE(fakes, G₀(z, onehot)), or 0 when no copy has been taken."""
        if self.net is None:
            return fakes.new_zeros(())
        with torch.no_grad():
            fitted = self.net(z, onehot)
        return self.weight * F.mse_loss(fakes, fitted)

    def step_generator(
        self,
        net_g: nn.Module,
        optimizer: torch.optim.Optimizer,
        loss: torch.Tensor,
        latents: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    ) -> float:
        """One step of G's `optimizer` on `loss` plus the penalty at `latents` (G's images,
        z and the one-hot labels they were made from), by the gradients of G's own
        parameters only (`torch.autograd.grad`: nothing else's `.grad` changes); the loss."""
        loss = loss + self.penalty(*latents)
        grads = torch.autograd.grad(loss, list(net_g.parameters()))
        optimizer.zero_grad(set_to_none=True)
        for p, g in zip(net_g.parameters(), grads, strict=True):
            p.grad = g
        optimizer.step()
        return float(loss.detach())

    def modules(self) -> dict[str, nn.Module]:
        """{"anchor": G₀} for a checkpoint once taken, else {}."""
        return {_SAVED: self.net} if self.net is not None else {}

    @staticmethod
    def in_checkpoint(tensors: Mapping[str, torch.Tensor]) -> bool:
        """Whether a trainer's saved tensors hold G₀."""
        return any(name.startswith(_SAVED + ".") for name in tensors)
