"""Phase 1 of DPAF's trainer: DP-SGD of the classifier C (or the paper's C step), then the
transfer of its conv1 into the discriminator."""

from __future__ import annotations

import torch
from torch.func import functional_call
from torch.nn import functional as F

from dpsynth.methods.blocks import one_hot_labels
from dpsynth.privacy.mechanisms.aggregation import private_gradient_sum, window_patterns
from dpsynth.privacy.mechanisms.dpsgd import per_sample_grads

_CONV1_PREFIXES = ("image_in.", "label_in.", "conv1_rest.")


class Phase1Steps:
    """`DPAFTrainer`'s phase-1 steps (mixed into it; they use its networks and streams)."""

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
        onehot = one_hot_labels(y, self.num_classes)
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
        onehot = one_hot_labels(y, self.num_classes)
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
