"""DPAF (Lin et al., arXiv 2304.12185) in the sound `strict` mode of spec `dpaf.md` §10.3.

Learning idea: a conditional DCGAN whose discriminator aggregates the SIN-normalised feature
vectors of a whole batch and adds Gaussian noise to that aggregate (DPAGG) in the forward
pass, so the layers after the aggregation (the head) train on released values only. The
layers before it are protected separately: conv1 by DP-SGD in a classifier C (phase 1,
transferred and frozen) or random and frozen, conv2* by one DP-SGD step per window of μ
discriminator steps. The generator never sees private data.

What differs from the paper (whose guarantee does not hold, spec §10.1-F2..F4):
- Poisson sampling everywhere, add/remove neighbours, public normalisers (B, μB);
- phase 1 is per-sample DP-SGD on ALL of C's parameters with per-sample targets
  (classification), not DP-SGD on conv1 through a clean aggregate and non-private layers;
- the conv2* gradient is evaluated at the RELEASED noisy aggregates (a record's gradient then
  depends on that record and on public values only), not at the clean aggregate;
- the window's shared sampling is accounted as one mechanism per window (no independent
  "three streams"), with the conservative bound of `dpsynth.privacy.aggregation`;
- the fake aggregate gets an independent noise draw of the same std as the real one (the
  same draw would cancel in the difference and reveal the real sum).

The generator's loss: the paper's (`g_loss=bce`, through the head on single samples) collapses
within each class, because a head that only sees batch means gives every fake sample the same
linear score; `g_loss=match` (preset `small`) has the generator match its per-class mean
features to the released per-class aggregates (`class_aggregates`), post-processing only.

`mode=paper` (explicit flag only) reproduces the paper's mechanism and claim (spec §10.2); it
is not DP, so its plan is recorded as not private with a labelled event (`NOT_DP_LABEL`).

How a step of the training loop maps onto DPAF: the loop draws one Poisson batch at rate
q_w = 1 − (1 − q)^μ per step. The first `c_steps` steps are phase-1 DP-SGD steps of C on that
lot; every later step is one window: each record of the union gets its participation pattern
in the μ discriminator steps (`window_patterns`), which makes the μ batches independent
Poisson(q) batches. Both kinds of step are dominated by a Poisson(q_w)-subsampled Gaussian of
multiplier σ_w, so one σ_w is calibrated for the whole run; phase 1 and phase 2 are recorded
as two ledger events with that σ_w.

`phase2_release=once` (with frozen conv2* and `g_loss=match`, where phase 2's target is a
fixed statistic: every class's feature sum and count): instead of a noisy sum per Poisson
batch, the loop hands the trainer the whole data set once, before the first phase-2 step, and
it releases the per-class sums with ONE Gaussian draw (`noisy_group_sums`, sensitivity the
rows' bound). At ε ≈ 10 one full release is much less noisy than the same ε spread over
~1000 subsampled releases (subsampling amplifies little there). The `windows` steps after it
are generator steps on the release: they read no data (`reads_batch` is false) and the plan's
release event declares them (`loop_steps_without_reads`). The plan is phase 1 (Poisson
Gaussian at q = B/N) plus one `gaussian` event at `release_share` of ε.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch.func import functional_call
from torch.nn import functional as F

from dpsynth.data.images import DataInfo, to_uint8
from dpsynth.errors import UsageError
from dpsynth.methods.base import (
    Generator,
    Method,
    PrivacyPlan,
    PrivacyTarget,
    Trainer,
    draw_latent,
    sample_truncation,
)
from dpsynth.methods.dpaf.model import (
    AggregateRows,
    Classifier,
    CondGenerator,
    Features,
    Head,
    init_weights,
)
from dpsynth.methods.dpaf.presets import CHOICES, PRESETS
from dpsynth.privacy.accounting import (
    calibrate_noise,
    compose_epsilon,
    gaussian_sigma_for_share,
)
from dpsynth.privacy.aggregation import (
    WINDOW_ACCOUNTING_NOTE,
    noisy_feature_sum,
    noisy_group_sums,
    private_gradient_sum,
    split_window_noise,
    window_patterns,
    window_sampling_rate,
)
from dpsynth.privacy.distributed import is_data_parallel, shard, shard_mask
from dpsynth.privacy.dpsgd import PrivateGradient, per_sample_grads
from dpsynth.privacy.plan_check import IDLE_STEPS_KEY, NOT_DP_LABEL
from dpsynth.privacy.randomness import PrivateRandomness

_ADAM_BETAS = (0.5, 0.999)
# Tags the ledger event of `phase2_release=once` (the trainer reads its σ from the plan).
ONCE_PHASE = "dpaf-phase2-once"
ONCE_MECHANISM = (
    "dpaf phase 2, released once: the per-class sums of every record's SIN features and count "
    "coordinate (each record's row renormed to the bound), one Gaussian release"
)
# `recommended_preset`: records with at least this many values get the 28×28 preset, at ε
# above this.
_LARGE_IMAGE_VALUES = 400
_SMALL_EPSILON = 3.0
# Records per forward pass when the whole data set's features are summed.
_FEATURE_CHUNK = 512
_CONV1_PREFIXES = ("image_in.", "label_in.", "conv1_rest.")
# The paper's canonical budget split (spec §2.9): ε₁ = 0.1 (conv1), ε₃ = 0.1 (DPAGG), the rest
# to conv2*; used only by `mode=paper`, whose accounting is not a DP guarantee.
_PAPER_SPLIT = (0.1, 0.1)
PAPER_MECHANISM = (
    "dpaf paper mode (spec §10.2): conv1 by DP-SGD through C's clean aggregate and non-private "
    "layers, conv2* gradients at the clean aggregate, the paper's three independent streams; "
    "the claimed epsilon is not a proven bound (spec §10.1 F2-F4)"
)


# --------------------------------------------------------------------------- networks


def build_features(info: DataInfo, config: Mapping[str, Any]) -> Features:
    """The discriminator's (or C's) feature extractor for this data's shape and labels."""
    return Features(
        tuple(info.shape),
        len(info.classes),
        int(config["width"]),
        int(config["conv1_layers"]),
        int(config["conv2_layers"]),
    )


