"""Network pieces that several backends build the same way: the two-hidden-layer MLP of the
vector generators (rdpgan's and dpkernel's MLP and table arches) and DCGAN's initialisation
(dpaf's and rdpgan's networks)."""

from __future__ import annotations

from torch import nn


def mlp_layers(inputs: int, width: int, outputs: int) -> list[nn.Module]:
    """Linear(inputs → width) → ReLU → Linear(width → width) → ReLU → Linear(width → outputs),
    created in that order (the public seed's draws of their initial weights follow it)."""
    return [
        nn.Linear(inputs, width),
        nn.ReLU(),
        nn.Linear(width, width),
        nn.ReLU(),
        nn.Linear(width, outputs),
    ]


def dcgan_init(module: nn.Module) -> None:
    """DCGAN init: conv and linear weights N(0, 0.02), BN γ N(1, 0.02), biases 0."""
    if isinstance(module, (nn.Conv2d, nn.ConvTranspose2d, nn.Linear)):
        nn.init.normal_(module.weight, 0.0, 0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.BatchNorm2d):
        nn.init.normal_(module.weight, 1.0, 0.02)
        nn.init.zeros_(module.bias)
