"""DPAF's trainer: its networks, optimisers and secret streams, the loop's interface (a
phase-1 step or a window per loop step, the once-release), and its state in checkpoints."""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from dpsynth.errors import UsageError
from dpsynth.methods.blocks import FitPenalty, dcgan_init, fit_generator_to_model, one_hot_labels
from dpsynth.methods.dpaf.generator import DPAFGenerator, build_features, build_generator
from dpsynth.methods.dpaf.model import AggregateRows, Classifier, Head
from dpsynth.methods.dpaf.phase1 import Phase1Steps
from dpsynth.methods.dpaf.phase2 import WindowSteps
from dpsynth.methods.dpaf.plan import ONCE_PHASE, noise_ratio
from dpsynth.methods.template import (
    StagedTrainer,
    load_module_tensors,
    module_tensors,
    seeded,
)
from dpsynth.privacy.accounting.plan_check import NOT_DP_LABEL
from dpsynth.privacy.mechanisms.aggregation import noisy_group_sums, split_window_noise
from dpsynth.privacy.mechanisms.distributed import is_data_parallel
from dpsynth.privacy.mechanisms.dpsgd import PrivateGradient
from dpsynth.privacy.mechanisms.randomness import PrivateRandomness
from dpsynth.privacy.releases.central import CentralImages

_ADAM_BETAS = (0.5, 0.999)
# Records per forward pass when the whole data set's features are summed.
_FEATURE_CHUNK = 512