def build_generator(info: DataInfo, config: Mapping[str, Any]) -> CondGenerator:
    """The conditional generator for this data's shape and labels."""
    return CondGenerator(
        tuple(info.shape), len(info.classes), int(config["latent_dim"]), int(config["g_width"])
    )


def _noise_ratio(config: Mapping[str, Any]) -> float:
    """σ_agg/σ_conv2 for the window split; 0 (no conv2* step) with `train_conv2=false`."""
    return float(config["noise_ratio"]) if config["train_conv2"] else 0.0


def _onehot(labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    return F.one_hot(labels, num_classes).float()


# --------------------------------------------------------------------------- generator


class DPAFGenerator(Generator):
    """Samples uint8 images [b, C, H, W] from the trained conditional generator, its latent at
    scale `truncation` (`Generator.truncation`)."""

    def __init__(
        self,
        net: CondGenerator,
        classes: tuple[str, ...],
        device: torch.device,
        truncation: float = 1.0,
    ):
        self.net = net.to(device).eval()
        self.truncation = float(truncation)
        self.classes = tuple(classes)
        self.shape = tuple(net.shape)  # type: ignore[assignment]
        self.device = device

    @torch.no_grad()
    def sample(
        self, labels: torch.Tensor, batch_size: int, generator: torch.Generator
    ) -> Iterator[torch.Tensor]:
        """Yield uint8 batches for `labels` in order; latents come from `generator`."""
        for start in range(0, int(labels.numel()), batch_size):
            chunk = labels[start : start + batch_size].to(torch.int64)
            z = draw_latent(chunk.numel(), self.net.latent_dim, generator, self.truncation)
            onehot = _onehot(chunk.to(self.device), self.net.num_classes)
            yield to_uint8(self.net(z.to(self.device), onehot)).cpu()


# --------------------------------------------------------------------------- trainer


class DPAFTrainer(Trainer):
    """One run: C (phase 1), the split discriminator, the generator and their optimisers."""

    # Functions of the released noisy aggregates, of public weights and of generated samples.
    released_stats = ("d_loss", "g_loss")

    def __init__(
        self,
        info: DataInfo,
        config: Mapping[str, Any],
        plan: PrivacyPlan,
        device: torch.device,
        seed: int,
        randomness: PrivateRandomness | None = None,
    ) -> None:
        self.info = info
        self.config = dict(config)
        self.plan = plan
        self.device = torch.device(device)
        self.num_classes = len(info.classes)
        self.batch_size = int(config["batch_size"])
        self.window = int(config["window"])
        self.c_steps = int(config["c_steps"])
        self.step_rate = min(1.0, self.batch_size / info.n)
        # Public normalisers: B for a mean aggregate, μB for the conv2* step.
        self.agg_normalizer = float(self.batch_size) if config["agg_reduction"] == "mean" else 1.0
        self.train_conv2 = bool(config["train_conv2"])
        self.match = config["g_loss"] == "match"
        # The head is trained only where something uses it (the BCE generator loss or conv2*).
        self.use_head = not self.match or self.train_conv2
        self.paper = config["mode"] == "paper"
        self.once = config["phase2_release"] == "once"
        paper_event = next((e for e in plan.events if e.get("label") == NOT_DP_LABEL), None)
        once_event = next((e for e in plan.events if e.get("phase") == ONCE_PHASE), None)
        if (self.paper or self.once) and is_data_parallel():
            raise UsageError("--set mode=paper and phase2_release=once run in one process only")
        # The noise multiplier of the one release of phase2_release=once (0: not private).
        self.once_sigma = float(once_event["noise_multiplier"]) if once_event else 0.0
        if paper_event is not None:
            # The paper's own noise (not a DP guarantee; the plan is labelled so).
            self.c_sigma = float(paper_event["c_noise_multiplier"])
            self.agg_sigma = float(paper_event["agg_noise_multiplier"])
            self.conv2_sigma = float(paper_event["conv2_noise_multiplier"])
            self.clip_conv2 = float(config["clip_conv2"])
        elif plan.private:
            window_sigma = float(plan.noise_multiplier)
            self.c_sigma = window_sigma
            self.agg_sigma, self.conv2_sigma = split_window_noise(
                window_sigma, self.window, _noise_ratio(config)
            )
            self.clip_conv2 = float(config["clip_conv2"])
        else:
            self.c_sigma = self.agg_sigma = self.conv2_sigma = 0.0
            self.clip_conv2 = math.inf
        with torch.random.fork_rng(devices=[]):  # seeded init without touching the global RNG
            torch.manual_seed(seed)
            self.features = build_features(info, config).to(self.device)
            self.rows = AggregateRows(
                self.features.dim,
                self.num_classes,
                bool(config["class_aggregates"]),
                float(config["count_feature"]),
            )
            self.head = Head(self.rows.dim, int(config["fc_hidden"]), 1).to(self.device)
            self.net_g = build_generator(info, config).to(self.device)
            self.classifier = (
                Classifier(build_features(info, config), int(config["fc_hidden"])).to(self.device)
                if self.c_steps > 0
                else None
            )
            for module in (self.features, self.head, self.net_g, self.classifier):
                if module is not None:
                    module.apply(init_weights)
        for p in self.features.conv1_parameters():  # conv1 never trains inside D
            p.requires_grad_(False)
        self.conv2_params = dict(
            (n, p) for n, p in self.features.named_parameters() if p.requires_grad
        )
        lr = float(config["lr"])
        self.opt_head = torch.optim.Adam(self.head.parameters(), lr=lr, betas=_ADAM_BETAS)
        self.opt_conv2 = torch.optim.Adam(self.conv2_params.values(), lr=lr, betas=_ADAM_BETAS)
        self.opt_g = torch.optim.Adam(self.net_g.parameters(), lr=lr, betas=_ADAM_BETAS)
        # Every stream is asked for now, so that a resumed run restores the same set.
        randomness = randomness if randomness is not None else PrivateRandomness.fresh()
        self.rng_patterns = randomness.generator("dpaf/patterns", self.device)
        self.rng_agg = randomness.generator("dpaf/aggregate-noise", self.device)
        self.rng_conv2 = randomness.generator("dpaf/conv2-noise", self.device)
        self.rng_latents = randomness.generator("dpaf/latents", self.device)
        rng_c = randomness.generator("dpaf/classifier-noise", self.device)
        self.rng_c = rng_c
        self.clip_c = float(config["clip_c"]) if plan.private or paper_event else math.inf
        self.opt_c = None
        self.private_c = None
        if self.classifier is not None:
            self.opt_c = torch.optim.Adam(
                self.classifier.parameters(), lr=float(config["lr_c"]), betas=_ADAM_BETAS
            )
            self.private_c = PrivateGradient(
                self.classifier,
                self._classifier_loss,
                noise_multiplier=self.c_sigma,
                max_grad_norm=float(config["clip_c"]),
                expected_batch_size=float(plan.expected_batch_size),
                generator=rng_c,
                private=plan.private,
                batch_loss_fn=self._classifier_losses,  # ghost clipping where it applies
            )
        self.steps_done = 0
        self.d_steps = 0
        # The running (decayed) sum of the released real aggregates: public, the matching
        # loss's target (`g_loss=match`).
        self.released_sum = torch.zeros(self.rows.dim, device=self.device)

    # ----------------------------------------------------------------- phase 1

    def _classifier_loss(self, params, buffers, x, label_input, y) -> torch.Tensor:
        """One record's cross-entropy under C (per-sample targets: no aggregation)."""
        logits = functional_call(self.classifier, (params, buffers), (x[None], label_input[None]))
        return F.cross_entropy(logits, y[None])

    def _classifier_losses(self, x, label_input, y) -> torch.Tensor:
        """Each record's cross-entropy under C [b] (`_classifier_loss`, batched)."""
        return F.cross_entropy(self.classifier(x, label_input), y, reduction="none")

    def _phase1_step(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
        if self.paper:
            return self._paper_phase1_step(x, y)
        onehot = _onehot(y, self.num_classes)
        label_input = onehot if self.config["c_label_input"] else torch.zeros_like(onehot)
        self.opt_c.zero_grad(set_to_none=True)
        stats = self.private_c.compute(x, label_input, y)
        self.opt_c.step()
        return {"c_loss": stats["mean_loss"]}

    def _paper_phase1_step(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
        """The paper's C step (spec §2.4 lines 4-7): MSE between softmax(head(clean mean of
        the batch's SIN features)) and the batch's class proportions; plain Adam on C's conv2
        and head, DP-SGD (top-k, clip u₁, σ₁) on conv1 with each record's gradient taken
        through the clean aggregate. NOT DP: that gradient depends on the whole batch and the
        other layers trained non-privately on the same data (F2)."""
        # The paper's batch of B: a Poisson(q) subset of the loop's Poisson(q_w) lot.
        keep = window_patterns(x.shape[0], self.window, self.step_rate, self.rng_patterns)[:, 0]
        x, y = x[keep.to(x.device)], y[keep.to(y.device)]
        classifier = self.classifier
        onehot = _onehot(y, self.num_classes)
        label_input = onehot if self.config["c_label_input"] else torch.zeros_like(onehot)
        h = classifier.features(x, label_input)
        mean_h = h.sum(0) / self.agg_normalizer
        aggregate = mean_h.detach().requires_grad_(True)
        proportions = onehot.sum(0) / self.agg_normalizer
        predicted = torch.softmax(classifier.head(aggregate[None])[0], 0)
        loss = (predicted - proportions).pow(2).sum()
        named = dict(classifier.named_parameters())
        head_names = [n for n in named if n.startswith("head.")]
        conv2_names = [n for n in named if n.startswith("features.conv2.")]
        # ∂L/∂a at the clean aggregate, then the exact gradients of the non-private layers
        weight, *head_grads = torch.autograd.grad(
            loss, [aggregate, *(named[n] for n in head_names)]
        )
        exact = dict(zip(head_names, head_grads, strict=True))
        if conv2_names:
            conv2_grads = torch.autograd.grad(
                (mean_h * weight).sum(), [named[n] for n in conv2_names]
            )
            exact.update(zip(conv2_names, conv2_grads, strict=True))
        features = classifier.features

        def record_loss(params, buffers, image, label, w) -> torch.Tensor:
            out = functional_call(features, (params, buffers), (image[None], label[None]))
            return (out[0] * w).sum()

        weights = weight.detach()[None].expand(x.shape[0], -1)
        if x.shape[0]:
            per_record = per_sample_grads(features, record_loss, (x, label_input, weights))
        else:
            per_record = {n: p.new_zeros(0, *p.shape) for n, p in features.named_parameters()}
        conv1 = {n: g for n, g in per_record.items() if n.startswith(_CONV1_PREFIXES)}
        noisy = private_gradient_sum(
            conv1,
            keep_fraction=float(self.config["grad_keep"]),
            max_norm=self.clip_c,
            noise_multiplier=self.c_sigma,
            generator=self.rng_c,
        )
        self.opt_c.zero_grad(set_to_none=True)
        for name, grad in noisy.items():
            named["features." + name].grad = grad / self.batch_size
        for name, grad in exact.items():
            named[name].grad = grad
        self.opt_c.step()
        return {"c_loss": float(loss.detach())}

    def _transfer_conv1(self) -> None:
        """Copy C's (DP-trained) conv1 into the discriminator, where it stays frozen (and its
        conv2 into conv2* with `transfer_conv2`)."""
        with torch.no_grad():
            for target, source in zip(
                self.features.conv1_parameters(),
                self.classifier.features.conv1_parameters(),
                strict=True,
            ):
                target.copy_(source)
            if self.config["transfer_conv2"]:  # C's conv2 is DP-trained too: a free start
                for target, source in zip(
                    self.conv2_params.values(),
                    self.classifier.features.conv2.parameters(),
                    strict=True,
                ):
                    target.copy_(source)
        self.classifier = self.opt_c = self.private_c = None

    # ----------------------------------------------------------------- phase 2

    def _fakes(self, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """`count` generated images with uniform labels, and their one-hot labels (public)."""
        z = torch.randn(
            count, self.net_g.latent_dim, generator=self.rng_latents, device=self.device
        )
        labels = torch.randint(
            self.num_classes, (count,), generator=self.rng_latents, device=self.device
        )
        onehot = _onehot(labels, self.num_classes)
        return self.net_g(z, onehot), onehot

    def _release(self, features: torch.Tensor, *, across_ranks: bool = False) -> torch.Tensor:
        """DPAGG of a batch's features, divided by the public normaliser (`across_ranks`: the
        features are this rank's share of the real batch)."""
        noisy = noisy_feature_sum(
            features, self.rows.bound, self.agg_sigma, self.rng_agg, across_ranks=across_ranks
        )
        return noisy / self.agg_normalizer

    def _generator_step(self) -> float:
        """One G step on its loss (BCE through D, or matching); touches no data."""
        if self.match:
            return self._matching_step()
        images, onehot = self._fakes(self.batch_size)
        features = self.rows(self.features(images, onehot), onehot)
        if self.config["g_view"] == "aggregate":
            # the clean aggregate of the fake batch: the input D's head was trained on
            features = features.sum(0, keepdim=True) / self.agg_normalizer
        logits = self.head(features).squeeze(1)
        loss = F.softplus(-logits).mean()
        grads = torch.autograd.grad(loss, list(self.net_g.parameters()))
        self.opt_g.zero_grad(set_to_none=True)
        for p, g in zip(self.net_g.parameters(), grads, strict=True):
            p.grad = g
        self.opt_g.step()
        return float(loss.detach())

    def _matching_step(self) -> float:
        """G matches its per-class mean features to the released real aggregates' (public).

        The target of class c is block c of the running released sum divided by the block's
        noisy count coordinate; the generator's batch is balanced over the classes (labels
        public), so each class mean is over `g_batch / K` samples.
        """
        targets = self.rows.class_means(self.released_sum)
        if targets is None:
            return math.nan
        count = int(self.config["g_batch"])
        z = torch.randn(
            count, self.net_g.latent_dim, generator=self.rng_latents, device=self.device
        )
        labels = torch.arange(count, device=self.device) % self.num_classes
        onehot = _onehot(labels, self.num_classes)
        h = self.features(self.net_g(z, onehot), onehot)
        fake_means = (onehot.t() @ h) / onehot.sum(0).clamp_min(1.0)[:, None]
        loss = (fake_means - targets).pow(2).sum(1).mean()
        grads = torch.autograd.grad(loss, list(self.net_g.parameters()))
        self.opt_g.zero_grad(set_to_none=True)
        for p, g in zip(self.net_g.parameters(), grads, strict=True):
            p.grad = g
        self.opt_g.step()
        return float(loss.detach())

    def _window_step(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
        onehot = _onehot(y, self.num_classes)
        patterns = window_patterns(x.shape[0], self.window, self.step_rate, self.rng_patterns)
        patterns = patterns.to(self.device)
        # Data-parallel: every rank holds the whole union and its patterns (same streams) and
        # reads only its share of the records; the released sums are all-reduced.
        mine = shard_mask(x.shape[0], self.device)
        weights = torch.zeros(x.shape[0], self.rows.dim, device=self.device)
        fake_terms: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        d_losses, g_losses = [], []
        n_critic = int(self.config["n_critic"])
        decay = float(self.config["target_decay"])
        for s in range(self.window):
            members = patterns[:, s]
            read = members & mine
            with torch.no_grad():
                real = (
                    self.rows(self.features(x[read], onehot[read]), onehot[read])
                    if bool(read.any())
                    else x.new_zeros(0, self.rows.dim)  # an empty Poisson batch: noise only
                )
                released_real = self._release(real, across_ranks=True)
                self.released_sum.mul_(decay).add_(released_real * self.agg_normalizer)
            self.d_steps += 1
            if not self.use_head:
                for _ in range(int(self.config["g_steps"])):
                    g_losses.append(self._generator_step())
                continue
            with torch.no_grad():
                fake_images, fake_onehot = self._fakes(self.batch_size)
                fake_rows = self.rows(self.features(fake_images, fake_onehot), fake_onehot)
                released_fake = self._release(fake_rows)
            clean_v = self._clean_aggregate_v(real, fake_rows) if self.paper else None
            aggregates = torch.stack([released_real, released_fake]).requires_grad_(True)
            logits = self.head(aggregates).squeeze(1)
            loss_real, loss_fake = F.softplus(-logits[0]), F.softplus(logits[1])
            loss = loss_real + loss_fake
            self.opt_head.zero_grad(set_to_none=True)
            loss.backward()
            # ∂ℓ/∂ã at the released aggregates with the current (public) head.
            v_real, v_fake = aggregates.grad[0].detach(), aggregates.grad[1].detach()
            if clean_v is not None:  # the paper's D̃: at the clean aggregates (not DP, F2)
                v_real, v_fake = clean_v
            self.opt_head.step()
            weights += members[:, None].to(weights.dtype) * v_real[None]
            fake_terms.append((fake_images, fake_onehot, v_fake))
            d_losses.append(float(loss.detach()))
            if self.d_steps % n_critic == 0:
                for _ in range(int(self.config["g_steps"])):
                    g_losses.append(self._generator_step())
        if self.train_conv2:
            self._conv2_step(x, onehot, weights, fake_terms)
        return {
            "d_loss": sum(d_losses) / len(d_losses) if d_losses else math.nan,
            "g_loss": sum(g_losses) / len(g_losses) if g_losses else math.nan,
        }

    def _clean_aggregate_v(
        self, real: torch.Tensor, fake: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """∂L'/∂a at the clean (noise-free) real and fake aggregates with the current head:
        the paper's conv2* gradient (mode=paper only; it depends on every record of the batch)."""
        clean = torch.stack([real.sum(0), fake.sum(0)]) / self.agg_normalizer
        clean.requires_grad_(True)
        logits = self.head(clean).squeeze(1)
        (grad,) = torch.autograd.grad(F.softplus(-logits[0]) + F.softplus(logits[1]), clean)
        return grad[0].detach(), grad[1].detach()

    def _conv2_step(
        self,
        x: torch.Tensor,
        onehot: torch.Tensor,
        weights: torch.Tensor,
        fake_terms: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
    ) -> None:
        """One DP-SGD step of conv2* on the window's union, at the released aggregates.

        Record x's gradient is (∂h_x/∂θ₂)ᵀ Σ_{s ∋ x} v_s with v_s = ∂ℓ_s/∂ã_s taken at the
        released ã_s: a function of x and public values only, so clipping bounds its
        contribution. The fake side (public) is added without noise.
        """
        features = self.features

        rows = self.rows

        def record_loss(params, buffers, image, label, weight) -> torch.Tensor:
            h = functional_call(features, (params, buffers), (image[None], label[None]))
            return (rows(h, label[None])[0] * weight).sum()

        x, onehot, weights = shard(x, onehot, weights)  # this rank's share (all in one process)
        if x.shape[0]:
            grads = per_sample_grads(features, record_loss, (x, onehot, weights))
        else:
            grads = {n: p.new_zeros(0, *p.shape) for n, p in self.conv2_params.items()}
        noisy = private_gradient_sum(
            grads,
            keep_fraction=float(self.config["grad_keep"]),
            max_norm=self.clip_conv2,
            noise_multiplier=self.conv2_sigma,
            generator=self.rng_conv2,
            across_ranks=True,
        )
        fake_loss = sum(
            (rows(features(images, labels), labels) * v[None]).sum()
            for images, labels, v in fake_terms
        )
        fake_grads = torch.autograd.grad(fake_loss, list(self.conv2_params.values()))
        scale = 1.0 / (self.window * self.batch_size)
        self.opt_conv2.zero_grad(set_to_none=True)
        for (name, p), fake in zip(self.conv2_params.items(), fake_grads, strict=True):
            p.grad = (noisy[name] + fake) * scale
        self.opt_conv2.step()

    # ----------------------------------------------------------------- interface

    def step(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
        """A phase-1 step of C for the first `c_steps` loop steps, then one window each."""
        self.net_g.train()
        if self.steps_done < self.c_steps:
            stats = self._phase1_step(x, y)
            self.steps_done += 1
            if self.steps_done == self.c_steps:
                self._transfer_conv1()
            return stats
        if self.once:  # the release was made before this step; no data is read here
            g_losses = [self._generator_step() for _ in range(int(self.config["g_steps"]))]
            self.steps_done += 1
            return {"d_loss": math.nan, "g_loss": sum(g_losses) / len(g_losses)}
        stats = self._window_step(x, y)
        self.steps_done += 1
        return stats

    def reads_batch(self, step: int) -> bool:
        """Every step reads its Poisson batch, except phase 2 of `phase2_release=once`."""
        return not self.once or step < self.c_steps

    def release_whole_data(self, step: int, x: torch.Tensor, y: torch.Tensor) -> None:
        """`phase2_release=once`: before the first phase-2 step, release the per-class sums
        of every record's features and count coordinate (`noisy_group_sums`, one Gaussian draw
        at the plan's σ) as the running released sum; the generator matches it from then on.

        A run resumed at exactly that step releases again from the restored secret stream,
        which draws the same noise: the release the plan accounted for, made once.
        """
        if not self.once or step != self.c_steps:
            return
        pieces = []
        with torch.no_grad():
            for start in range(0, x.shape[0], _FEATURE_CHUNK):
                images = x[start : start + _FEATURE_CHUNK].to(self.device, torch.float32)
                labels = y[start : start + _FEATURE_CHUNK].to(self.device, torch.int64)
                h = self.features(images, _onehot(labels, self.num_classes))
                pieces.append(torch.cat([h, h.new_full((h.shape[0], 1), self.rows.count)], 1))
            rows = torch.cat(pieces) if pieces else x.new_zeros(0, self.rows.feature_dim + 1)
            sums = noisy_group_sums(
                rows,
                y.to(self.device),
                self.num_classes,
                self.rows.bound,
                self.once_sigma,
                self.rng_agg,
            )
            self.released_sum.copy_(sums.flatten())

    def _modules(self) -> dict[str, torch.nn.Module]:
        out = {"features": self.features, "head": self.head, "generator": self.net_g}
        if self.classifier is not None:
            out["classifier"] = self.classifier
        return out

    def _optimizers(self) -> dict[str, torch.optim.Optimizer]:
        out = {"opt_head": self.opt_head, "opt_conv2": self.opt_conv2, "opt_g": self.opt_g}
        if self.opt_c is not None:
            out["opt_c"] = self.opt_c
        return out

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """Weights, optimiser states and counters (public); never a secret stream's state."""
        out: dict[str, torch.Tensor] = {}
        for prefix, module in self._modules().items():
            for key, value in module.state_dict().items():
                out[f"{prefix}.{key}"] = value.detach().cpu().clone()
        for prefix, optimizer in self._optimizers().items():
            for index, state in optimizer.state_dict()["state"].items():
                for key, value in state.items():
                    tensor = value if torch.is_tensor(value) else torch.tensor(value)
                    out[f"{prefix}.{index}.{key}"] = tensor.detach().cpu().clone()
        out["trainer.steps_done"] = torch.tensor(self.steps_done, dtype=torch.int64)
        out["trainer.d_steps"] = torch.tensor(self.d_steps, dtype=torch.int64)
        out["trainer.released_sum"] = self.released_sum.detach().cpu().clone()
        return out

    def load_state_tensors(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Restore what `state_tensors` returned, so a resumed run continues exactly."""
        self.steps_done = int(tensors["trainer.steps_done"])
        self.d_steps = int(tensors["trainer.d_steps"])
        self.released_sum = tensors["trainer.released_sum"].to(self.device).clone()
        if self.steps_done >= self.c_steps and self.classifier is not None:
            self.classifier = self.opt_c = self.private_c = None  # phase 1 was over
        for prefix, module in self._modules().items():
            module.load_state_dict(_with_prefix(tensors, prefix + "."))
        for prefix, optimizer in self._optimizers().items():
            state: dict[int, dict[str, torch.Tensor]] = {}
            for name, value in _with_prefix(tensors, prefix + ".").items():
                index, key = name.split(".", 1)
                state.setdefault(int(index), {})[key] = value.to(
                    self.device if key != "step" else "cpu"
                )
            groups = optimizer.state_dict()["param_groups"]
            optimizer.load_state_dict({"state": state, "param_groups": groups})

    def generator(self) -> Generator:
        """A sampler over a copy of the current generator weights."""
        net = build_generator(self.info, self.config)
        net.load_state_dict(self.net_g.state_dict())
        return DPAFGenerator(net, self.info.classes, self.device, sample_truncation(self.config))


def _with_prefix(tensors: Mapping[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    return {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}


# --------------------------------------------------------------------------- method


class DPAFMethod(Method):
    """`--method dpaf`: DP aggregation in the forward phase, sound (`strict`) mode."""

    name = "dpaf"
    presets = PRESETS
    description = (
        "DPAF (noisy aggregation of SIN features in the discriminator's forward pass), strict "
        "mode: Poisson sampling, DP-SGD phase 1, conv2* at the released aggregates"
    )

    def recommended_preset(self, info: DataInfo, epsilon: float) -> str:
        """`mnist` for 28×28-sized images (≥ 400 values a record) above ε = 3, else `small`.

        Public facts only. At small ε the one release of `mnist` is too noisy for the half of
        ε it gets (mnist-5k at ε = 1: 0.36–0.61 over runs against 0.57 for `small`'s windows;
        on digits the windows were ahead at ε = 1 too; tuning-dpaf.md).
        """
        large = math.prod(info.shape) >= _LARGE_IMAGE_VALUES
        return "mnist" if large and epsilon > _SMALL_EPSILON else "small"

    def config(self, preset: str, overrides: Mapping[str, Any], info: DataInfo) -> dict[str, Any]:
        """Preset plus overrides, validated; `conv1_init=random` means no phase 1."""
        merged = super().config(preset, overrides, info)
        if merged["conv1_init"] == "random":
            merged["c_steps"] = 0
        self.validate_config(merged, info)
        return merged

    def validate_config(self, config: Mapping[str, Any], info: DataInfo) -> None:
        """Raise UsageError for a value the run could not use (before any budget is spent)."""
        if config.get("mode") == "paper" and (
            config["g_loss"] != "bce" or not config["train_conv2"] or config["class_aggregates"]
        ):
            raise UsageError(
                "--set mode=paper reproduces the paper's learning: it needs g_loss=bce, "
                "train_conv2=true and class_aggregates=false (e.g. --preset paper or tiny)"
            )
        for key, choices in CHOICES.items():
            if config[key] not in choices:
                raise UsageError(f"--set {key}: must be one of {', '.join(choices)}")
        if config["phase2_release"] == "once":
            if (
                config["mode"] != "strict"
                or config["g_loss"] != "match"
                or config["train_conv2"]
                or int(config["window"]) != 1
            ):
                raise UsageError(
                    "--set phase2_release=once needs mode=strict, g_loss=match, "
                    "class_aggregates=true, train_conv2=false and window=1 (e.g. --preset small)"
                )
            if not 0.0 < float(config["release_share"]) < 1.0:
                raise UsageError(
                    f"--set release_share: must be in (0, 1), got {config['release_share']}"
                )
        for key in (
            "batch_size",
            "window",
            "windows",
            "width",
            "conv1_layers",
            "conv2_layers",
            "fc_hidden",
            "latent_dim",
            "g_width",
            "n_critic",
            "g_steps",
            "g_batch",
        ):
            if int(config[key]) < 1:
                raise UsageError(f"--set {key}: must be at least 1, got {config[key]}")
        if int(config["width"]) < 2:
            raise UsageError("--set width: must be at least 2 (image and label branches)")
        if int(config["c_steps"]) < 0:
            raise UsageError(f"--set c_steps: must be ≥ 0, got {config['c_steps']}")
        if int(config["batch_size"]) > info.n:
            raise UsageError(
                f"--set batch_size: {config['batch_size']} exceeds the data set's {info.n} records"
            )
        for key in ("noise_ratio", "clip_c", "clip_conv2", "lr", "lr_c"):
            value = float(config[key])
            if not (math.isfinite(value) and value > 0):
                raise UsageError(f"--set {key}: must be a positive finite number, got {value}")
        if not 0.0 < float(config["target_decay"]) <= 1.0:
            raise UsageError(f"--set target_decay: must be in (0, 1], got {config['target_decay']}")
        count = float(config["count_feature"])
        if not (math.isfinite(count) and count > 0):
            raise UsageError(f"--set count_feature: must be a positive finite number, got {count}")
        if config["g_loss"] == "match" and not config["class_aggregates"]:
            raise UsageError("--set g_loss=match needs class_aggregates=true")
        if not 0.0 < float(config["grad_keep"]) <= 1.0:
            raise UsageError(f"--set grad_keep: must be in (0, 1], got {config['grad_keep']}")
        if min(info.shape[1], info.shape[2]) < 2:
            raise UsageError("dpaf needs images of at least 2×2 pixels")

    def plan(
        self,
        info: DataInfo,
        target: PrivacyTarget,
        config: Mapping[str, Any],
        prior_events: tuple[dict[str, Any], ...] = (),
    ) -> PrivacyPlan:
        """σ_w for c_steps + windows loop steps at q_w; two events (phase 1, phase 2)."""
        batch, window = int(config["batch_size"]), int(config["window"])
        c_steps, windows = int(config["c_steps"]), int(config["windows"])
        q = min(1.0, batch / info.n)
        q_w = window_sampling_rate(q, window)
        steps = c_steps + windows
        if not target.private:
            return PrivacyPlan(
                private=False,
                target_epsilon=math.inf,
                delta=target.delta,
                noise_multiplier=0.0,
                sampling_rate=q_w,
                steps=steps,
                max_grad_norm=math.inf,
                expected_batch_size=q_w * info.n,
                events=({"type": "non_private", "sampling_rate": q_w, "steps": steps},),
                epsilon_bound=math.inf,
                total_epsilon_bound=math.inf,
                accountant="none (not private)",
                notes=("NOT PRIVATE: trained without clipping or noise (--epsilon inf)",),
            )
        if config["mode"] == "paper":
            return self._paper_plan(info, target, config, q_w)
        if config["phase2_release"] == "once":
            return self._once_plan(info, target, config, prior_events)
        cal = calibrate_noise(target.epsilon, target.delta, q_w, steps, prior_events)
        sigma_w = cal.noise_multiplier
        agg_sigma, conv2_sigma = split_window_noise(sigma_w, window, _noise_ratio(config))
        trains_conv2 = bool(config["train_conv2"])
        events = []
        if c_steps:
            events.append(
                {
                    "type": "poisson_gaussian",
                    "noise_multiplier": sigma_w,
                    "sampling_rate": q_w,
                    "steps": c_steps,
                    "mechanism": "dpaf phase 1: DP-SGD on classifier C (all parameters)",
                    "max_grad_norm": float(config["clip_c"]),
                }
            )
        events.append(
            {
                "type": "poisson_gaussian",
                "noise_multiplier": sigma_w,
                "sampling_rate": q_w,
                "steps": windows,
                "mechanism": f"dpaf phase 2: windows of {window} DPAGG steps"
                + (" + 1 conv2* step" if trains_conv2 else " (conv2* frozen)"),
                "accounting": WINDOW_ACCOUNTING_NOTE,
                "window": window,
                "step_sampling_rate": q,
                "agg_noise_multiplier": agg_sigma,
                "conv2_noise_multiplier": conv2_sigma if trains_conv2 else None,
                "conv2_max_grad_norm": float(config["clip_conv2"]) if trains_conv2 else None,
            }
        )
        conv2_note = f"conv2* σ = {conv2_sigma:.4g}" if trains_conv2 else "conv2* frozen"
        notes = (
            f"σ_w = {sigma_w:.4g} per loop step (q_w = {q_w:.4g}); DPAGG σ = {agg_sigma:.4g}, "
            f"{conv2_note}, phase-1 σ = {sigma_w:.4g}",
            "phase 2 accounted with the " + WINDOW_ACCOUNTING_NOTE,
            *cal.notes,
        )
        return PrivacyPlan(
            private=True,
            target_epsilon=float(target.epsilon),
            delta=target.delta,
            noise_multiplier=sigma_w,
            sampling_rate=q_w,
            steps=steps,
            max_grad_norm=float(config["clip_conv2"]),
            expected_batch_size=q_w * info.n,
            events=tuple(events),
            epsilon_bound=cal.epsilon,
            total_epsilon_bound=cal.total_epsilon,
            accountant=cal.accountant,
            notes=notes,
        )

    def _once_plan(
        self,
        info: DataInfo,
        target: PrivacyTarget,
        config: Mapping[str, Any],
        prior_events: tuple[dict[str, Any], ...],
    ) -> PrivacyPlan:
        """`phase2_release=once`: phase 1 (c_steps DP-SGD steps at q = B/N) and ONE Gaussian
        release of the whole data set's per-class feature sums (`noisy_group_sums`).

        The release's σ is the Gaussian's at `release_share` of the ε left after the prior
        spends (all of it without phase 1); phase 1's σ is then calibrated so that prior +
        release + phase 1 compose (PRV) to at most ε. The windows that follow are generator
        steps on the release only: they read no data and cost nothing.
        """
        c_steps, windows = int(config["c_steps"]), int(config["windows"])
        q = min(1.0, int(config["batch_size"]) / info.n)
        delta = target.delta
        if c_steps:
            share = float(config["release_share"])
            sigma_once = gaussian_sigma_for_share(target.epsilon, delta, share, prior_events)
        else:
            sigma_once = calibrate_noise(target.epsilon, delta, 1.0, 1, prior_events)
            sigma_once = sigma_once.noise_multiplier
        release = {
            "type": "gaussian",
            "noise_multiplier": sigma_once,
            "count": 1,
            "mechanism": ONCE_MECHANISM,
            "phase": ONCE_PHASE,
            IDLE_STEPS_KEY: windows,
        }
        events: list[dict[str, Any]] = []
        sigma_c = sigma_once
        if c_steps:
            cal = calibrate_noise(target.epsilon, delta, q, c_steps, (*prior_events, release))
            sigma_c = cal.noise_multiplier
            events.append(
                {
                    "type": "poisson_gaussian",
                    "noise_multiplier": sigma_c,
                    "sampling_rate": q,
                    "steps": c_steps,
                    "mechanism": "dpaf phase 1: DP-SGD on classifier C (all parameters)",
                    "max_grad_norm": float(config["clip_c"]),
                }
            )
        events.append(release)
        alone = compose_epsilon(events, delta)
        total = compose_epsilon([*prior_events, *events], delta) if prior_events else alone
        return PrivacyPlan(
            private=True,
            target_epsilon=float(target.epsilon),
            delta=delta,
            noise_multiplier=sigma_c,
            sampling_rate=q,
            steps=c_steps + windows,
            max_grad_norm=float(config["clip_c"]),
            expected_batch_size=q * info.n,
            events=tuple(events),
            epsilon_bound=alone.epsilon,
            total_epsilon_bound=total.epsilon,
            accountant=alone.accountant,
            notes=(
                f"phase 2 released once: per-class feature sums, Gaussian σ = {sigma_once:.4g}"
                + (f"; phase-1 σ = {sigma_c:.4g} (q = {q:.4g}, {c_steps} steps)" if c_steps else "")
                + f"; then {windows} generator steps on the release (no data read)",
            ),
        )

    def _paper_plan(
        self, info: DataInfo, target: PrivacyTarget, config: Mapping[str, Any], q_w: float
    ) -> PrivacyPlan:
        """`mode=paper`: the paper's noise and its Theorem-5-style claim, recorded as NOT private.

        σ₁ (conv1, T₁ = c_steps at q = B/N), σ₃ (DPAGG, T₃ = μ·windows at q) and σ₂ (conv2*,
        T₂ = windows at q₂ = μB/N) are each calibrated alone to the canonical split (ε₁, ε₃) =
        (0.1, 0.1), ε₂ = ε − 0.2, and the claim composes the three as independent streams
        (PRV on Poisson sampling rather than the paper's WOR RDP bound). The mechanism does not
        satisfy that claim (spec §10.1 F2-F4), so the plan is not private: the ledger's total
        for the data set becomes inf and the claim is kept only as an annotation.
        """
        batch, window = int(config["batch_size"]), int(config["window"])
        c_steps, windows = int(config["c_steps"]), int(config["windows"])
        q, q2 = min(1.0, batch / info.n), min(1.0, window * batch / info.n)
        eps_c, eps_agg = _PAPER_SPLIT
        if target.epsilon <= eps_c + eps_agg:
            raise UsageError(
                f"--set mode=paper needs ε > {eps_c + eps_agg:g} (the paper gives {eps_c:g} to "
                f"conv1 and {eps_agg:g} to DPAGG), got {target.epsilon:g}"
            )
        delta = target.delta
        sigma_c = calibrate_noise(eps_c, delta, q, c_steps).noise_multiplier if c_steps else 0.0
        sigma_agg = calibrate_noise(eps_agg, delta, q, window * windows).noise_multiplier
        eps_conv2 = target.epsilon - eps_c - eps_agg
        sigma_conv2 = calibrate_noise(eps_conv2, delta, q2, windows).noise_multiplier
        streams = [
            {"type": "poisson_gaussian", "noise_multiplier": s_, "sampling_rate": r, "steps": t}
            for s_, r, t in (
                (sigma_c, q, c_steps),
                (sigma_agg, q, window * windows),
                (sigma_conv2, q2, windows),
            )
            if t
        ]
        claimed = compose_epsilon(streams, delta).epsilon
        steps = c_steps + windows
        label = {
            "type": "non_private",
            "label": NOT_DP_LABEL,
            "mechanism": PAPER_MECHANISM,
            "claimed_epsilon": claimed,
            "claimed_accounting": (
                "the paper's decomposition (Theorem 5): three independent Poisson-subsampled "
                "Gaussian streams composed with PRV; ignores F2-F4 and the factor 2 of "
                "replace-one neighbours"
            ),
            "streams": streams,
            "c_noise_multiplier": sigma_c,
            "agg_noise_multiplier": sigma_agg,
            "conv2_noise_multiplier": sigma_conv2,
        }
        loop = {"type": "non_private", "sampling_rate": q_w, "steps": steps}
        return PrivacyPlan(
            private=False,
            target_epsilon=math.inf,
            delta=delta,
            noise_multiplier=0.0,
            sampling_rate=q_w,
            steps=steps,
            max_grad_norm=float(config["clip_conv2"]),
            expected_batch_size=q_w * info.n,
            events=(loop, label),
            epsilon_bound=math.inf,
            total_epsilon_bound=math.inf,
            accountant=f"none ({NOT_DP_LABEL})",
            notes=(
                f"WARNING: mode=paper is {NOT_DP_LABEL}: the paper's claim ε = {claimed:.4g} "
                "(independent streams) is not a proven bound; recorded as NOT PRIVATE",
                f"σ₁ = {sigma_c:.4g}, DPAGG σ₃ = {sigma_agg:.4g}, conv2* σ₂ = {sigma_conv2:.4g}",
            ),
        )

    def trainer(
        self,
        info: DataInfo,
        config: Mapping[str, Any],
        plan: PrivacyPlan,
        device: torch.device,
        seed: int,
        randomness: PrivateRandomness | None = None,
    ) -> DPAFTrainer:
        """A fresh trainer; weights from `seed`, never from the data; draws from `randomness`."""
        return DPAFTrainer(info, config, plan, device, seed, randomness)

    def generator_from_state(
        self,
        info: DataInfo,
        config: Mapping[str, Any],
        tensors: Mapping[str, torch.Tensor],
        device: torch.device,
    ) -> DPAFGenerator:
        """Rebuild the sampler from saved `generator.*` tensors."""
        net = build_generator(info, config)
        net.load_state_dict(_with_prefix(tensors, "generator."))
        return DPAFGenerator(net, info.classes, torch.device(device), sample_truncation(config))
