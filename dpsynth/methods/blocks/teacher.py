"""The DP teacher a backend may train (config `teacher_share` > 0, defaults `TEACHER_DEFAULTS`).

A small classifier trained with DP-SGD on all records once, at loop step 0, or with
`teacher_pretrain` before the last step from a fit to the backend's own samples
(`dpsynth.privacy.releases.classifier`; its own event in the run's plan, composed by PRV), whose
only use is post-processing the backend's samples: `TeacherFilter` draws `teacher_oversample`
candidates per requested image and keeps, for each requested label, the candidates the
teacher finds most likely to be of that class.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from dpsynth.errors import UsageError
from dpsynth.methods.base import Generator
from dpsynth.methods.blocks.teacher_filter import TeacherFilter
from dpsynth.privacy.accounting.plan import PrivacyPlan
from dpsynth.privacy.mechanisms.randomness import PrivateRandomness
from dpsynth.privacy.releases.classifier import (
    ClassifierSchedule,
    classifier_plan_in,
    train_private_classifier,
)

TEACHER_DEFAULTS: dict[str, Any] = {
    # Share of the ε left for the DP teacher (0: none); the backend's own mechanisms are
    # calibrated on what remains, and PRV composes both.
    "teacher_share": 0.0,
    "teacher_batch": 256,
    "teacher_epochs": 15.0,
    "teacher_lr": 5e-3,
    "teacher_clip": 1.0,
    "teacher_augment": 0,
    "teacher_ema": 0.0,
    "teacher_width": 16,
    # How samples are chosen (`teacher_filter.py`): "rank" draws oversample × the request
    # with the requested labels and keeps the ones the teacher rates most likely of their
    # label; "relabel" draws candidates of every class and fills each label with candidates
    # the teacher assigns to it (its argmax), most confident first.
    "teacher_filter": "rank",
    "teacher_oversample": 2.0,
    # > 0: the teacher is trained before the LAST loop step instead of the first, starting
    # from a network fitted (without privacy: post-processing) to this many images of the
    # backend's own generator as it is then, for `teacher_pretrain_epochs` epochs.
    "teacher_pretrain": 0,
    "teacher_pretrain_epochs": 3,
    # With `train --public` (declared-public images with the data's labels): Adam steps of the
    # teacher's classifier on them before loop step 0, without privacy (no data read).
    "public_teacher_steps": 300,
}
TEACHER_FILTERS = ("rank", "relabel")

# The teacher of the 28×28 presets above ε = 3 (issue 28): the backend plans for 30% of ε and
# the teacher's σ fills the rest; it starts from a fit to 10,000 of the backend's samples and
# labels the release. It raises CNN accuracy through its labels, not the images' look, so only
# the teacher presets use it
# (measured in bench/results/2026-11-23-tuning-logs/tuning-28.md).
RELABELLING_TEACHER: dict[str, Any] = {
    "teacher_share": 0.7,
    "teacher_filter": "relabel",
    "teacher_pretrain": 10000,
}
# The same teacher on half of ε (the rest to the backend's stages): dpkernel's teacher presets
# and the ablation rows of bench/ablation.py, which keep half of ε for what they compare.
HALF_BUDGET_TEACHER: dict[str, Any] = {**RELABELLING_TEACHER, "teacher_share": 0.5}
# What a preset derived from one with `RELABELLING_TEACHER` sets to have no teacher.
NO_TEACHER: dict[str, Any] = {key: TEACHER_DEFAULTS[key] for key in RELABELLING_TEACHER}

# The optional DP frequency model (`dpsynth.privacy.releases.frequency`): `frequency_share` of ε (0:
# off) on per-class means and second moments of the images' lowest DCT frequencies (B×B per
# channel, features of x + 1 clipped to `frequency_clip`; 0: 0.6·√(H·W·C)); it replaces the
# central images as the backend's warm start (its samples, not means plus jitter).


def check_teacher_config(config: Mapping[str, Any]) -> None:
    """UsageError for a teacher setting no run could use (before any budget is spent)."""
    for key in ("public_teacher_steps", "public_pretrain_steps"):
        if int(config.get(key, 0)) < 0:
            raise UsageError(f"--set {key}: must be ≥ 0, got {config[key]}")
    share = float(config.get("teacher_share", 0.0))
    if share == 0:
        return
    if not 0 < share < 1:
        raise UsageError(f"--set teacher_share: must be in [0, 1), got {share}")
    if config["teacher_filter"] not in TEACHER_FILTERS:
        raise UsageError(f"--set teacher_filter: choose from {', '.join(TEACHER_FILTERS)}")
    if float(config["teacher_oversample"]) < 1:
        raise UsageError("--set teacher_oversample: must be at least 1")
    if int(config["teacher_width"]) < 1:
        raise UsageError("--set teacher_width: must be at least 1")
    if int(config["teacher_pretrain"]) < 0 or int(config["teacher_pretrain_epochs"]) < 0:
        raise UsageError("--set teacher_pretrain and teacher_pretrain_epochs: must be ≥ 0")
    teacher_schedule(config).check()


def teacher_schedule(config: Mapping[str, Any]) -> ClassifierSchedule:
    """The teacher's DP-SGD schedule from the run's config."""
    return ClassifierSchedule(
        batch_size=int(config["teacher_batch"]),
        epochs=float(config["teacher_epochs"]),
        lr=float(config["teacher_lr"]),
        max_grad_norm=float(config["teacher_clip"]),
        augment_copies=int(config["teacher_augment"]),
        ema=float(config["teacher_ema"]),
    )


class TeacherNet(nn.Module):
    """Two 3×3 conv blocks (GroupNorm, ReLU, 2×2 max-pool), a 128-unit layer, the logits."""

    def __init__(self, channels: int, classes: int, height: int, width: int, w: int = 16):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(channels, w, 3, padding=1),
            nn.GroupNorm(4, w),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(w, 2 * w, 3, padding=1),
            nn.GroupNorm(8, 2 * w),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.head = nn.Sequential(
            nn.Flatten(),
            nn.Linear(2 * w * (height // 4) * (width // 4), 128),
            nn.ReLU(),
            nn.Linear(128, classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of images in [-1, 1]."""
        return self.head(self.features(x))


