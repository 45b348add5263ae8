"""The interface every generator backend implements, and the plan all of them share.

A backend is three objects:
- a `Method` (stateless): presets, `config` (preset + overrides, validated), `plan` (the
  privacy plan, computed before any data access) and factories for the two objects below;
- a `Trainer` (stateful, one per run): `step` consumes one Poisson batch that the training
  loop in `dpsynth.training` drew, and exposes its state for checkpoints and `--resume`;
- a `Generator` (loaded from a run dir, `methods.sampler`): `sample` yields batches of uint8
  images, or for a table (`DataInfo.modality == "table"`) batches of encoded rows float32
  [b, D], which `dpsynth.data.table_codec.TableCodec` decodes back to the CSV's columns.

The training loop, not the backend, owns Poisson sampling, the ledger, checkpoints and logs,
so that every backend gets the same privacy plumbing. It also owns the run's secret
randomness (`dpsynth.privacy.mechanisms.randomness`): a backend takes every random stream it draws
while training (its DP noise above all) from the `PrivateRandomness` it is given, never from the
public `seed`, and leaves saving those streams to the loop, which keeps them private.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import torch

from dpsynth.data.images import DataInfo
from dpsynth.errors import DpsynthError, UsageError
from dpsynth.methods.sampler import (
    Generator,
    GeneratorState,
    check_truncation,
    draw_latent,
    latent_batches,
    sample_truncation,
    saved_under,
)
from dpsynth.methods.settings import with_overrides
from dpsynth.privacy.accounting.events import AnyEvent
from dpsynth.privacy.accounting.plan import ClippedGaussianSum, PrivacyPlan, PrivacyTarget
from dpsynth.privacy.mechanisms.randomness import PrivateRandomness
from dpsynth.privacy.releases.central import CentralImages

# The plan types live in the privacy layer (which depends on nothing above it); they are part
# of this interface, so they are re-exported here for backends.
__all__ = [
    "ClippedGaussianSum",
    "Generator",
    "GeneratorState",
    "Method",
    "PlanFacts",
    "PrivacyPlan",
    "PrivacyTarget",
    "Trainer",
    "check_truncation",
    "draw_latent",
    "latent_batches",
    "sample_truncation",
    "saved_under",
]

# The public thresholds of every `recommended_preset` and of `--method auto`: a record of at
# least this many values is 28×28-sized (the `mnist*` presets), and a target ε at or below
# this is small (the `-eps1` presets, which spend more of ε on the coarse statistics).
LARGE_IMAGE_VALUES = 400
SMALL_EPSILON = 3.0


def is_large_image(info: DataInfo) -> bool:
    """Whether these records are images of 28×28 size or more (a public fact: the shape)."""
    return info.modality == "image" and math.prod(info.shape) >= LARGE_IMAGE_VALUES


# Training steps a run may plan: far beyond the presets (at most 2e5), and a bound on the time
# and on the accountant's work that a typo (`steps=1e12`) could otherwise ask for.
MAX_STEPS = 10_000_000


@dataclass(frozen=True)
class PlanFacts:
    """The public facts a plan is made from (never a record): the data's description, the
    target ε and δ, the run's config, and the events the ledger holds on the data already."""

    info: DataInfo
    target: PrivacyTarget
    config: Mapping[str, Any]
    prior_events: tuple[AnyEvent, ...] = ()

    def unpacked(
        self,
    ) -> tuple[DataInfo, PrivacyTarget, Mapping[str, Any], tuple[dict[str, Any], ...]]:
        """(info, target, config, prior_events)."""
        return self.info, self.target, self.config, self.prior_events

    def after(self, target: PrivacyTarget, prior_events: tuple[AnyEvent, ...]) -> PlanFacts:
        """The same data and config for another target after other prior events (a stage's
        share of ε, after the stages planned before it)."""
        return replace(self, target=target, prior_events=tuple(prior_events))


