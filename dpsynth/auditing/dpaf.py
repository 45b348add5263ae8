"""White-box one-run audit of DPAF's phase-2 windows (or its one release) through their own code.

Each window (`methods/dpaf/phase2.py`) draws a Poisson(q_w) union, gives each member its
pattern over the μ discriminator steps (`window_patterns`), releases at each step the DPAGG
sum of the step's members' feature rows (`noisy_feature_sum`: rows renormed to Δ, noise
σ_agg·Δ) and, unless conv2* is frozen, one DP-SGD sum over the union (`private_gradient_sum`:
top-k, clip to C, noise σ_conv2·C). The plan's window event (a `poisson_gaussian` of σ_w, q_w
annotated with μ, q, σ_agg, σ_conv2 and C) is what the accountant bounds; the audit runs those
three functions themselves, with the event's values, on canary rows.

Design: canary i's feature row and its conv2* gradient are `_CANARY_NORM`× the bound along
coordinate i, so the functions' renorming and clipping bring it to exactly Δ (resp. C) on a
coordinate of its own (Δ = 1: the sum is linear in Δ and the noise is σ·Δ, so the audit sees
the same ratios as the trainer's SIN bound). A canary's score is the sum over the releases of
each one's Poisson-mixture log-likelihood ratio under the nominal mechanism (q per DPAGG
step, q_w for conv2*; the steps of a window are not independent given the union, so this is
a score, not the exact ratio, which the audit's validity does not need), and the largest
standardised value over them.

With `phase2_release=once` phase 2 is one Gaussian release of the per-class feature sums
(`noisy_group_sums`, rows renormed to Δ): canary i is alone in its group i, so an included
canary moves its group's sum by Δ (`once_scores`).

`break_mode` (`--break`, `auditing/breaks.py`): "noise:F" divides σ_agg and σ_conv2 by F; "clip:F"
or "sensitivity:F" renorms and clips F times too loosely with the noise unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from dpsynth.auditing.breaks import read_break
from dpsynth.auditing.whitebox import mixture_log_ratio
from dpsynth.privacy.accounting.events import DpEvent, Gaussian, PoissonGaussian
from dpsynth.privacy.mechanisms.aggregation import (
    noisy_feature_sum,
    noisy_group_sums,
    private_gradient_sum,
    window_patterns,
)
from dpsynth.privacy.mechanisms.poisson import PoissonSampler

__all__ = [
    "DPAF_BREAKS",
    "ONCE_PHASE",
    "is_window_event",
    "once_scores",
    "window_scores",
]

# The `phase` of `phase2_release=once`'s Gaussian event (as `methods/dpaf/plan.py` tags it; the
# audit reads the annotation rather than import a backend).
ONCE_PHASE = "dpaf-phase2-once"

DPAF_BREAKS = ("noise", "clip", "sensitivity")
_CANARY_NORM = 4.0
# The presets' top-k fraction; a canary's gradient has one non-zero entry, which top-k keeps.
_KEEP_FRACTION = 0.9


def is_window_event(event: DpEvent) -> bool:
    """True for DPAF's phase-2 window event (it carries the DPAGG noise multiplier)."""
    return isinstance(event, PoissonGaussian) and "agg_noise_multiplier" in dict(event.annotations)


def _evidence(released: Tensor, noise_std: float, q: float) -> tuple[Tensor, Tensor]:
    """(mixture log-likelihood ratio, standardised value) of a release moved by 1 per member."""
    shift = (released - 0.5) / (noise_std * noise_std)
    return mixture_log_ratio(shift, q), released / noise_std


def window_scores(
    event: PoissonGaussian,
    shape: Sequence[int],
    included: Tensor,
    generator: torch.Generator,
    break_mode: str | None = None,
) -> dict[str, Tensor]:
    """Each canary's {"llr", "max"} (float64 [m]) after the event's windows, run through
    `window_patterns`, `noisy_feature_sum` and `private_gradient_sum` on `generator`."""
    m = int(included.numel())
    window = int(event.annotation("window"))
    q = float(event.annotation("step_sampling_rate"))
    q_w = float(event.sampling_rate)
    agg_sigma = float(event.annotation("agg_noise_multiplier"))
    conv2 = event.annotation("conv2_noise_multiplier")
    conv2_sigma = None if conv2 is None else float(conv2)
    mode, factor = read_break(break_mode, DPAF_BREAKS)
    noise_cut = factor if mode == "noise" else 1.0
    loose = factor if mode in ("clip", "sensitivity") else 1.0
    members = torch.nonzero(included).flatten()
    sampler = PoissonSampler(int(members.numel()), q_w, generator)
    magnitude = max(_CANARY_NORM, 2.0 * factor)
    scores = torch.zeros(m, dtype=torch.float64)
    peak = torch.full((m,), -math.inf, dtype=torch.float64)
    for _ in range(int(event.steps)):
        union = members[sampler.next()]
        patterns = window_patterns(int(union.numel()), window, q, generator)
        for s in range(window):
            step = union[patterns[:, s]]
            rows = torch.zeros(int(step.numel()), m, dtype=torch.float64)
            rows[torch.arange(int(step.numel())), step] = magnitude
            # bound·F with σ/F: a renorm F times too loose, the noise std still σ_agg
            released = noisy_feature_sum(rows, loose, agg_sigma / noise_cut / loose, generator)
            ratio, value = _evidence(released, agg_sigma, q)
            scores += ratio
            peak = torch.maximum(peak, value)
        if conv2_sigma is None:
            continue
        grads = torch.zeros(int(union.numel()), m, dtype=torch.float64)
        grads[torch.arange(int(union.numel())), union] = magnitude
        summed = private_gradient_sum(
            {"conv2": grads},
            keep_fraction=_KEEP_FRACTION,
            max_norm=loose,
            noise_multiplier=conv2_sigma / noise_cut / loose,
            generator=generator,
        )["conv2"]
        ratio, value = _evidence(summed, conv2_sigma, q_w)
        scores += ratio
        peak = torch.maximum(peak, value)
    return {"llr": scores, "max": peak}


def once_scores(
    event: Gaussian,
    shape: Sequence[int],
    included: Tensor,
    generator: torch.Generator,
    break_mode: str | None = None,
) -> dict[str, Tensor]:
    """`phase2_release=once`: one `noisy_group_sums` release of the per-class sums (σ the
    event's), canary i alone in group i with its row along one coordinate → {"llr", "max"}."""
    m = int(included.numel())
    sigma = float(event.noise_multiplier)
    mode, factor = read_break(break_mode, DPAF_BREAKS)
    noise_cut = factor if mode == "noise" else 1.0
    loose = factor if mode in ("clip", "sensitivity") else 1.0
    members = torch.nonzero(included).flatten()
    rows = torch.zeros(int(members.numel()), 2, dtype=torch.float64)
    rows[:, 0] = max(_CANARY_NORM, 2.0 * factor)
    sums = noisy_group_sums(rows, members, m, loose, sigma / noise_cut / loose, generator)
    ratio, value = _evidence(sums[:, 0], sigma, 1.0)
    return {"llr": ratio, "max": value}
