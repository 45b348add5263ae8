"""PGE (Liu et al., ACM MM 2024) under DP-SGD: sliced score matching + Hamiltonian sampling.

What runs (spec `pge.md` sections 2, 3.3, 4.5):
- training: a class-conditional, noise-conditional score U-Net (GroupNorm only) is fitted with
  the sliced score-matching loss of the paper's Eq. 8 over `n_levels` noise levels, K random
  projections per record, the residual enhancement module (a frozen, seeded random-conv
  encoder that never learns from data, masked and fed into the bottleneck through a
  zero-initialised projection), and DP-SGD: Poisson batches, per-record clipping, Gaussian
  noise, division by the expected batch size (`dpsynth.privacy.dpsgd`);
- sampling: annealed HMC (leapfrog with the learned score as the force, momentum refreshed each
  round, path-integral energy accept/reject, box reflection, final Tweedie denoise) from
  uniform noise, with balanced labels chosen by the caller; it never touches data.

Privacy: the ε of a run is the accountant's bound for the DP-SGD steps that actually ran. The
paper's randomized response on projection vectors (`rr`) may be switched on as a variance knob,
but it privatizes nothing (the vectors are data-independent noise) and changes no ε.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch.func import grad, vmap
from torch.nn import functional as F

from dpsynth.data.images import DataInfo, to_uint8
from dpsynth.errors import UsageError
from dpsynth.methods.base import Generator, Method, PrivacyPlan, Trainer
from dpsynth.methods.pge.hmc import MH_MODES, annealed_hmc, step_schedule
from dpsynth.methods.pge.nets import RandomConvEncoder, ScoreUNet
from dpsynth.methods.pge.presets import PRESETS
from dpsynth.methods.pge.ssm import make_record_loss, randomized_response
from dpsynth.privacy.central import CentralImages
from dpsynth.privacy.randomness import PrivateRandomness

# At or below this ε `--preset auto` takes `small-eps1`.
SMALL_EPSILON = 3.0

_CHOICES: dict[str, tuple[str, ...]] = {
    "ssm_variant": ("plain", "vr"),
    "divergence": ("jvp", "fd"),
    "residual": ("random-conv", "none"),
    "step_schedule": ("sigma", "paper"),
    "mh": MH_MODES,
    "resize": ("pad", "resize"),
    "sampler_init": ("uniform", "central"),
}


def noise_levels(config: Mapping[str, Any]) -> torch.Tensor:
    """The σ levels, geometric from sigma_max down to sigma_min (fixed constants, not data)."""
    n = int(config["n_levels"])
    if n == 1:
        return torch.tensor([float(config["sigma_min"])])
    return torch.logspace(
        math.log10(float(config["sigma_max"])), math.log10(float(config["sigma_min"])), n
    )


def working_shape(config: Mapping[str, Any], data_shape: tuple[int, int, int]) -> tuple[int, int]:
    """The (H, W) the network works at: `image_size` if set, else the data size padded up to a
    multiple of the U-Net's down-sampling factor."""
    factor = 2 ** (len(config["ch_mult"]) - 1)
    size = int(config["image_size"])
    if size > 0:
        if size % factor:
            raise UsageError(f"image_size {size} must be a multiple of {factor} for ch_mult")
        return size, size
    _, h, w = data_shape
    return -(-h // factor) * factor, -(-w // factor) * factor


def describe_transform(config: Mapping[str, Any], data_shape: tuple[int, int, int]) -> str:
    """A one-line statement of how data is mapped to the working resolution and back."""
    _, h, w = data_shape
    wh, ww = working_shape(config, data_shape)
    if (wh, ww) == (h, w):
        return f"none ({h}x{w} used as is)"
    if config["resize"] == "pad":
        if wh < h or ww < w:
            raise UsageError(
                f"image_size {wh} is smaller than the data ({h}x{w}); use resize=resize"
            )
        return (
            f"pad {h}x{w} -> {wh}x{ww} with -1 (black) on the bottom/right; "
            "samples are cropped back"
        )
    return f"bilinear resize {h}x{w} -> {wh}x{ww}; samples are resized back"


def to_working(
    x: torch.Tensor, config: Mapping[str, Any], data_shape: tuple[int, int, int]
) -> torch.Tensor:
    """Map data-shaped images [b,C,H,W] in [-1,1] to the working resolution."""
    _, h, w = data_shape
    wh, ww = working_shape(config, data_shape)
    if (wh, ww) == (h, w):
        return x
    if config["resize"] == "pad":
        return F.pad(x, (0, ww - w, 0, wh - h), value=-1.0)
    return F.interpolate(x, size=(wh, ww), mode="bilinear", align_corners=False, antialias=True)


def from_working(
    x: torch.Tensor, config: Mapping[str, Any], data_shape: tuple[int, int, int]
) -> torch.Tensor:
    """Inverse of `to_working` (crop, or resize back)."""
    _, h, w = data_shape
    if tuple(x.shape[-2:]) == (h, w):
        return x
    if config["resize"] == "pad":
        return x[..., :h, :w]
    return F.interpolate(x, size=(h, w), mode="bilinear", align_corners=False, antialias=True)


def build_score_net(config: Mapping[str, Any], info: DataInfo) -> ScoreUNet:
    """The score U-Net for this config and data shape (weights from the current torch RNG)."""
    return ScoreUNet(
        channels=info.shape[0],
        num_classes=len(info.classes),
        nf=int(config["nf"]),
        ch_mult=[int(m) for m in config["ch_mult"]],
        num_res_blocks=int(config["num_res_blocks"]),
        attn_levels=[int(a) for a in config["attn_levels"]],
        mid_attention=bool(config["mid_attention"]),
        residual_channels=int(config["residual_channels"])
        if config["residual"] == "random-conv"
        else 0,
    )


def build_encoder(config: Mapping[str, Any], info: DataInfo) -> RandomConvEncoder | None:
    """The residual module's frozen encoder (seeded constant, data-independent), or None."""
    if config["residual"] != "random-conv":
        return None
    return RandomConvEncoder(
        info.shape[0], int(config["residual_channels"]), len(config["ch_mult"]) - 1
    )


class PGEMethod(Method):
    """`--method pge`: DP-SGD sliced score matching with an HMC sampler."""

    name = "pge"
    presets = PRESETS
    description = (
        "PGE's score network (sliced score matching, residual module, HMC sampler) trained "
        "with DP-SGD; the paper's randomized response gives no privacy and earns no credit"
    )

    def recommended_preset(self, info: DataInfo, epsilon: float) -> str:
        """`small-eps1` at ε ≤ 3 (most of the budget on the central images), else `small`.

        Both were tuned on 8×8 digits (bench/results/tuning-pge.md); only public facts (ε)
        choose, so the choice spends nothing.
        """
        return "small-eps1" if epsilon <= SMALL_EPSILON else "small"

    def config(self, preset: str, overrides: Mapping[str, Any], info: DataInfo) -> dict[str, Any]:
        """The preset with overrides, validated, plus the resolved working resolution."""
        merged = super().config(preset, overrides, info)
        for key, allowed in _CHOICES.items():
            if merged[key] not in allowed:
                raise UsageError(f"{key}={merged[key]!r}: choose from {', '.join(allowed)}")
        for key in ("n_levels", "projections", "sampler_rounds", "batch_size", "steps"):
            if int(merged[key]) < 1:
                raise UsageError(f"{key} must be at least 1")
        if not 0 < float(merged["sigma_min"]) <= float(merged["sigma_max"]):
            raise UsageError("need 0 < sigma_min <= sigma_max")
        if not 0.0 <= float(merged["mask_ratio"]) <= 1.0:
            raise UsageError("mask_ratio must be in [0, 1]")
        merged["working_size"] = list(working_shape(merged, info.shape))
        merged["input_transform"] = describe_transform(merged, info.shape)
        merged["rr_privacy"] = "none: RR on data-independent projections is a variance knob only"
        return merged

    def validate_config(self, config: Mapping[str, Any], info: DataInfo) -> None:
        """The shared checks plus PGE's ranges (before any budget is reserved)."""
        super().validate_config(config, info)
        at_least_one = (
            "sampler_steps", "micro_batch_size", "nf", "num_res_blocks", "residual_channels",
            "rr_k", "warm_start_batch",
        )  # fmt: skip
        for key in at_least_one:
            if int(config[key]) < 1:
                raise UsageError(f"--set {key}: must be at least 1, got {config[key]}")
        for key in ("ema", "label_dropout", "residual_noise_prob"):
            if not 0.0 <= float(config[key]) <= 1.0:
                raise UsageError(f"--set {key}: must be in [0, 1], got {config[key]}")
        for key in ("lambda0", "box", "rr_epsilon"):
            if not float(config[key]) > 0:
                raise UsageError(f"--set {key}: must be positive, got {config[key]}")
        if not 0 <= int(config["sampler_first_level"]) < int(config["n_levels"]):
            raise UsageError("--set sampler_first_level: must be in [0, n_levels)")
        if int(config["warm_start_steps"]) < 0:
            raise UsageError("--set warm_start_steps: must be at least 0")
        if float(config["warm_start_jitter"]) < 0:
            raise UsageError("--set warm_start_jitter: must be at least 0")
        if float(config["feature_noise"]) < 0:
            raise UsageError(
                f"--set feature_noise: must be at least 0, got {config['feature_noise']}"
            )
        if not config["ch_mult"] or min(int(m) for m in config["ch_mult"]) < 1:
            raise UsageError(f"--set ch_mult: needs positive multipliers, got {config['ch_mult']}")
        levels = len(config["ch_mult"])
        if any(not 0 <= int(a) < levels for a in config["attn_levels"]):
            raise UsageError(
                f"--set attn_levels: each must be in [0, {levels - 1}], got {config['attn_levels']}"
            )
        if not 0 <= int(config["image_size"]) <= 1024:
            raise UsageError(f"--set image_size: must be in [0, 1024], got {config['image_size']}")

    def trainer(
        self,
        info: DataInfo,
        config: Mapping[str, Any],
        plan: PrivacyPlan,
        device: torch.device,
        seed: int,
        randomness: PrivateRandomness | None = None,
    ) -> PGETrainer:
        """A fresh trainer; weights from `seed`, never from the data; draws from `randomness`."""
        return PGETrainer(info, config, plan, torch.device(device), seed, randomness)

    def generator_from_state(
        self,
        info: DataInfo,
        config: Mapping[str, Any],
        tensors: Mapping[str, torch.Tensor],
        device: torch.device,
    ) -> PGEGenerator:
        """The sampler around the saved EMA score network."""
        device = torch.device(device)
        net = build_score_net(config, info)
        net.load_state_dict(_subdict(tensors, "ema."))
        encoder = build_encoder(config, info)
        if encoder is not None and any(k.startswith("encoder.") for k in tensors):
            encoder.load_state_dict(_subdict(tensors, "encoder."))
        central = tensors.get("central.means")
        return PGEGenerator(info, config, net.to(device), encoder, device, central)


def _subdict(tensors: Mapping[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    return {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}


class PGETrainer(Trainer):
    """Mutable state of one PGE run: score net, EMA copy, Adam, and two secret RNG streams."""

    def __init__(
        self,
        info: DataInfo,
        config: Mapping[str, Any],
        plan: PrivacyPlan,
        device: torch.device,
        seed: int,
        randomness: PrivateRandomness | None = None,
    ) -> None:
        from dpsynth.privacy.dpsgd import PrivateGradient

        self.info = info
        self.config = dict(config)
        self.plan = plan
        self.device = device
        with torch.random.fork_rng(devices=[]):  # seeded init without touching the global RNG
            torch.manual_seed(seed)
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
        randomness = randomness if randomness is not None else PrivateRandomness.fresh()
        self.rng = randomness.generator("pge/records", device)
        self.noise_rng = randomness.generator("pge/noise", device)
        self.sigmas = noise_levels(config).to(device)
        self.steps_done = 0
        self.central: torch.Tensor | None = None  # the released central images, once warm-started
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

    def record_randomness(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Draw every per-record random input of the loss for a working-size batch x.

        Returns (y_in, sigma, noise, v, r, z) with a leading batch dim; y_in has dropped labels
        replaced by the "no label" token. Only z depends on x (the masked encoder features).
        """
        cfg, g, dev = self.config, self.rng, self.device
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

    def state_tensors(self) -> dict[str, torch.Tensor]:
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
        out["trainer.steps"] = torch.tensor(self.steps_done, dtype=torch.int64)
        return {k: v.detach().cpu().clone().contiguous() for k, v in out.items()}

    def load_state_tensors(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Restore what `state_tensors` wrote."""
        self.model.load_state_dict(_subdict(tensors, "model."))
        self.ema.load_state_dict(_subdict(tensors, "ema."))
        if self.encoder is not None and any(k.startswith("encoder.") for k in tensors):
            self.encoder.load_state_dict(_subdict(tensors, "encoder."))
        opt_state: dict[int, dict[str, torch.Tensor]] = {}
        for key, t in _subdict(tensors, "opt.").items():
            idx, name = key.split(".", 1)
            opt_state.setdefault(int(idx), {})[name] = t
        state_dict = self.optimizer.state_dict()
        state_dict["state"] = opt_state
        self.optimizer.load_state_dict(state_dict)
        self.steps_done = int(tensors["trainer.steps"])
        if "central.means" in tensors:
            self.central = tensors["central.means"].to(self.device)

    def generator(self) -> PGEGenerator:
        """The sampler around a copy of the current EMA weights."""
        return PGEGenerator(
            self.info, self.config, copy.deepcopy(self.ema), self.encoder, self.device, self.central
        )

    def warm_start(self, release: CentralImages) -> None:
        """Pretrain on the DP central images (public once released), as DP-FETA does.

        `warm_start_steps` Adam steps (lr `warm_start_lr`, batch `warm_start_batch`) of the
        same SSM loss on "records" x = mean[y] + `warm_start_jitter`·N(0, I) with uniform y;
        the EMA then starts from the pretrained weights and DP-SGD fine-tunes with a fresh
        Adam. The means are kept (they are public) for `sampler_init=central`.
        """
        cfg = self.config
        means = to_working(release.means.to(self.device), cfg, self.info.shape)
        self.central = release.means.to(self.device)
        steps, batch = int(cfg["warm_start_steps"]), int(cfg["warm_start_batch"])
        if steps == 0:
            return
        params = {k: p.detach() for k, p in self.model.named_parameters()}
        buffers = dict(self.model.named_buffers())
        loss_fn = make_record_loss(self.model, str(cfg["ssm_variant"]), str(cfg["divergence"]))
        batched = vmap(loss_fn, in_dims=(None, None, *([0] * 7)))

        def mean_loss(p: dict[str, torch.Tensor], *inputs: torch.Tensor) -> torch.Tensor:
            return batched(p, buffers, *inputs).mean()

        grad_fn = grad(mean_loss)
        # Detached views share the model's storage: Adam updates the model in place.
        optimizer = torch.optim.Adam(list(params.values()), lr=float(cfg["warm_start_lr"]))
        jitter, g = float(cfg["warm_start_jitter"]), self.rng
        for _ in range(steps):
            y = torch.randint(0, len(self.info.classes), (batch,), generator=g, device=self.device)
            x = means[y] + jitter * torch.randn(means[y].shape, generator=g, device=self.device)
            grads = grad_fn(params, x.clamp(-1.0, 1.0), *self.record_randomness(x, y))
            for name, leaf in params.items():
                leaf.grad = grads[name]
            optimizer.step()
        self.ema.load_state_dict(self.model.state_dict())


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
    ) -> None:
        self.info = info
        self.central = None if central is None else central.to(device)
        self.config = dict(config)
        self.net = net.to(device).eval()
        self.encoder = encoder
        self.device = device
        self.classes = tuple(info.classes)
        self.shape = tuple(info.shape)  # type: ignore[assignment]
        self.sigmas = noise_levels(config).to(device)
        self.last_acceptance: list[float] = []

    def sample(
        self, labels: torch.Tensor, batch_size: int, generator: torch.Generator
    ) -> Iterator[torch.Tensor]:
        """Yield uint8 images [b, C, H, W] in the data's shape for `labels`, in order."""
        for chunk in labels.split(max(1, int(batch_size))):
            yield self._sample_batch(chunk.to(self.device, torch.int64), generator)

    def _round_levels(self) -> list[int]:
        """The noise level of each HMC round, spread from `sampler_first_level` to the last."""
        rounds, n_levels = int(self.config["sampler_rounds"]), len(self.sigmas)
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
