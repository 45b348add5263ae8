"""PSG (Chen, Kerkouche & Fritz, NeurIPS 2022): private set generation by gradient matching.

The released artefact is a small labelled synthetic set S (spc images per class, labels fixed
and balanced), optimised so that a classifier's gradient on S matches its gradient on the
private data along many training trajectories (spec psg §1–§2.3, Algorithm 1):

    for r in 1..R:   θ ← fresh random ConvNet (public randomness)
      for t in 1..T:
        for k in 1..K:   g̃ ← DP-SGD gradient of a Poisson batch at θ       (the only read)
                         S ← S − τ_S ∇_S L_dis(∇_θ CE(S; θ), g̃)            (SGD, momentum)
        if t < T:   J epochs of SGD on θ with S as the training set

With the generator prior (`prior=dcgan`, spec §2.4, `prior.py`) S is G(z_j, y_j; φ) at fixed
public codes, and "S ← …" becomes an Adam step on φ through S; nothing else changes.

Mechanism (spec §3.2, §3.5): each of the R·T·K releases is one DP-SGD step from
`dpsynth.privacy.mechanisms.dpsgd.PrivateGradient`: the training loop's Poisson batch at rate q =
B/N, each record's gradient over ALL parameters clipped to C, ONE Gaussian draw of std σC on the
sum (from the run's secret randomness), divided by the public B. Everything after it (S, its
momentum, θ's updates) is post-processing of the released gradients. One class-mixed batch is
matched against the gradient of the whole of S, as the paper does (spec §3.6): per-class
Poisson batches would need the class sizes and a rate q_c ≈ L·q. So a run is exactly one
`poisson_gaussian` event of R·T·K steps at (σ, q), planned before the data is read; with a
warm start (`warm_start_share` > 0) the plan adds one `gaussian` event before it, the DP class
means (`dpsynth.privacy.releases.central`) that S starts from, and the PRV accountant composes both.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dpsynth.data.images import DataInfo
from dpsynth.errors import UsageError
from dpsynth.methods.base import (
    SMALL_EPSILON,
    PlanFacts,
    PrivacyPlan,
    is_large_image,
)
from dpsynth.methods.psg.generator import PSGGenerator
from dpsynth.methods.psg.model import NORMS
from dpsynth.methods.psg.presets import PRESETS
from dpsynth.methods.psg.prior import PRIORS
from dpsynth.methods.psg.trainer import PSGTrainer
from dpsynth.methods.template import StagedMethod

_POSITIVE_INTS = (
    "spc",
    "runs",
    "outer_loop",
    "batches",
    "width",
    "depth",
    "batch_train",
    "micro_batch_size",
    "prior_latent_dim",
    "prior_width",
)


class PSGMethod(StagedMethod):
    """`--method psg`: a synthetic set matched to DP-SGD gradients of random ConvNets."""

    name = "psg"
    presets = PRESETS
    trainer_class = PSGTrainer
    generator_class = PSGGenerator
    description = (
        "PSG (private set generation): a small synthetic set S matched to DP-SGD gradients "
        "(Poisson, per-record clipping, Gaussian noise) of fresh random ConvNets"
    )

    def recommended_preset(self, info: DataInfo, epsilon: float) -> str:
        """`small` for small images (8×8 digits), `mnist` for 28×28-sized ones (≥ 400 values a
        record); the `-eps1` variant at ε ≤ 3. Public facts only (shape, ε; tuning-psg.md)."""
        base = "mnist" if is_large_image(info) else "small"
        return f"{base}-eps1" if epsilon <= SMALL_EPSILON else base

    def config(self, preset: str, overrides: Mapping[str, Any], info: DataInfo) -> dict[str, Any]:
        """Preset plus overrides, validated; `steps` = runs · outer_loop · batches (derived)."""
        if "steps" in overrides:
            raise UsageError(
                "steps is derived for --method psg (runs · outer_loop · batches); "
                "set runs, outer_loop or batches instead"
            )
        merged = super().config(preset, overrides, info)
        for key in _POSITIVE_INTS:
            if int(merged[key]) < 1:
                raise UsageError(f"{key} must be at least 1")
        if merged["inner_loop"] < 0:
            raise UsageError("inner_loop must be ≥ 0")
        if not merged["batch_size"] > 0 or not merged["max_grad_norm"] > 0:
            raise UsageError("batch_size and max_grad_norm must be positive")
        if merged["lr_syn"] <= 0 or merged["lr_net"] <= 0 or merged["momentum_syn"] < 0:
            raise UsageError("lr_syn and lr_net must be positive, momentum_syn ≥ 0")
        if float(merged["warm_start_jitter"]) < 0:
            raise UsageError("--set warm_start_jitter: must be at least 0")
        if merged["prior"] not in PRIORS:
            raise UsageError(f"--set prior: one of {', '.join(PRIORS)}")
        if float(merged["lr_prior"]) <= 0 or int(merged["warm_start_steps"]) < 0:
            raise UsageError("lr_prior must be positive and warm_start_steps at least 0")
        if merged["norm"] not in NORMS:
            raise UsageError(f"norm must be one of {', '.join(NORMS)} (no BatchNorm under DP)")
        merged["steps"] = int(merged["runs"]) * int(merged["outer_loop"]) * int(merged["batches"])
        return merged

    def plan_own(self, facts: PlanFacts) -> PrivacyPlan:
        """One `poisson_gaussian` event: R·T·K releases at q = B/N (checked against config)."""
        config = facts.config
        releases = int(config["runs"]) * int(config["outer_loop"]) * int(config["batches"])
        if int(config["steps"]) != releases:
            raise UsageError("steps must equal runs · outer_loop · batches for --method psg")
        return super().plan_own(facts)
