"""freq's sampler: class-conditional Gaussians in the DCT band of the released frequency model
(post-processing of the release, no data read)."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from dpsynth.data.images import to_uint8
from dpsynth.errors import UsageError
from dpsynth.methods.base import Generator, GeneratorState, latent_batches, sample_truncation
from dpsynth.privacy.releases.frequency import FrequencyModel, band_images


def psd_roots(covariances: torch.Tensor) -> torch.Tensor:
    """Symmetric square roots [K, d, d] of PSD matrices (negative round-off set to 0)."""
    values, vectors = torch.linalg.eigh(covariances)
    return vectors @ torch.diag_embed(values.clamp_min(0).sqrt()) @ vectors.transpose(1, 2)


class FreqGenerator(Generator):
    """Images band_images(μ_y + t·Σ_y^{1/2} z), z ~ N(0, I_d) drawn from the caller's
    generator, for the requested labels in order: `FrequencyModel.images_at` with the square
    roots computed once. t is `truncation` (the run's `sample_truncation`, or `sample
    --truncation`): below 1 the images stay nearer their class mean."""

    def __init__(
        self,
        model: FrequencyModel,
        classes: tuple[str, ...],
        device: torch.device,
        truncation: float = 1.0,
    ) -> None:
        self.model = model
        self.classes = tuple(classes)
        self.shape = tuple(int(s) for s in model.shape)  # type: ignore[assignment]
        self.device = torch.device(device)
        self.truncation = float(truncation)
        self.means = model.means.to(self.device, torch.float64)
        self.roots = psd_roots(model.covariances.to(torch.float64)).to(self.device)

    @classmethod
    def from_state(cls, state: GeneratorState) -> FreqGenerator:
        """The sampler of the saved model (`frequency.*`; UsageError before its release)."""
        model = FrequencyModel.from_tensors(state.tensors)
        if model is None:
            raise UsageError(
                "the run has not released its frequency model yet (stopped before its one "
                "step): resume it with `dpsynth train --resume`"
            )
        return cls(model, state.info.classes, state.device, sample_truncation(state.config))

    def images_at(self, labels: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """Images [n, C, H, W] in [-1, 1] (float32) of labels [n] and coordinates z [n, d]."""
        labels = labels.to(self.device, torch.int64)
        deviations = torch.einsum(
            "nij,nj->ni", self.roots[labels], z.to(self.device, torch.float64)
        )
        features = self.means[labels] + deviations
        return band_images(features, self.shape, self.model.band).to(torch.float32)

    @torch.no_grad()
    def sample(
        self, labels: torch.Tensor, batch_size: int, generator: torch.Generator
    ) -> Iterator[torch.Tensor]:
        """Yield uint8 batches [b, C, H, W] for `labels` in order; latents from `generator`."""
        batches = latent_batches(labels, batch_size, self.model.dim, generator, self.truncation)
        for chunk, z in batches:
            yield to_uint8(self.images_at(chunk, z)).cpu()
