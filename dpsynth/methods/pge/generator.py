"""PGE's sampler: annealed HMC with the EMA score network (no data)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch

from dpsynth.data.images import DataInfo, to_uint8
from dpsynth.methods.base import Generator, GeneratorState
from dpsynth.methods.pge.build import (
    build_encoder,
    build_score_net,
    from_working,
    noise_levels,
    to_working,
    working_shape,
)
from dpsynth.methods.pge.hmc import annealed_hmc, step_schedule
from dpsynth.methods.pge.nets import RandomConvEncoder, ScoreUNet
from dpsynth.privacy.releases.frequency import FrequencyModel


class PGEGenerator(Generator):
    """Annealed HMC with the EMA score network; labels are given by the caller."""

    def __init__(
        self,
        info: DataInfo,
        config: Mapping[str, Any],
        net: ScoreUNet,
        encoder: RandomConvEncoder | None,
        device: torch.device,
        central: torch.Tensor | None = None,
        frequency: FrequencyModel | None = None,
    ) -> None:
        self.info = info
        self.frequency = frequency
        self.central = None if central is None else central.to(device)
        self.config = dict(config)
        self.net = net.to(device).eval()
        self.encoder = encoder
        self.device = device
        self.classes = tuple(info.classes)
        self.shape = tuple(info.shape)  # type: ignore[assignment]
        self.sigmas = noise_levels(config).to(device)
        self.last_acceptance: list[float] = []

    @classmethod
    def from_state(cls, state: GeneratorState) -> PGEGenerator:
        """The sampler around the saved EMA score network (`ema.*`), the encoder, and the
        warm start's public releases (central means, frequency model) if the run kept them."""
        info, config, tensors, device = state.info, state.config, state.tensors, state.device
        net = build_score_net(config, info)
        net.load_state_dict(state.under("ema."))
        encoder = build_encoder(config, info)
        if encoder is not None and any(k.startswith("encoder.") for k in tensors):
            encoder.load_state_dict(state.under("encoder."))
        central = tensors.get("central.means")
        frequency = FrequencyModel.from_tensors(tensors)
        return cls(info, config, net.to(device), encoder, device, central, frequency)

    def sample(
        self, labels: torch.Tensor, batch_size: int, generator: torch.Generator
    ) -> Iterator[torch.Tensor]:
        """Yield uint8 images [b, C, H, W] in the data's shape for `labels`, in order."""
        for chunk in labels.split(max(1, int(batch_size))):
            yield self._sample_batch(chunk.to(self.device, torch.int64), generator)

    def _starts_from_a_release(self) -> bool:
        """Whether the chains start at a DP release's image (the central means or a sample of
        the frequency model) rather than at uniform noise."""
        init = self.config.get("sampler_init")
        return (init == "central" and self.central is not None) or (
            init == "frequency" and self.frequency is not None
        )

    def _round_levels(self) -> list[int]:
        """The noise level of each HMC round, spread from the first level to the last.

        The first is `sampler_first_level` when the chains start at a release's image, and
        level 0 (the widest) when they start at uniform noise: a run without the release its
        sampler was set for (the method alone) then still anneals through every level.
        """
        rounds, n_levels = int(self.config["sampler_rounds"]), len(self.sigmas)
        first = 0
        if self._starts_from_a_release():
            first = min(int(self.config.get("sampler_first_level", 0)), n_levels - 1)
        if rounds == 1:
            return [n_levels - 1]
        return [first + round(m * (n_levels - 1 - first) / (rounds - 1)) for m in range(rounds)]

    def _score_fn(self, y: torch.Tensor, level: int, z: torch.Tensor | None):
        sigma = self.sigmas[level].expand(y.shape[0])
        guidance = float(self.config["guidance"])
        null = torch.full_like(y, len(self.classes))

        def score(x: torch.Tensor) -> torch.Tensor:
            out = self.net(x, sigma, y, z)
            if guidance:
                out = (1.0 + guidance) * out - guidance * self.net(x, sigma, null, z)
            return out / sigma[:, None, None, None]

        return score

    @torch.no_grad()
    def _sample_batch(self, y: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        cfg = self.config
        b = y.shape[0]
        h, w = working_shape(cfg, self.info.shape)
        shape = (b, self.info.shape[0], h, w)
        gdev = generator.device
        x = (torch.rand(shape, generator=generator, device=gdev) * 2 - 1).to(self.device)
        levels = self._round_levels()
        if cfg.get("sampler_init") == "central" and self.central is not None:
            # Start at the class's DP central image plus noise at the first round's level
            # (runs trained before these keys existed have neither: uniform noise, level 0).
            start = to_working(self.central[y], cfg, self.info.shape)
            noise = torch.randn(shape, generator=generator, device=gdev).to(self.device)
            x = (start + float(self.sigmas[levels[0]]) * noise).clamp(-1.0, 1.0)
        elif cfg.get("sampler_init") == "frequency" and self.frequency is not None:
            # Start at a sample of the DP frequency model (a blurred image of the class) plus
            # noise at the first round's level: the chains only refine it (SDEdit-like).
            start = to_working(self.frequency.sample(y, generator), cfg, self.info.shape)
            noise = torch.randn(shape, generator=generator, device=gdev).to(self.device)
            x = (start.to(self.device) + float(self.sigmas[levels[0]]) * noise).clamp(-1.0, 1.0)
        z_shape = None
        if self.net.residual_channels > 0:
            f = self.net.downsample_factor
            z_shape = (b, self.net.residual_channels, h // f, w // f)

        def score_at_round(m: int):
            z = None
            if z_shape is not None:  # fresh feature noise per round, fixed within it
                z = float(cfg["feature_noise"]) * torch.randn(
                    z_shape, generator=generator, device=gdev
                ).to(self.device)
            return self._score_fn(y, levels[m], z)

        steps = step_schedule(
            str(cfg["step_schedule"]),
            float(cfg["lambda0"]),
            [float(self.sigmas[lv]) for lv in levels],
        )
        box = float(cfg["box"]) if float(cfg["box"]) > 0 else None
        x, stats = annealed_hmc(
            score_at_round, x, steps, int(cfg["sampler_steps"]), str(cfg["mh"]), generator, box
        )
        self.last_acceptance = stats.acceptance
        if cfg["final_denoise"]:
            last = len(self.sigmas) - 1
            z = None
            if z_shape is not None:
                z = float(cfg["feature_noise"]) * torch.randn(
                    z_shape, generator=generator, device=gdev
                ).to(self.device)
            x = x + self.sigmas[last] ** 2 * self._score_fn(y, last, z)(x)
        x = from_working(x.clamp(-1.0, 1.0), cfg, self.info.shape)
        return to_uint8(x).cpu()