class DPAFTrainer(Phase1Steps, WindowSteps, StagedTrainer):
    """One run: C (phase 1), the split discriminator, the generator and their optimisers."""

    # Functions of the released noisy aggregates, of public weights and of generated samples.
    released_stats = ("d_loss", "g_loss")

    def setup(self, randomness: PrivateRandomness) -> None:
        """C, the split discriminator, the generator, their optimisers and secret streams."""
        info, config, plan, seed = self.info, self.config, self.plan, self.seed
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
        paper_event = next((e for e in plan.events if e.annotation("label") == NOT_DP_LABEL), None)
        once_event = next((e for e in plan.events if e.annotation("phase") == ONCE_PHASE), None)
        if (self.paper or self.once) and is_data_parallel():
            raise UsageError("--set mode=paper and phase2_release=once run in one process only")
        # The noise multiplier of the one release of phase2_release=once (0: not private).
        self.once_sigma = float(once_event.to_json()["noise_multiplier"]) if once_event else 0.0
        if paper_event is not None:
            # The paper's own noise (not a DP guarantee; the plan is labelled so).
            self.c_sigma = float(paper_event.annotation("c_noise_multiplier"))
            self.agg_sigma = float(paper_event.annotation("agg_noise_multiplier"))
            self.conv2_sigma = float(paper_event.annotation("conv2_noise_multiplier"))
            self.clip_conv2 = float(config["clip_conv2"])
        elif plan.private:
            window_sigma = float(plan.noise_multiplier)
            self.c_sigma = window_sigma
            self.agg_sigma, self.conv2_sigma = split_window_noise(
                window_sigma, self.window, noise_ratio(config)
            )
            self.clip_conv2 = float(config["clip_conv2"])
        else:
            self.c_sigma = self.agg_sigma = self.conv2_sigma = 0.0
            self.clip_conv2 = math.inf
        with seeded(seed):
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
                    module.apply(dcgan_init)
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
        # `frequency_anchor` > 0: G as fitted to the DP frequency model, frozen (`warm_start`),
        # which every generator step is pulled towards at the same latents.
        self.fit_penalty = FitPenalty(config)
        self.start_stages(randomness)

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
        which draws the same noise: the release the plan accounted for, made once. The DP
        teacher, if the plan has one, is trained at the step its plan says.
        """
        super().release_whole_data(step, x, y)  # the frequency model (`warm_start`), the teacher
        if not self.once or step != self.c_steps:
            return
        pieces = []
        with torch.no_grad():
            for start in range(0, x.shape[0], _FEATURE_CHUNK):
                images = x[start : start + _FEATURE_CHUNK].to(self.device, torch.float32)
                labels = y[start : start + _FEATURE_CHUNK].to(self.device, torch.int64)
                h = self.features(images, one_hot_labels(labels, self.num_classes))
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

    def warm_start(self, release: CentralImages) -> None:
        """Before the first DP step: fit G to a DP release, the frequency model's samples
        (`frequency_fit_steps`; post-processing of the release, public latents), and with
        `frequency_anchor` > 0 keep a frozen copy of the fit for the fit penalty."""
        steps = int(self.config["frequency_fit_steps"])
        fit_generator_to_model(self.net_g, self.num_classes, release, steps, self.seed, self.device)
        self.fit_penalty.take(self.net_g)

    def public_uses(self, labelled: bool) -> tuple[str, ...]:
        """The phase-1 classifier C (labelled images, `c_steps` > 0, `mode=strict`,
        `public_pretrain_steps` > 0), and the DP teacher when it can use the labels."""
        steps = int(self.config.get("public_pretrain_steps", 0))
        classifier = labelled and steps > 0 and self.classifier is not None and not self.paper
        uses = ("phase-1 classifier",) if classifier else ()
        return uses + (("DP teacher",) if self.teacher.uses_public(labelled) else ())

    def pretrain_public(self, x: torch.Tensor, y: torch.Tensor | None) -> None:
        """`public_pretrain_steps` plain Adam steps (lr `lr_c`, batch `batch_size`) of C's
        cross-entropy on declared-public labelled images before its DP phase 1, with their
        own optimiser (phase 1's starts fresh); batches from the public seed. C's conv1 then
        reaches the discriminator through phase 1 as before. G and D are not pretrained
        (D's features are trained only through DP aggregates). The DP teacher, if any,
        pretrains on the labelled images."""
        if y is not None and "phase-1 classifier" in self.public_uses(True):
            assert self.classifier is not None
            rng = torch.Generator(device=self.device).manual_seed(self.seed + 1_000_003)
            x, y = x.to(self.device, torch.float32), y.to(self.device)
            lr = float(self.config["lr_c"])
            optimizer = torch.optim.Adam(self.classifier.parameters(), lr=lr, betas=_ADAM_BETAS)
            self.classifier.train()
            for _ in range(int(self.config["public_pretrain_steps"])):
                index = torch.randint(len(x), (self.batch_size,), generator=rng, device=self.device)
                onehot = one_hot_labels(y[index], self.num_classes)
                label_input = onehot if self.config["c_label_input"] else torch.zeros_like(onehot)
                loss = self._classifier_losses(x[index], label_input, y[index]).mean()
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
            self.classifier.zero_grad(set_to_none=True)
        self.teacher.pretrain_public(x, y)

    def _modules(self) -> dict[str, torch.nn.Module]:
        out = {"features": self.features, "head": self.head, "generator": self.net_g}
        out |= self.fit_penalty.modules()
        if self.classifier is not None:
            out["classifier"] = self.classifier
        return out

    def _optimizers(self) -> dict[str, torch.optim.Optimizer]:
        out = {"opt_head": self.opt_head, "opt_conv2": self.opt_conv2, "opt_g": self.opt_g}
        if self.opt_c is not None:
            out["opt_c"] = self.opt_c
        return out

    def own_state_tensors(self) -> dict[str, torch.Tensor]:
        """Weights, optimiser states and counters (public); never a secret stream's state."""
        out = module_tensors(self._modules(), self._optimizers())
        out["trainer.steps_done"] = torch.tensor(self.steps_done, dtype=torch.int64)
        out["trainer.d_steps"] = torch.tensor(self.d_steps, dtype=torch.int64)
        out["trainer.released_sum"] = self.released_sum.detach().cpu().clone()
        return out

    def load_own_state(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Restore what `own_state_tensors` returned, so a resumed run continues exactly."""
        self.steps_done = int(tensors["trainer.steps_done"])
        self.d_steps = int(tensors["trainer.d_steps"])
        self.released_sum = tensors["trainer.released_sum"].to(self.device).clone()
        if self.steps_done >= self.c_steps and self.classifier is not None:
            self.classifier = self.opt_c = self.private_c = None  # phase 1 was over
        if FitPenalty.in_checkpoint(tensors):
            self.fit_penalty.restore(self.net_g)
        load_module_tensors(tensors, self._modules(), self._optimizers(), self.device)

    def own_generator(self) -> DPAFGenerator:
        """A sampler over a copy of the current generator weights."""
        return DPAFGenerator.loaded(self.net_g.state_dict(), self.info, self.config, self.device)
