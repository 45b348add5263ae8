"""DPAF's privacy plans, from public facts only: strict (phase 1 and the windows at one σ_w),
`phase2_release=once` (phase 1 and one Gaussian release) and `mode=paper` (not private)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from dpsynth.data.images import DataInfo
from dpsynth.errors import UsageError
from dpsynth.methods.base import ClippedGaussianSum, PlanFacts, PrivacyPlan, PrivacyTarget
from dpsynth.methods.blocks import loop_plan
from dpsynth.privacy.accounting.calibration import calibrate_noise, gaussian_sigma_for_share
from dpsynth.privacy.accounting.compose import compose_epsilon
from dpsynth.privacy.accounting.events import DpEvent, Gaussian, NonPrivate, PoissonGaussian
from dpsynth.privacy.accounting.plan_check import IDLE_STEPS_KEY, NOT_DP_LABEL
from dpsynth.privacy.mechanisms.aggregation import (
    WINDOW_ACCOUNTING_NOTE,
    split_window_noise,
    window_sampling_rate,
)

# Tags the ledger event of `phase2_release=once` (the trainer reads its σ from the plan).
ONCE_PHASE = "dpaf-phase2-once"
ONCE_MECHANISM = (
    "dpaf phase 2, released once: the per-class sums of every record's SIN features and count "
    "coordinate (each record's row renormed to the bound), one Gaussian release"
)
# The paper's canonical budget split (spec §2.9): ε₁ = 0.1 (conv1), ε₃ = 0.1 (DPAGG), the rest
# to conv2*; used only by `mode=paper`, whose accounting is not a DP guarantee.
_PAPER_SPLIT = (0.1, 0.1)
PAPER_MECHANISM = (
    "dpaf paper mode (spec §10.2): conv1 by DP-SGD through C's clean aggregate and non-private "
    "layers, conv2* gradients at the clean aggregate, the paper's three independent streams; "
    "the claimed epsilon is not a proven bound (spec §10.1 F2-F4)"
)


def noise_ratio(config: Mapping[str, Any]) -> float:
    """σ_agg/σ_conv2 for the window split; 0 (no conv2* step) with `train_conv2=false`."""
    return float(config["noise_ratio"]) if config["train_conv2"] else 0.0


def plan_dpaf(facts: PlanFacts) -> PrivacyPlan:
    """σ_w for c_steps + windows loop steps at q_w; two events (phase 1, phase 2)."""
    info, target, config, prior_events = facts.unpacked()
    batch, window = int(config["batch_size"]), int(config["window"])
    c_steps, windows = int(config["c_steps"]), int(config["windows"])
    q = min(1.0, batch / info.n)
    q_w = window_sampling_rate(q, window)
    steps = c_steps + windows
    if not target.private:
        return PrivacyPlan.non_private_loop(target.delta, q_w, steps, info.n)
    if config["mode"] == "paper":
        return _paper_plan(info, target, config, q_w)
    if config["phase2_release"] == "once":
        return _once_plan(facts)
    cal = calibrate_noise(target.epsilon, target.delta, q_w, steps, prior_events)
    sigma_w = cal.noise_multiplier
    agg_sigma, conv2_sigma = split_window_noise(sigma_w, window, noise_ratio(config))
    trains_conv2 = bool(config["train_conv2"])
    events: list[DpEvent] = []
    if c_steps:
        events.append(_phase1_event(sigma_w, q_w, c_steps, config))
    events.append(
        PoissonGaussian(
            sigma_w,
            q_w,
            windows,
            annotations={
                "mechanism": f"dpaf phase 2: windows of {window} DPAGG steps"
                + (" + 1 conv2* step" if trains_conv2 else " (conv2* frozen)"),
                "accounting": WINDOW_ACCOUNTING_NOTE,
                "window": window,
                "step_sampling_rate": q,
                "agg_noise_multiplier": agg_sigma,
                "conv2_noise_multiplier": conv2_sigma if trains_conv2 else None,
                "conv2_max_grad_norm": float(config["clip_conv2"]) if trains_conv2 else None,
            },
        )
    )
    conv2_note = f"conv2* σ = {conv2_sigma:.4g}" if trains_conv2 else "conv2* frozen"
    notes = (
        f"σ_w = {sigma_w:.4g} per loop step (q_w = {q_w:.4g}); DPAGG σ = {agg_sigma:.4g}, "
        f"{conv2_note}, phase-1 σ = {sigma_w:.4g}",
        "phase 2 accounted with the " + WINDOW_ACCOUNTING_NOTE,
        *cal.notes,
    )
    bounds = (cal.epsilon, cal.total_epsilon, cal.accountant)
    clipped = ClippedGaussianSum(sigma_w, float(config["clip_conv2"]))
    return loop_plan(target, (q_w, steps, info.n), events, bounds, clipped, notes)


def _once_plan(facts: PlanFacts) -> PrivacyPlan:
    """`phase2_release=once`: phase 1 (c_steps DP-SGD steps at q = B/N) and ONE Gaussian
    release of the whole data set's per-class feature sums (`noisy_group_sums`).

    The release's σ is the Gaussian's at `release_share` of the ε left after the prior
    spends (all of it without phase 1); phase 1's σ is then calibrated so that prior +
    release + phase 1 compose (PRV) to at most ε. The windows that follow are generator
    steps on the release only: they read no data and cost nothing.
    """
    info, target, config, prior_events = facts.unpacked()
    c_steps, windows = int(config["c_steps"]), int(config["windows"])
    q = min(1.0, int(config["batch_size"]) / info.n)
    delta = target.delta
    if c_steps:
        share = float(config["release_share"])
        sigma_once = gaussian_sigma_for_share(target.epsilon, delta, share, prior_events)
    else:
        sigma_once = calibrate_noise(target.epsilon, delta, 1.0, 1, prior_events)
        sigma_once = sigma_once.noise_multiplier
    release = Gaussian(sigma_once, 1, annotations={
        "mechanism": ONCE_MECHANISM, "phase": ONCE_PHASE, IDLE_STEPS_KEY: windows,
    })  # fmt: skip
    events: list[DpEvent] = []
    sigma_c = sigma_once
    if c_steps:
        cal = calibrate_noise(target.epsilon, delta, q, c_steps, (*prior_events, release))
        sigma_c = cal.noise_multiplier
        events.append(_phase1_event(sigma_c, q, c_steps, config))
    events.append(release)
    alone = compose_epsilon(events, delta)
    total = compose_epsilon([*prior_events, *events], delta) if prior_events else alone
    note = (
        f"phase 2 released once: per-class feature sums, Gaussian σ = {sigma_once:.4g}"
        + (f"; phase-1 σ = {sigma_c:.4g} (q = {q:.4g}, {c_steps} steps)" if c_steps else "")
        + f"; then {windows} generator steps on the release (no data read)"
    )
    bounds = (alone.epsilon, total.epsilon, alone.accountant)
    clipped = ClippedGaussianSum(sigma_c, float(config["clip_c"]))
    return loop_plan(target, (q, c_steps + windows, info.n), events, bounds, clipped, (note,))


def _paper_plan(
    info: DataInfo, target: PrivacyTarget, config: Mapping[str, Any], q_w: float
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
        PoissonGaussian(s_, r, t).to_json()
        for s_, r, t in (
            (sigma_c, q, c_steps),
            (sigma_agg, q, window * windows),
            (sigma_conv2, q2, windows),
        )
        if t
    ]
    claimed = compose_epsilon(streams, delta).epsilon
    steps = c_steps + windows
    label = NonPrivate(annotations={
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
    })  # fmt: skip
    loop = PrivacyPlan.non_private_loop(delta, q_w, steps, info.n)  # its one event first
    return replace(
        loop,
        events=(*loop.events, label),
        accountant=f"none ({NOT_DP_LABEL})",
        gaussian_sum=ClippedGaussianSum(0.0, float(config["clip_conv2"])),
        notes=(
            f"WARNING: mode=paper is {NOT_DP_LABEL}: the paper's claim ε = {claimed:.4g} "
            "(independent streams) is not a proven bound; recorded as NOT PRIVATE",
            f"σ₁ = {sigma_c:.4g}, DPAGG σ₃ = {sigma_agg:.4g}, conv2* σ₂ = {sigma_conv2:.4g}",
        ),
    )


def _phase1_event(sigma: float, q: float, steps: int, config: Mapping[str, Any]) -> DpEvent:
    """Phase 1's event: DP-SGD on the classifier C, all its parameters."""
    return PoissonGaussian(sigma, q, steps, annotations={
        "mechanism": "dpaf phase 1: DP-SGD on classifier C (all parameters)",
        "max_grad_norm": float(config["clip_c"]),
    })  # fmt: skip
