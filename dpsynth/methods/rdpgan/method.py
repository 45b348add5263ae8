"""RDP-GAN (Ma et al., arXiv 2007.02056) in the sound mode of spec `rdpgan.md` §4.3.1.

Learning idea (kept from the paper): a conditional GAN whose discriminator D has a sigmoid
output trained with binary cross-entropy, n_d discriminator steps per generator step, a
privatised discriminator with the generator as post-processing, and noise-scale schedules.

What differs from the paper, whose guarantee does not hold (spec §4.2): the paper adds one
Gaussian scalar to the VALUE of D's real-data loss. A constant added to a loss leaves its
gradient unchanged, so that noise never reaches the parameters and every update is the
non-private one. Here the quantity that drives D's update is privatised instead: each real
record's gradient of its loss term softplus(−logit) is clipped to norm C, the clipped sum
gets Gaussian noise of std σ_t·C and is divided by the public m = qN (DP-SGD through
`PrivateGradient`); the fake term's gradient involves no private data and is exact. Batches
are Poisson samples (add/remove adjacency), and every D step is one Poisson-subsampled
Gaussian event of the PRV accountant. The generator's update reads D only (post-processing).

How the shared loop maps onto RDP-GAN: one loop step = one D step on the loop's Poisson
batch; after every n_d-th D step one G step follows (no private data). The schedule of σ over
generator iterations is data-independent and computed before training (`schedule.py`); each
distinct σ is its own ledger event, and the trainer reads each step's σ from those events.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dpsynth.data.images import DataInfo
from dpsynth.errors import UsageError
from dpsynth.methods.base import (
    MAX_STEPS,
    SMALL_EPSILON,
    PlanFacts,
    PrivacyPlan,
    is_large_image,
)
from dpsynth.methods.blocks import check_fit_penalty_config
from dpsynth.methods.rdpgan.generator import RDPGANGenerator
from dpsynth.methods.rdpgan.plan import plan_rdpgan
from dpsynth.methods.rdpgan.presets import CHOICES, PRESETS, TABLE_PRESETS
from dpsynth.methods.rdpgan.trainer import RDPGANTrainer
from dpsynth.methods.template import StagedMethod

_REFUSED_MODES = {
    "paper-additive": (
        "the paper's noise on the loss value never reaches the gradient (spec rdpgan §4.2), so "
        "it trains exactly the non-private model; use --epsilon inf for that baseline, which "
        "is labelled NOT PRIVATE"
    ),
    "paper-multiplicative": (
        "a random rescaling of the exact gradient is not differentially private (spec rdpgan "
        "§4.2 G1b)"
    ),
    "zo": "the zeroth-order variant (spec rdpgan §4.3.2) is not implemented",
}


class RDPGANMethod(StagedMethod):
    """`--method rdpgan`: conditional GAN, DP-SGD on D's real-loss term, σ schedules."""

    name = "rdpgan"
    presets = PRESETS
    trainer_class = RDPGANTrainer
    generator_class = RDPGANGenerator
    table_presets = TABLE_PRESETS
    modalities = ("image", "table")
    # tables with a privacy unit of K rows: the loop samples units, and the read is scaled for
    # K rows (images take K = 1 only: their stages are not scaled)
    supports_privacy_unit = True
    table_advice = (
        "rdpgan is kept on tables for comparison only: its 2-way marginals are 0.47–0.82 from "
        "the real ones on german-credit and census, against 0.04–0.16 for mst and aim, and its "
        "ROC-AUC is near chance; prefer --method mst or aim, or auto (docs/tables.md)"
    )
    description = (
        "RDP-GAN, sound mode: DP-SGD on the discriminator's real-loss term (the paper's "
        "loss-value noise never reaches the gradient), Poisson sampling, PRV accounting, "
        "data-independent σ schedules"
    )

    def validate_config(self, config: Mapping[str, Any], info: DataInfo) -> None:
        """Raise UsageError for a value the run could not use (before any budget is spent)."""
        super().validate_config(config, info)
        mode = config.get("mode")
        if mode in _REFUSED_MODES:
            raise UsageError(f"--set mode={mode} is not available: {_REFUSED_MODES[mode]}")
        if config.get("schedule") == "ant":
            raise UsageError(
                "--set schedule=ant is not available: adaptive noise tuning needs a Rényi "
                "filter and a public or paid accuracy signal (spec rdpgan §4.3.4), which are "
                "not implemented; use constant, time, exp or step"
            )
        for key, choices in CHOICES.items():
            if key in config and config[key] not in choices:
                raise UsageError(f"--set {key}: must be one of {', '.join(choices)}")
        for key in ("n_d", "n_g", "hidden", "width", "latent_dim", "step_every"):
            if int(config[key]) < 1:
                raise UsageError(f"--set {key}: must be at least 1, got {config[key]}")
        steps = int(config["n_d"]) * int(config["n_g"])
        if steps > MAX_STEPS:
            raise UsageError(f"--set n_g, n_d: n_g·n_d = {steps} exceeds {MAX_STEPS:.0e}")
        for key in ("lr_d", "lr_g"):
            if not float(config[key]) > 0:
                raise UsageError(f"--set {key}: must be positive, got {config[key]}")
        check_fit_penalty_config(config)
        if not 0.0 <= float(config["beta1"]) < 1.0:
            raise UsageError(f"--set beta1: must be in [0, 1), got {config['beta1']}")
        decay = float(config["decay"])
        if config["schedule"] == "step" and not 0.0 < decay <= 1.0:
            raise UsageError(f"--set decay: the step schedule needs k in (0, 1], got {decay}")
        if config["schedule"] in ("time", "exp") and decay < 0:
            raise UsageError(f"--set decay: must be ≥ 0, got {decay}")
        if config["schedule"] == "exp" and decay * int(config["n_g"]) > 20:
            raise UsageError("--set decay: e^(−k·n_g) below e^−20 leaves no noise to speak of")
        if info.modality == "table" and config["arch"] != "mlp":
            raise UsageError("--set arch: tables need arch=mlp (a row is a flat vector)")
        if config["arch"] == "conv":
            shape = tuple(info.shape)
            if len(shape) != 3 or shape[1] % 4 or shape[2] % 4:
                raise UsageError(
                    f"--set arch=conv needs images with sides divisible by 4, got {shape}; "
                    "use arch=mlp"
                )

    def recommended_preset(self, info: DataInfo, epsilon: float) -> str:
        """`mnist` for 28×28-sized images (≥ 400 values a record), `mnist-eps1` at ε ≤ 3;
        `small-freq` for smaller images, `small-eps1` at ε ≤ 3; `small` for tables. Public
        facts only (the modality, the shape, ε)."""
        if info.modality != "image":
            return "small"
        if is_large_image(info):
            return "mnist-eps1" if epsilon <= SMALL_EPSILON else "mnist"
        return "small-eps1" if epsilon <= SMALL_EPSILON else "small-freq"

    def plan_own(self, facts: PlanFacts) -> PrivacyPlan:
        """The whole σ schedule, one event per distinct σ (`plan.plan_rdpgan`)."""
        return plan_rdpgan(facts)
