"""PSG's trainer: the synthetic set S (pixels or the generator prior), the matching network θ
redrawn per run from public seeds, one DP-SGD release and one update of S per loop step, and
the checkpointed state."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import torch
from torch.func import functional_call
from torch.nn import functional as F

from dpsynth.data.images import DataInfo
from dpsynth.methods.base import saved_under
from dpsynth.methods.psg.generator import PSGGenerator
from dpsynth.methods.psg.matching import match_loss
from dpsynth.methods.psg.model import ConvNet
from dpsynth.methods.psg.prior import PriorGenerator
from dpsynth.methods.template import StagedTrainer, seeded
from dpsynth.privacy.mechanisms.dpsgd import PrivateGradient
from dpsynth.privacy.mechanisms.randomness import PrivateRandomness
from dpsynth.privacy.releases.central import CentralImages


def public_seed(seed: int, purpose: str, index: int = 0) -> int:
    """A 63-bit seed for public randomness (network inits, S's init, θ's shuffles)."""
    digest = hashlib.sha256(f"dpsynth-psg|{purpose}|{seed}|{index}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def build_network(info: DataInfo, config: Mapping[str, Any]) -> ConvNet:
    """The matching ConvNet for this data (weights from the global RNG: seed it first)."""
    return ConvNet(
        tuple(info.shape),
        len(info.classes),
        width=int(config["width"]),
        depth=int(config["depth"]),
        norm=str(config["norm"]),
    )


def public_members(
    x: torch.Tensor, y: torch.Tensor, labels: torch.Tensor, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """For each member of S (its label in `labels`), a declared-public image of that class,
    drawn with replacement from the public seed; and a mask of the members whose class the
    public set lacks (they keep their initialisation)."""
    rng = torch.Generator().manual_seed(public_seed(seed, "public-init"))
    chosen = torch.zeros((len(labels), *x.shape[1:]), dtype=x.dtype)
    found = torch.zeros(len(labels), dtype=torch.bool)
    y, labels = y.cpu(), labels.cpu()
    for label in labels.unique().tolist():
        members = (labels == label).nonzero().flatten()
        pool = (y == label).nonzero().flatten()
        if len(pool) == 0:
            continue
        picks = pool[torch.randint(len(pool), (len(members),), generator=rng)]
        chosen[members] = x[picks.to(x.device)].cpu()
        found[members] = True
    return chosen, found


def synthetic_labels(num_classes: int, spc: int) -> torch.Tensor:
    """The fixed, balanced labels of S: [0]*spc ++ [1]*spc ++ … (public)."""
    return torch.arange(num_classes).repeat_interleave(spc)


class PSGTrainer(StagedTrainer):
    """One PSG run: S and its optimiser, the current network θ, and the release counter."""

    # The match loss is a function of the released noisy gradient, S and θ only.
    released_stats = ("match_loss",)

    def setup(self, randomness: PrivateRandomness) -> None:
        """S and its optimiser, the prior, the matching network and the secret streams."""
        info, config, plan, seed = self.info, self.config, self.plan, self.seed
        self.num_classes = len(info.classes)
        self.spc = int(config["spc"])
        self.outer_loop = int(config["outer_loop"])
        self.batches = int(config["batches"])
        self.inner_loop = int(config["inner_loop"])
        self.labels = synthetic_labels(self.num_classes, self.spc).to(self.device)
        init = torch.Generator().manual_seed(public_seed(seed, "synthetic-init"))
        self.prior: PriorGenerator | None = None
        if config["prior"] == "none":
            # S starts as N(0, 1) in the training scale, never from real data; with a warm
            # start (`warm_start`) it is replaced by the DP central images before the first
            # release.
            images = torch.randn(
                self.num_classes * self.spc, *info.shape, generator=init, device=init.device
            )
            self.images = images.to(self.device).requires_grad_(True)
            self.syn_optimizer: torch.optim.Optimizer = torch.optim.SGD(
                [self.images], lr=float(config["lr_syn"]), momentum=float(config["momentum_syn"])
            )
        else:
            # The generator prior (spec §2.4): S = G(z_j, y_j; φ), fixed codes, φ learns.
            latent_dim = int(config["prior_latent_dim"])
            self.codes = torch.randn(
                self.labels.numel(), latent_dim, generator=init, device=init.device
            ).to(self.device)
            with seeded(public_seed(seed, "prior-init")):
                prior = PriorGenerator(
                    tuple(info.shape), self.num_classes, latent_dim, int(config["prior_width"])
                )
            self.prior = prior.to(self.device)
            self.syn_optimizer = torch.optim.Adam(
                self.prior.parameters(), lr=float(config["lr_prior"])
            )
            self.images = self._synthetic().detach()
        self.net = build_network(info, config).to(self.device)
        self._fresh_network(0)
        self.net_optimizer = torch.optim.SGD(self.net.parameters(), lr=float(config["lr_net"]))
        self.steps_done = 0
        # The DP noise comes from the run's secret stream, never from the public seed.
        self.private_gradient = PrivateGradient(
            self.net,
            self._record_loss,
            noise_multiplier=plan.noise_multiplier,
            max_grad_norm=plan.max_grad_norm,
            expected_batch_size=plan.expected_batch_size,
            generator=randomness.generator("psg/noise", self.device),
            micro_batch_size=int(config["micro_batch_size"]),
            private=plan.private,
            # ghost clipping (no per-record gradients) where every trained layer allows it
            batch_loss_fn=self._batch_loss,
        )
        self.start_stages(randomness)

    def warm_start(self, release: CentralImages) -> None:
        """Start S from the DP central images (issues 14 and 12) instead of N(0, 1).

        Each class's spc members become the released class mean (public once released, in
        the training scale [-1, 1]) plus `warm_start_jitter`·N(0, I) from the public seed, so
        that the members differ and gradient matching can pull them apart. With the generator
        prior, G instead takes `warm_start_steps` Adam steps of mean squared error towards
        those images. S's optimiser state starts at zero; θ is untouched. The release's cost
        is the plan's `gaussian` event.
        """
        noise_rng = torch.Generator().manual_seed(public_seed(self.seed, "warm-start-jitter"))
        jitter = float(self.config["warm_start_jitter"])
        # the model's samples (a frequency release), else mean[y] + jitter·N(0, I)
        central = CentralImages(release.means.cpu(), release.counts, release.model)
        targets = central.records(self.labels.cpu(), jitter, noise_rng).to(self.device)
        self._start_from(targets, int(self.config["warm_start_steps"]))

    def public_uses(self, labelled: bool) -> tuple[str, ...]:
        """The synthetic set S (labelled images, `public_pretrain_steps` > 0, and no DP warm
        start, which would replace S), and the DP teacher when it can use the labels."""
        cfg = self.config
        replaced = float(cfg.get("frequency_share", 0)) > 0 or float(cfg["warm_start_share"]) > 0
        start = labelled and int(cfg.get("public_pretrain_steps", 0)) > 0 and not replaced
        uses = ("synthetic set",) if start else ()
        return uses + (("DP teacher",) if self.teacher.uses_public(labelled) else ())

    def pretrain_public(self, x: torch.Tensor, y: torch.Tensor | None) -> None:
        """Start S from declared-public images instead of N(0, 1): each member becomes a
        public image of its class (drawn from the public seed; a class the set lacks keeps
        its N(0, 1) start). With the generator prior, G takes `public_pretrain_steps` Adam
        steps of mean squared error towards them. S's optimiser state restarts at zero; θ
        is untouched. The DP teacher, if any, pretrains on the labelled images."""
        if y is not None and "synthetic set" in self.public_uses(True):
            chosen, found = public_members(x.float(), y, self.labels, self.seed)
            found = found.to(self.device)
            targets = torch.where(
                found[:, None, None, None], chosen.to(self.device), self._synthetic().detach()
            )
            self._start_from(targets, int(self.config["public_pretrain_steps"]))
        self.teacher.pretrain_public(x, y)

    def _start_from(self, targets: torch.Tensor, fit_steps: int) -> None:
        """S set to `targets`: copied in, or with the generator prior `fit_steps` steps of G
        towards them (`_fit_prior`); S's optimiser state restarts at zero."""
        if self.prior is None:
            with torch.no_grad():
                self.images.copy_(targets)
        else:
            self._fit_prior(targets, fit_steps)
        self.syn_optimizer.state.clear()

    def _fit_prior(self, targets: torch.Tensor, steps: int) -> None:
        """`steps` optimiser steps of G's outputs towards `targets` (mean squared error)."""
        assert self.prior is not None
        for _ in range(steps):
            loss = F.mse_loss(self._synthetic(), targets)
            self.syn_optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.syn_optimizer.step()
        self.images = self._synthetic().detach()

    def _synthetic(self) -> torch.Tensor:
        """S as a function of what is optimised: the pixels, or G's outputs at the codes."""
        if self.prior is None:
            return self.images
        return self.prior(self.codes, self.labels)

    def _record_loss(
        self,
        params: dict[str, torch.Tensor],
        buffers: dict[str, torch.Tensor],
        x: torch.Tensor,
        y: torch.Tensor,
    ) -> torch.Tensor:
        """Cross-entropy of ONE record (no batch dim) under the given parameters."""
        logits = functional_call(self.net, (params, buffers), (x.unsqueeze(0),))
        return F.cross_entropy(logits, y.unsqueeze(0))

    def _batch_loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Each record's cross-entropy [b] (the same loss as `_record_loss`, batched)."""
        return F.cross_entropy(self.net(x), y, reduction="none")

    def _fresh_network(self, run_index: int) -> None:
        """Re-draw θ for run `run_index` with the default init, from public randomness."""
        with seeded(public_seed(self.seed, "network", run_index)):
            cpu_net = build_network(self.info, self.config)
        with torch.no_grad():
            for mine, fresh in zip(self.net.parameters(), cpu_net.parameters(), strict=True):
                mine.copy_(fresh.to(self.device))

    def position(self, step: int) -> tuple[int, int, int]:
        """(run r, outer iteration t, batch k) of release number `step` (all from 0)."""
        per_run = self.outer_loop * self.batches
        return step // per_run, (step // self.batches) % self.outer_loop, step % self.batches

    def synthetic_gradient(
        self, create_graph: bool, images: torch.Tensor | None = None
    ) -> list[torch.Tensor]:
        """∇_θ of the mean cross-entropy on the whole of S (graph kept for ∇_S when asked);
        `images`: S as computed with its graph (default: the current pixels)."""
        images = self.images if images is None else images
        loss = F.cross_entropy(self.net(images), self.labels)
        return list(
            torch.autograd.grad(loss, list(self.net.parameters()), create_graph=create_graph)
        )

    def step(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
        """One release: the noisy real gradient at θ, one update of S, and θ's epochs on S."""
        run, outer, batch = self.position(self.steps_done)
        if outer == 0 and batch == 0 and self.steps_done > 0:
            self._fresh_network(run)
        self.net.train()
        for p in self.net.parameters():
            p.grad = None
        x = x.to(self.device, torch.float32)
        y = y.to(self.device, torch.int64)
        stats = self.private_gradient.compute(x, y)
        released = [p.grad.detach().clone() for p in self.net.parameters()]
        for p in self.net.parameters():
            p.grad = None
        synthetic = self._synthetic()
        distance = match_loss(self.synthetic_gradient(True, synthetic), released)
        self._descend_synthetic(distance)
        self.steps_done += 1
        if batch == self.batches - 1 and outer < self.outer_loop - 1:
            self._train_network_on_synthetic()
        out = {
            "loss": float(stats.get("mean_loss", float("nan"))),
            "match_loss": float(distance.detach()),
        }
        for key in ("batch_size", "clip_fraction", "mean_grad_norm"):
            out[key] = float(stats[key])
        return out

    def _descend_synthetic(self, distance: torch.Tensor) -> None:
        """One optimiser step on what S is made of (pixels, or G's weights) for `distance`."""
        if self.prior is None:
            (image_grad,) = torch.autograd.grad(distance, [self.images])
            self.syn_optimizer.zero_grad(set_to_none=True)
            self.images.grad = image_grad
            self.syn_optimizer.step()
            return
        self.syn_optimizer.zero_grad(set_to_none=True)
        distance.backward(inputs=list(self.prior.parameters()))
        self.syn_optimizer.step()
        with torch.no_grad():
            self.images = self._synthetic()

    def _train_network_on_synthetic(self) -> None:
        """J epochs of plain SGD on θ over the (detached) current S, shuffled minibatches."""
        images, labels = self.images.detach(), self.labels
        order_rng = torch.Generator().manual_seed(
            public_seed(self.seed, "inner-shuffle", self.steps_done)
        )
        size = int(self.config["batch_train"])
        for _ in range(self.inner_loop):
            order = torch.randperm(
                images.shape[0], generator=order_rng, device=order_rng.device
            ).to(self.device)
            for start in range(0, images.shape[0], size):
                index = order[start : start + size]
                loss = F.cross_entropy(self.net(images[index]), labels[index])
                self.net_optimizer.zero_grad(set_to_none=True)
                loss.backward()
                self.net_optimizer.step()

    def own_state_tensors(self) -> dict[str, torch.Tensor]:
        """S, its labels and momentum, θ, and the release counter (no secret RNG state)."""
        out: dict[str, torch.Tensor] = {
            "synthetic.images": self.images.detach(),
            "synthetic.labels": self.labels,
            "trainer.steps_done": torch.tensor(self.steps_done, dtype=torch.int64),
        }
        for key, value in self.net.state_dict().items():
            out[f"net.{key}"] = value
        if self.prior is None:
            momentum = self.syn_optimizer.state.get(self.images, {}).get("momentum_buffer")
            if momentum is not None:
                out["synthetic.momentum"] = momentum
        else:
            out["prior.codes"] = self.codes
            for key, value in self.prior.state_dict().items():
                out[f"prior.net.{key}"] = value
            for index, slots in self.syn_optimizer.state_dict()["state"].items():
                for slot, value in slots.items():
                    out[f"prior.optimizer.{index}.{slot}"] = torch.as_tensor(value)
        return {k: v.detach().cpu().clone().contiguous() for k, v in out.items()}

    def load_own_state(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Restore what `own_state_tensors` wrote, so a resumed run continues exactly."""
        with torch.no_grad():
            self.images.copy_(tensors["synthetic.images"].to(self.device))
        self.labels = tensors["synthetic.labels"].to(self.device, torch.int64)
        self.net.load_state_dict(saved_under(tensors, "net."))
        self.syn_optimizer.state.clear()
        if self.prior is not None:
            self.codes = tensors["prior.codes"].to(self.device)
            self.prior.load_state_dict(saved_under(tensors, "prior.net."))
            state: dict[int, dict[str, torch.Tensor]] = {}
            for key, value in saved_under(tensors, "prior.optimizer.").items():
                index, slot = key.split(".", 1)
                state.setdefault(int(index), {})[slot] = value.to(self.device)
            groups = self.syn_optimizer.state_dict()["param_groups"]
            self.syn_optimizer.load_state_dict({"state": state, "param_groups": groups})
        elif "synthetic.momentum" in tensors:
            self.syn_optimizer.state[self.images] = {
                "momentum_buffer": tensors["synthetic.momentum"].to(self.device).clone()
            }
        self.steps_done = int(tensors["trainer.steps_done"])

    def own_generator(self) -> PSGGenerator:
        """A sampler over a copy of the current S."""
        return PSGGenerator(
            self.images.detach().clone(),
            self.labels,
            self.info.classes,
            self.device,
            bool(self.config["augment_replicas"]),
        )