class Trainer(ABC):
    """The mutable training state of one run."""

    # Keys of `step`'s stats that are functions of what the mechanism released (and of public
    # values) only; they go to the publishable train-log. Every other stat was computed from
    # a private batch without noise and is logged only to the private folder, on request.
    released_stats: ClassVar[tuple[str, ...]] = ()

    info: DataInfo
    config: dict[str, Any]
    plan: PrivacyPlan
    device: torch.device
    seed: int

    def __init__(
        self,
        info: DataInfo,
        config: Mapping[str, Any],
        plan: PrivacyPlan,
        device: torch.device,
        seed: int,
        randomness: PrivateRandomness | None = None,
    ) -> None:
        """Keep the run's public facts, then `setup` the trainer with the randomness every
        secret stream of it comes from (`randomness`, or a fresh OS secret when None)."""
        self.info = info
        self.config = dict(config)
        self.plan = plan
        self.device = torch.device(device)
        self.seed = int(seed)
        self.setup(randomness if randomness is not None else PrivateRandomness.fresh())

    def setup(self, randomness: PrivateRandomness) -> None:
        """Build the trainer's state (weights from the public `seed`, never from the data;
        every secret stream from `randomness`). Default: nothing to build."""
        return None

    @abstractmethod
    def step(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
        """One private update from a Poisson batch (x float in [-1, 1] [b,C,H,W], or for a
        table the encoded rows [b, D]; y int64 [b]).

        b may be 0: an empty batch is still a step (noise only). Returns scalars to log
        (`loss` by convention); only the keys in `released_stats` are public.
        """

    @abstractmethod
    def state_tensors(self) -> dict[str, torch.Tensor]:
        """All tensors needed to resume exactly (weights, optimizer, EMA), which are public.

        Not the states of generators from `PrivateRandomness`: they are secret, and the
        training loop saves and restores them in the run's private folder.
        """

    @abstractmethod
    def load_state_tensors(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Restore what `state_tensors` returned."""

    @abstractmethod
    def generator(self) -> Generator:
        """The generator as of now (EMA weights where the method keeps them)."""

    def preflight(self) -> None:
        """Check, on public facts only (the config, the public seed's initial weights; no
        record, no secret stream), what the mechanism could otherwise fail on after the
        ledger reservation; UsageError (exit 2) if it would. `train` calls it on a new run
        before reserving the spend. Default: nothing to check."""
        return None

    def warm_start(self, release: CentralImages) -> None:
        """Initialise from a DP central-images release before the first DP-SGD step.

        The training loop calls it once, for a new run whose plan holds the release (config
        `warm_start_share` > 0, see `Method.plan`), with what `dpsynth.privacy.releases.central`
        released: it is public, so the trainer may pretrain on it and keep it in its state.
        """
        raise DpsynthError(f"{type(self).__name__} has no warm start from central images")

    def public_uses(self, labelled: bool) -> tuple[str, ...]:
        """What of this trainer would pretrain on declared-public images (`train --public`),
        labelled with the data's classes or not: names for config.json and the ledger (e.g.
        "score network", "DP teacher"). From the config only (public facts); `train` refuses
        `--public` before reserving when this is empty. Default: nothing uses it."""
        return ()

    def pretrain_public(self, x: torch.Tensor, y: torch.Tensor | None) -> None:
        """Pretrain, without privacy, on declared-public images before the first private step.

        x: float [n, C, H, W] in [-1, 1], in the data's shape; y: int64 [n] in the data's
        classes, or None (unlabelled: a part that needs labels skips it). The training loop
        calls it once, for a new run started with `--public`, before any warm start or step
        0; it reads no record, and its randomness comes from the public seed, never from
        `PrivateRandomness`. Only parts named by `public_uses(y is not None)` may change.
        """
        raise DpsynthError(f"{type(self).__name__} does not use --public")

    def reads_batch(self, step: int) -> bool:
        """Whether loop step `step` (from 0) reads a Poisson batch; a step that does not gets
        an empty batch and the sampler does not advance (default: every step reads)."""
        return True

    def release_whole_data(self, step: int, x: torch.Tensor, y: torch.Tensor) -> None:
        """Called by the training loop before loop step `step` with every record (x, y).

        A trainer whose plan accounts a release of the whole data set at one step (DPAF's
        `phase2_release=once`) makes it here, through `dpsynth.privacy`, and keeps only what
        it released; the default reads nothing.
        """
        return None


class Method(ABC):
    """A generator backend: presets, planning and factories."""

    name: ClassVar[str]
    presets: ClassVar[Mapping[str, Mapping[str, Any]]]
    description: ClassVar[str] = ""
    # The kinds of data it trains on: "image" (x float in [-1, 1] [b, C, H, W]) and/or "table"
    # (x the encoded rows float [b, D], see `dpsynth.data.table_codec`). The training loop refuses
    # any other kind (exit 2) before anything is read.
    modalities: ClassVar[tuple[str, ...]] = ("image",)
    # Presets for tables, where they differ from the image ones (a backend that supports tables
    # usually needs other networks and kernels); `presets_for` picks the set for the data.
    table_presets: ClassVar[Mapping[str, Mapping[str, Any]]] = {}
    table_advice: ClassVar[str | None] = None  # `train`'s warning: a better table method
    reuses_one_ways: ClassVar[bool] = False  # the schema release's 1-ways (marginal.one_ways)
    draws_end_tails: ClassVar[bool] = False  # end bins drawn by tails: the release widens them
    # A warning `train` gives for a preset whose measured release fails the rule the others
    # are held to (e.g. worse FID than the frequency model alone), by preset name.
    preset_advice: ClassVar[Mapping[str, str]] = {}
    # Presets whose generator starts from declared-public images (see `public_requirement`).
    public_presets: ClassVar[frozenset[str]] = frozenset()
    # What `trainer` and `generator_from_state` build: a `Trainer` made as
    # `trainer_class(info, config, plan, device, seed, randomness)`, and a `Generator` with
    # `from_state(state)`.
    trainer_class: ClassVar[type[Trainer]]
    generator_class: ClassVar[type[Generator]]

    def public_requirement(self, preset: str, config: Mapping[str, Any]) -> str | None:
        """Why this run needs labelled `--public` images (refused before any spend), or None."""
        if preset in self.public_presets:
            return "starts its generator from declared-public images instead of a DP warm start"
        return None

    def presets_for(self, info: DataInfo) -> Mapping[str, Mapping[str, Any]]:
        """The presets that apply to this data: `table_presets` for a table when given."""
        if info.modality == "table" and self.table_presets:
            return self.table_presets
        return self.presets

    def config(self, preset: str, overrides: Mapping[str, Any], info: DataInfo) -> dict[str, Any]:
        """The run's hyper-parameters: the preset with `--set key=value` overrides applied.

        Unknown keys and preset names are a UsageError; override values are cast to the
        preset value's type. Shared keys are checked or resolved here: `sample_truncation`
        must be in (0, 4]; `warm_start_clip` 0 becomes √d for images (no record clipped).
        """
        presets = self.presets_for(info)
        if preset not in presets:
            kind = " on tables" if info.modality == "table" else ""
            raise UsageError(
                f"unknown preset {preset!r} for --method {self.name}{kind}; "
                f"choose from {', '.join(presets)}"
            )
        merged = with_overrides(presets[preset], overrides, self.name)
        check_truncation(merged.get("sample_truncation", 1.0), "--set sample_truncation")
        if float(merged.get("warm_start_clip", 1.0)) == 0 and info.modality == "image":
            # 0: the largest norm of a record in [-1, 1] (no clipping), from the public shape
            merged["warm_start_clip"] = math.sqrt(math.prod(int(s) for s in info.shape))
        merged["preset"] = preset
        return merged

    def recommended_preset(self, info: DataInfo, epsilon: float) -> str:
        """The preset this backend recommends (`--preset auto`) for data of this public shape
        and size at ε. Only public facts go in (the record count, shape, label set and the
        target ε, which may be inf), so the choice spends no budget. The leaderboard takes it
        when no `--preset` is given; a backend with presets for other data overrides this."""
        return "small"

    def quality_preset(self, info: DataInfo, epsilon: float) -> str | None:
        """Its slower tier (`--preset quality`, within an hour on the 2-core CPU) for the same
        public facts, or None (the default: no quality tier)."""
        return None

    def estimated_train_seconds(self, info: DataInfo, epsilon: float) -> float | None:
        """`train`'s running time with the recommended preset on the project's 2-core CPU,
        estimated from public facts only (the shape, the schema, N and ε), for `--method
        auto`; None where the backend has no model of it."""
        return None

    def validate_config(self, config: Mapping[str, Any], info: DataInfo) -> None:
        """Raise UsageError for a value the run could not use (exit 2).

        Called by the training loop before the plan is made and the spend reserved, so that a
        bad `--set` value never costs budget. This base version checks what every backend
        shares: numbers are finite, `lr` and `max_grad_norm` are positive, `batch_size` is in
        [1, N] (q = B/N ≤ 1, the rule `calibrate` applies too) and `steps` in [1, MAX_STEPS].
        Backends extend it with their own keys.
        """
        for key, value in config.items():
            values = value if isinstance(value, (list, tuple)) else [value]
            for item in values:
                if isinstance(item, float) and not math.isfinite(item):
                    raise UsageError(f"--set {key}: must be a finite number, got {value}")
        for key in ("lr", "max_grad_norm"):
            if key in config and not float(config[key]) > 0:
                raise UsageError(f"--set {key}: must be positive, got {config[key]}")
        if "batch_size" in config:
            batch = int(config["batch_size"])
            if batch < 1:
                raise UsageError(f"--set batch_size: must be at least 1, got {batch}")
            if batch > info.n:
                raise UsageError(
                    f"--set batch_size: {batch} exceeds the data set's {info.n} records "
                    "(the sampling rate q = B/N would be above 1)"
                )
        if "steps" in config:
            steps = int(config["steps"])
            if not 1 <= steps <= MAX_STEPS:
                raise UsageError(f"--set steps: must be in [1, {MAX_STEPS:.0e}], got {steps}")

    def plan(
        self,
        info: DataInfo,
        target: PrivacyTarget,
        config: Mapping[str, Any],
        prior_events: tuple[AnyEvent, ...] = (),
    ) -> PrivacyPlan:
        """The run's privacy plan for `target` after the ledger's `prior_events` on the data,
        from public facts only, before any record is read (`plan_from`)."""
        return self.plan_from(PlanFacts(info, target, config, tuple(prior_events)))

    def plan_from(self, facts: PlanFacts) -> PrivacyPlan:
        """Default plan: one Poisson-subsampled Gaussian over `config['steps']` steps.

        Uses config keys `batch_size` (expected), `steps`, `max_grad_norm`. With
        `warm_start_share` > 0 (and `warm_start_clip`, `warm_start_count_weight`) the plan
        first releases DP central images with that share of the ε, composed with the steps
        (`dpsynth.privacy.releases.central`); the loop hands the release to `Trainer.warm_start`.
        """
        from dpsynth.privacy.accounting.dpsgd_plan import plan_poisson_gaussian
        from dpsynth.privacy.releases.central import plan_dpsgd_with_central_images

        info, target, config, prior_events = facts.unpacked()
        if float(config.get("warm_start_share", 0.0)) > 0:
            return plan_dpsgd_with_central_images(
                target=target,
                n=info.n,
                expected_batch_size=float(config["batch_size"]),
                steps=int(config["steps"]),
                max_grad_norm=float(config["max_grad_norm"]),
                share=float(config["warm_start_share"]),
                clip_norm=float(config["warm_start_clip"]),
                count_weight=float(config.get("warm_start_count_weight", 1.0)),
                prior_events=prior_events,
            )

        return plan_poisson_gaussian(
            target=target,
            n=info.n,
            expected_batch_size=float(config["batch_size"]),
            steps=int(config["steps"]),
            max_grad_norm=float(config["max_grad_norm"]),
            prior_events=prior_events,
        )

    def trainer(
        self,
        info: DataInfo,
        config: Mapping[str, Any],
        plan: PrivacyPlan,
        device: torch.device,
        seed: int,
        randomness: PrivateRandomness | None = None,
    ) -> Trainer:
        """A fresh `trainer_class` (weights initialised from `seed`, never from the data).

        Every random draw of training (noise, per-record randomness) comes from generators
        of `randomness` (a fresh OS secret when None), never from `seed`.
        """
        return self.trainer_class(info, config, plan, torch.device(device), seed, randomness)

    def generator_from_state(
        self,
        info: DataInfo,
        config: Mapping[str, Any],
        tensors: Mapping[str, torch.Tensor],
        device: torch.device,
    ) -> Generator:
        """Rebuild the generator from saved weights (as `Trainer.state_tensors` wrote them):
        `generator_class.from_state`, then `finish_generator`."""
        state = GeneratorState(info, config, tensors, torch.device(device))
        return self.finish_generator(self.generator_class.from_state(state), state)

    def finish_generator(self, sampler: Generator, state: GeneratorState) -> Generator:
        """What stands around a rebuilt generator (the template: the run's DP teacher's
        filter); default: the generator itself."""
        return sampler
