"""PGE's trainer: DP-SGD steps of the sliced score-matching loss, the EMA, the warm start on
the DP central images, and the checkpointed state."""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping

import torch
from torch.func import grad, vmap

from dpsynth.methods.base import saved_under
from dpsynth.methods.pge.build import (
    build_encoder,
    build_score_net,
    noise_levels,
    to_working,
)
from dpsynth.methods.pge.generator import PGEGenerator
from dpsynth.methods.pge.ssm import make_record_loss, randomized_response
from dpsynth.methods.template import StagedTrainer, seeded
from dpsynth.privacy.mechanisms.randomness import PrivateRandomness
from dpsynth.privacy.releases.central import CentralImages
from dpsynth.privacy.releases.frequency import FrequencyModel


class PGETrainer(StagedTrainer):
    """Mutable state of one PGE run: score net, EMA copy, Adam, and two secret RNG streams."""

    def setup(self, randomness: PrivateRandomness) -> None:
        """The score network (from the public seed), its EMA and optimiser, the secret streams."""
        from dpsynth.privacy.mechanisms.dpsgd import PrivateGradient

        info, config, plan, seed, device = self.info, self.config, self.plan, self.seed, self.device
        with seeded(seed):
            self.model = build_score_net(config, info).to(device)
        self.ema = copy.deepcopy(self.model).requires_grad_(False)
        self.encoder = build_encoder(config, info)
        if self.encoder is not None:
            self.encoder = self.encoder.to(device)
        self.optimizer = torch.optim.Adam(
            self.model.parameters(), lr=float(config["lr"]), betas=(0.9, 0.999)
        )
        # Per-record randomness (levels, perturbations, projections, RR, masks) and the DP
        # noise come from separate streams of the run's secret randomness (never from the
        # public seed); the training loop saves their states privately for an exact resume.
        self.rng = randomness.generator("pge/records", device)
        self.noise_rng = randomness.generator("pge/noise", device)
        self.sigmas = noise_levels(config).to(device)
        self.steps_done = 0
        self.central: torch.Tensor | None = None  # the released central images, once warm-started
        self.frequency_model: FrequencyModel | None = None  # a frequency release, if any
        self.private_gradient = PrivateGradient(
            self.model,
            make_record_loss(self.model, str(config["ssm_variant"]), str(config["divergence"])),
            noise_multiplier=plan.noise_multiplier,
            max_grad_norm=plan.max_grad_norm,
            expected_batch_size=plan.expected_batch_size,
            generator=self.noise_rng,
            micro_batch_size=int(config["micro_batch_size"]),
            private=plan.private,
        )
        self.start_stages(randomness)

    def record_randomness(
        self, x: torch.Tensor, y: torch.Tensor, generator: torch.Generator | None = None
    ) -> tuple[torch.Tensor, ...]:
        """Draw every per-record random input of the loss for a working-size batch x.

        Returns (y_in, sigma, noise, v, r, z) with a leading batch dim; y_in has dropped labels
        replaced by the "no label" token. Only z depends on x (the masked encoder features).
        The draws come from `generator` (default: the run's secret per-record stream).
        """
        cfg, dev = self.config, self.device
        g = generator if generator is not None else self.rng
        b, k = x.shape[0], int(cfg["projections"])
        shape = (b, k, *x.shape[1:])
        levels = torch.randint(0, len(self.sigmas), (b, k), generator=g, device=dev)
        sigma = self.sigmas[levels]
        noise = torch.randn(shape, generator=g, device=dev)
        v = torch.randn(shape, generator=g, device=dev)
        if cfg["rr"]:
            r, _ = randomized_response(v, int(cfg["rr_k"]), float(cfg["rr_epsilon"]), g)
        else:
            r = v
        drop = torch.rand(b, generator=g, device=dev) < float(cfg["label_dropout"])
        y_in = torch.where(drop, torch.full_like(y, len(self.info.classes)), y)
        if self.encoder is None:
            z = torch.zeros(b, k, 1, device=dev)
        else:
            with torch.no_grad():
                feats = self.encoder(x)  # [b, c_z, h, w]
            zshape = (b, k, *feats.shape[1:])
            keep = torch.rand((b, k, 1, *feats.shape[2:]), generator=g, device=dev) >= float(
                cfg["mask_ratio"]
            )
            xi = float(cfg["feature_noise"]) * torch.randn(zshape, generator=g, device=dev)
            use_noise = torch.rand((b, k, 1, 1, 1), generator=g, device=dev) < float(
                cfg["residual_noise_prob"]
            )
            z = torch.where(use_noise, xi, keep * feats.unsqueeze(1))
        return y_in, sigma, noise, v, r, z

    def step(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
        """One DP-SGD step of the SSM loss on a Poisson batch, then Adam and the EMA update."""
        x = to_working(x.to(self.device, torch.float32), self.config, self.info.shape)
        y = y.to(self.device, torch.int64)
        batch = self.record_randomness(x, y)
        self.optimizer.zero_grad(set_to_none=True)
        stats = self.private_gradient.compute(x, *batch)
        self.optimizer.step()
        self.steps_done += 1
        self._update_ema()
        out = {"loss": float(stats.get("mean_loss", float("nan")))}
        for key in ("batch_size", "clip_fraction", "mean_grad_norm"):
            if key in stats:
                out[key] = float(stats[key])
        return out

    @torch.no_grad()
    def _update_ema(self) -> None:
        # Warm-up so short runs are not dominated by the random initialisation.
        t = self.steps_done
        decay = min(float(self.config["ema"]), (1.0 + t) / (10.0 + t))
        for e, p in zip(self.ema.parameters(), self.model.parameters(), strict=True):
            e.mul_(decay).add_(p.detach(), alpha=1.0 - decay)

    def own_state_tensors(self) -> dict[str, torch.Tensor]:
        """Weights, EMA, Adam moments and steps, the step count (no secret RNG states)."""
        out: dict[str, torch.Tensor] = {}
        for key, t in self.model.state_dict().items():
            out[f"model.{key}"] = t
        for key, t in self.ema.state_dict().items():
            out[f"ema.{key}"] = t
        if self.encoder is not None:
            for key, t in self.encoder.state_dict().items():
                out[f"encoder.{key}"] = t
        for idx, state in self.optimizer.state_dict()["state"].items():
            for key, t in state.items():
                out[f"opt.{idx}.{key}"] = torch.as_tensor(t)
        if self.central is not None:  # a DP release: public
            out["central.means"] = self.central
        if self.frequency_model is not None:  # a DP release: public
            out |= self.frequency_model.tensors()
        out["trainer.steps"] = torch.tensor(self.steps_done, dtype=torch.int64)
        return {k: v.detach().cpu().clone().contiguous() for k, v in out.items()}

    def load_own_state(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Restore what `own_state_tensors` wrote."""
        self.model.load_state_dict(saved_under(tensors, "model."))
        self.ema.load_state_dict(saved_under(tensors, "ema."))
        if self.encoder is not None and any(k.startswith("encoder.") for k in tensors):
            self.encoder.load_state_dict(saved_under(tensors, "encoder."))
        opt_state: dict[int, dict[str, torch.Tensor]] = {}
        for key, t in saved_under(tensors, "opt.").items():
            idx, name = key.split(".", 1)
            opt_state.setdefault(int(idx), {})[name] = t
        state_dict = self.optimizer.state_dict()
        state_dict["state"] = opt_state
        self.optimizer.load_state_dict(state_dict)
        self.steps_done = int(tensors["trainer.steps"])
        if "central.means" in tensors:
            self.central = tensors["central.means"].to(self.device)
        self.frequency_model = FrequencyModel.from_tensors(tensors)

    def own_generator(self) -> PGEGenerator:
        """The sampler around a copy of the current EMA weights."""
        return PGEGenerator(
            self.info,
            self.config,
            copy.deepcopy(self.ema),
            self.encoder,
            self.device,
            self.central,
            self.frequency_model,
        )

    def warm_start(self, release: CentralImages) -> None:
        """Pretrain on the DP central images (public once released), as DP-FETA does.

        `warm_start_steps` Adam steps (lr `warm_start_lr`, batch `warm_start_batch`) of the
        same SSM loss on "records" x = mean[y] + `warm_start_jitter`·N(0, I) with uniform y;
        the EMA then starts from the pretrained weights and DP-SGD fine-tunes with a fresh
        Adam. The means are kept (they are public) for `sampler_init=central`.
        """
        cfg = self.config
        central = CentralImages(release.means.to(self.device), release.counts, release.model)
        means = to_working(central.means, cfg, self.info.shape)
        self.central = release.means.to(self.device)
        self.frequency_model = release.model
        steps, batch = int(cfg["warm_start_steps"]), int(cfg["warm_start_batch"])
        if steps == 0:
            return
        jitter, g = float(cfg["warm_start_jitter"]), self.rng

        def draw() -> tuple[torch.Tensor, torch.Tensor]:
            y = torch.randint(0, len(self.info.classes), (batch,), generator=g, device=self.device)
            if central.model is not None:  # a frequency release: the model's samples
                x = to_working(central.records(y, jitter, g), cfg, self.info.shape)
            else:
                x = means[y] + jitter * torch.randn(means[y].shape, generator=g, device=self.device)
            return x, y

        self._fit(steps, float(cfg["warm_start_lr"]), draw, g)

    def public_uses(self, labelled: bool) -> tuple[str, ...]:
        """The score network (labelled: conditionally, else with the "no label" token) when
        `public_pretrain_steps` > 0, and the DP teacher when it can use the labels."""
        uses = ("score network",) if int(self.config.get("public_pretrain_steps", 0)) > 0 else ()
        return uses + (("DP teacher",) if self.teacher.uses_public(labelled) else ())

    def pretrain_public(self, x: torch.Tensor, y: torch.Tensor | None) -> None:
        """`public_pretrain_steps` Adam steps (lr `warm_start_lr`, batch `warm_start_batch`) of
        the SSM loss on declared-public images, as the warm start on central images, before
        any private step; batches and per-record draws from the public seed. Unlabelled
        images train the "no label" token (what guidance and label dropout use). The DP
        teacher, if any, pretrains on labelled ones."""
        cfg = self.config
        steps, batch = int(cfg.get("public_pretrain_steps", 0)), int(cfg["warm_start_batch"])
        g = torch.Generator(device=self.device).manual_seed(self.seed + 1_000_003)
        x = x.to(self.device, torch.float32)
        labels = y.to(self.device) if y is not None else None
        no_label = len(self.info.classes)

        def draw() -> tuple[torch.Tensor, torch.Tensor]:
            index = torch.randint(0, len(x), (batch,), generator=g, device=self.device)
            chosen = labels[index] if labels is not None else torch.full_like(index, no_label)
            return to_working(x[index], cfg, self.info.shape), chosen

        if steps > 0:
            self._fit(steps, float(cfg["warm_start_lr"]), draw, g)
        self.teacher.pretrain_public(x, labels)

    def _fit(
        self,
        steps: int,
        lr: float,
        draw: Callable[[], tuple[torch.Tensor, torch.Tensor]],
        g: torch.Generator,
    ) -> None:
        """`steps` non-private Adam steps of the SSM loss on batches `draw()` gives (working
        size), per-record draws from `g`; the EMA then starts from the result, and DP-SGD
        later fine-tunes with its own fresh Adam."""
        cfg = self.config
        params = {k: p.detach() for k, p in self.model.named_parameters()}
        buffers = dict(self.model.named_buffers())
        loss_fn = make_record_loss(self.model, str(cfg["ssm_variant"]), str(cfg["divergence"]))
        batched = vmap(loss_fn, in_dims=(None, None, *([0] * 7)))

        def mean_loss(p: dict[str, torch.Tensor], *inputs: torch.Tensor) -> torch.Tensor:
            return batched(p, buffers, *inputs).mean()

        grad_fn = grad(mean_loss)
        # Detached views share the model's storage: Adam updates the model in place.
        optimizer = torch.optim.Adam(list(params.values()), lr=lr)
        for _ in range(steps):
            x, y = draw()
            grads = grad_fn(params, x.clamp(-1.0, 1.0), *self.record_randomness(x, y, g))
            for name, leaf in params.items():
                leaf.grad = grads[name]
            optimizer.step()
        self.ema.load_state_dict(self.model.state_dict())