def _teacher_net(info: Any, config: Mapping[str, Any]) -> TeacherNet:
    channels, height, width = (int(s) for s in info.shape)
    return TeacherNet(channels, len(info.classes), height, width, int(config["teacher_width"]))


class Teacher:
    """A trainer's DP teacher: built from the public seed, trained once at loop step 0 on
    every record through `dpsynth.privacy.releases.classifier`, saved and restored with the trainer.

    Inactive (every method a no-op) when the plan holds no `dp_classifier` event.
    """

    def __init__(
        self,
        info: Any,
        config: Mapping[str, Any],
        plan: PrivacyPlan,
        device: torch.device,
        seed: int,
        randomness: PrivateRandomness,
    ) -> None:
        self.plan = classifier_plan_in(plan.events, info.n)
        self.net: TeacherNet | None = None
        self.trained = False
        if self.plan is None:
            return
        self.schedule = teacher_schedule(config)
        self.pretrain = int(config["teacher_pretrain"])
        self.pretrain_epochs = int(config["teacher_pretrain_epochs"])
        self.public_steps = int(config.get("public_teacher_steps", 0))
        self.loop_steps = int(plan.steps)
        self.seed = int(seed)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed + 7919)  # public initialisation, apart from the backend's
            self.net = _teacher_net(info, config).to(device)
        # Secret streams, handed out up front so that a checkpoint saves them with the loop's.
        self.streams = {
            name: randomness.generator(f"teacher/{name}", device)
            for name in ("batches", "noise", "augment")
        }

    @property
    def active(self) -> bool:
        """Whether the run has a teacher."""
        return self.net is not None

    @property
    def release_step(self) -> int:
        """The loop step before which the teacher is trained: the first, or with
        `teacher_pretrain` the last (so that it starts from the generator's late samples)."""
        return self.loop_steps - 1 if self.pretrain else 0

    def release_whole_data(
        self,
        step: int,
        x: torch.Tensor,
        y: torch.Tensor,
        generator: Callable[[], Generator] | None = None,
    ) -> None:
        """Train the teacher on all records before loop step `release_step` (once: a resumed
        run's checkpoint holds it). A run restarted before it was saved retrains it from the
        same secret streams' states, so with the same batches and noise: the same release.
        `generator` gives the backend's generator as it is (for `teacher_pretrain`)."""
        if self.net is None or self.trained or step != self.release_step:
            return
        assert self.plan is not None
        if self.pretrain and generator is not None:
            self._pretrain(generator(), x.device)
        train_private_classifier(
            self.net,
            x,
            y,
            self.plan,
            self.schedule,
            sampling_generator=self.streams["batches"],
            noise_generator=self.streams["noise"],
            augment_generator=self.streams["augment"],
        )
        self.trained = True

    def uses_public(self, labelled: bool) -> bool:
        """Whether `pretrain_public` would train on a declared-public set (labelled or not)."""
        return self.net is not None and labelled and self.public_steps > 0

    def pretrain_public(self, x: torch.Tensor, y: torch.Tensor | None) -> None:
        """Fit the classifier to declared-public labelled images (x in [-1, 1], y in the
        data's classes) for `public_teacher_steps` Adam steps, before any private step:
        not private, no data read; batches drawn from the public seed. Nothing without a
        teacher or without labels."""
        if self.net is None or y is None or self.public_steps <= 0:
            return
        fit_steps(self.net, x, y, self.public_steps, self.seed + 27644437)

    def _pretrain(self, generator: Generator, device: torch.device) -> None:
        """Fit the network to `pretrain` balanced samples of `generator` (public: they are
        post-processing of the backend's released updates)."""
        assert self.net is not None
        x, y = balanced_samples(generator, self.pretrain, self.seed + 104729)
        fit_to_samples(
            self.net, x.to(device), y.to(device), self.pretrain_epochs, self.seed + 15485863
        )

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """`teacher.*` weights and the trained flag ({} without a teacher)."""
        if self.net is None:
            return {}
        out = {f"teacher.{k}": v.detach().clone() for k, v in self.net.state_dict().items()}
        out["teacher_trained"] = torch.tensor(int(self.trained))
        return out

    def load_state_tensors(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Restore `state_tensors`."""
        if self.net is None:
            return
        self.net.load_state_dict(_prefixed(tensors, "teacher."))
        self.trained = bool(int(tensors["teacher_trained"]))

    def wrap(self, generator: Generator, config: Mapping[str, Any]) -> Generator:
        """The backend's generator behind this teacher's filter (unchanged without one)."""
        if self.net is None or not self.trained:
            return generator
        return TeacherFilter(generator, self.net.eval(), config)


def balanced_samples(
    generator: Generator, size: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """`size` samples of `generator`, labels 0, 1, …, K−1 in turn, as images in [-1, 1] and
    their labels (on the generator's device); drawn from a public seed."""
    labels = (torch.arange(size) % len(generator.classes)).to(generator.device)
    rng = torch.Generator(device=generator.device).manual_seed(seed)
    images = torch.cat(list(generator.sample(labels, 500, rng)))
    return images.float() / 127.5 - 1.0, labels


def fit_to_samples(
    net: nn.Module, x: torch.Tensor, y: torch.Tensor, epochs: int, seed: int
) -> None:
    """Fit `net` to public labelled images without privacy (Adam 1e-3, batches of 128 in an
    order drawn from `seed`): the teacher's start before its DP-SGD."""
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
    order_rng = torch.Generator().manual_seed(seed)
    net.train()
    for _ in range(epochs):
        order = torch.randperm(len(y), generator=order_rng).to(x.device)
        for start in range(0, len(y), 128):
            index = order[start : start + 128]
            optimizer.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(net(x[index]), y[index]).backward()
            optimizer.step()


def fit_steps(
    net: nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int, seed: int, batch: int = 128
) -> None:
    """`steps` Adam steps (1e-3) of cross-entropy on public labelled images, each on `batch`
    of them drawn with replacement from `seed` (no privacy: public data only)."""
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
    rng = torch.Generator().manual_seed(seed)
    net.train()
    for _ in range(steps):
        index = torch.randint(0, len(y), (min(batch, len(y)),), generator=rng).to(x.device)
        optimizer.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(net(x[index]), y[index]).backward()
        optimizer.step()


def _prefixed(tensors: Mapping[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    return {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}


def teacher_from_state(
    generator: Generator,
    info: Any,
    config: Mapping[str, Any],
    tensors: Mapping[str, torch.Tensor],
) -> Generator:
    """A saved run's generator behind its teacher's filter (unchanged if it has none)."""
    if "teacher_trained" not in tensors or not int(tensors["teacher_trained"]):
        return generator
    net = _teacher_net(info, config)
    net.load_state_dict(_prefixed(tensors, "teacher."))
    return TeacherFilter(generator, net.to(generator.device).eval(), config)
