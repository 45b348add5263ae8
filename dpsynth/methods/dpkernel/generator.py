"""DP-Kernel's sampler of a trained run (images or encoded table rows)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch.nn import functional as F

from dpsynth.data.images import DataInfo
from dpsynth.methods.blocks import LatentGenerator
from dpsynth.methods.dpkernel.binning import NumberBins, number_bins
from dpsynth.methods.dpkernel.nets import build_network


def one_hot_or_none(labels: torch.Tensor, num_classes: int) -> torch.Tensor | None:
    """Float one-hot rows [b, K] of class indices; None for an unconditional generator."""
    return F.one_hot(labels, num_classes).float() if num_classes else None


class DPKernelGenerator(LatentGenerator):
    """Samples uint8 images [b, C, H, W] from a trained vector generator (no private data).

    `truncation` scales the latent z ~ N(0, I) before the network (the "truncation trick" of
    GAN sampling): below 1 it trades diversity for samples nearer the generator's typical
    output. It is post-processing of the released generator, so it costs no privacy.
    """

    build_net = staticmethod(build_network)

    def __init__(self, *args: Any, bins: NumberBins | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.bins = bins  # a table's numbers generated as bins (decoded to values here)

    @classmethod
    def run_options(cls, info: DataInfo, config: Mapping[str, Any]) -> dict[str, Any]:
        """The table's number bins, when the run generates numbers as bins."""
        return {"bins": number_bins(info, config)}

    @classmethod
    def weights_prefix(cls, tensors: Mapping[str, torch.Tensor]) -> str:
        """`ema.` (the weights' moving average) if the run kept one, else `generator.`."""
        return "ema." if any(k.startswith("ema.") for k in tensors) else cls.saved_prefix

    def records(self, out: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """As `LatentGenerator.records`; a table's binned numbers are decoded to values (drawn
        inside their bins from `generator`)."""
        if self.modality == "table" and self.bins is not None:
            return self.bins.decode(out, generator)
        return super().records(out, generator)
