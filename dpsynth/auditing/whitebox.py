"""White-box one-run audit of the DP-SGD step every backend's plan describes.

Each backend's plan lists its mechanisms as ledger events; a `poisson_gaussian` event (σ, q,
T, with the plan's clipping norm C) is what the accountant's ε is a proof about. The audit
runs that event through the privacy layer's own code: the real `PoissonSampler` at q and a
`PrivateGradient` with σ and C, for T steps, on a stand-in model whose per-record gradient is
the record itself (a bias-free linear layer with one output, whose output is the loss). Its
`grad_mode` picks the privacy layer's path: per-record gradients (`vmap`, every pure DP-SGD
plan's audit) or ghost norms (`ghost`, the steps behind a release, where the canaries are
dearest: 1.5× as fast a step, after the layer's own first-batch check against vmap). The
records are m Dirac canaries (the coordinate directions e_i scaled to norm
`CANARY_NORM_FACTOR`·C, so clipping has work to do), each in the audited data set with
probability 1/2. After each step the released noisy sum's coordinate i is canary i's evidence;
it has two scores, both fixed before the run: the log-likelihood ratio of "in" against "out"
under the plan's nominal (σ, q, C) summed over the steps (best when a canary is sampled often),
and the largest standardised value over the steps (best when it is sampled once or twice, or
when the mechanism is not the nominal one). `guesses.best_guesses` turns them into an ε lower
bound: the one-run test and, since each canary's evidence is its own coordinate (its own
Poisson draws, independent noise), the independent-trials test.

No other record shares the sum: that is the worst case for privacy (the most an auditor can
see), and it involves no user data at all. `break_mode` (`--break`, a user option) breaks the
mechanism inside the audit's own run (`auditing/breaks.py`; "clip:F": a clipping norm F·C with
the noise σC; "noise:F": σ/F) to show the audit's power; it never touches a real train. The
stand-in model and its records are float32, as a training run's are (half the time of float64,
which the many-run audit's millions of canaries feel); the scores are float64.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from dpsynth.auditing.breaks import check_break, read_break
from dpsynth.auditing.guesses import GuessOutcome, best_guesses, pooled_runs
from dpsynth.errors import UsageError
from dpsynth.privacy.accounting.events import DpEvent, Gaussian, PoissonGaussian
from dpsynth.privacy.mechanisms.dpsgd import PrivateGradient
from dpsynth.privacy.mechanisms.poisson import PoissonSampler

__all__ = [
    "BREAK_MODES",
    "CANARY_NORM_FACTOR",
    "MechanismStep",
    "audit_events",
    "canary_scores",
    "mechanism_steps",
]

# "sensitivity" is "clip" here: a DP-SGD step's sensitivity is its clipping norm.
BREAK_MODES = ("clip", "noise", "sensitivity")
# A canary's gradient norm in units of C: above 1 so that clipping is exercised; 4 makes
# "no clipping" as strong a break as σ/4.
CANARY_NORM_FACTOR = 4.0


@dataclass(frozen=True)
class MechanismStep:
    """One `poisson_gaussian` event of a plan: T steps at rate q with noise multiplier σ."""

    noise_multiplier: float
    sampling_rate: float
    steps: int


def mechanism_steps(events: Sequence[DpEvent]) -> list[MechanismStep]:
    """The plan's events as DP-SGD steps; UsageError naming any event this audit cannot run."""
    steps: list[MechanismStep] = []
    for event in events:
        if isinstance(event, Gaussian):
            # A Gaussian release of noise multiplier σ (e.g. the central images, normalised to
            # sensitivity 1) is, for a canary, a full-batch step: q = 1, `count` times.
            steps.append(MechanismStep(float(event.noise_multiplier), 1.0, event.times))
            continue
        if not isinstance(event, PoissonGaussian):
            raise UsageError(
                f"the white-box audit runs poisson_gaussian and gaussian events only; this "
                f"plan has a {event.kind!r} event"
            )
        steps.append(
            MechanismStep(
                float(event.noise_multiplier),
                float(event.sampling_rate),
                int(event.steps),
            )
        )
    if not steps:
        raise UsageError("the plan has no mechanism events to audit")
    return steps


def _linear_loss(params: dict[str, Tensor], buffers: dict[str, Tensor], x: Tensor) -> Tensor:
    """⟨w, x⟩ for one record: its gradient w.r.t. w is the record x itself."""
    return (params["weight"][0] * x).sum()


def _stand_in(m: int) -> tuple[nn.Linear, Callable[[Tensor], Tensor]]:
    """The stand-in model (w ∈ R^m, zero) and its per-record losses ⟨w, x_b⟩ [B]."""
    model = nn.Linear(m, 1, bias=False)  # float32, as a training run's models are
    nn.init.zeros_(model.weight)

    def batch_losses(records: Tensor) -> Tensor:
        return model(records).squeeze(-1)

    return model, batch_losses


def canary_scores(
    steps: Sequence[MechanismStep],
    max_grad_norm: float,
    included: Tensor,
    generator: torch.Generator,
    break_mode: str | None = None,
    grad_mode: str = "vmap",
) -> dict[str, Tensor]:
    """Each canary's scores after one run of `steps`: {"llr": summed log-likelihood ratio,
    "max": the largest standardised projection over the steps}, float64 [m] each.

    `included` (bool [m]) says which canaries are in the audited data set. The run draws its
    Poisson batches and noise from `generator`. `grad_mode` is `PrivateGradient`'s ("vmap"
    or "ghost"): the path whose clipped sum is audited.
    """
    check_break(break_mode, BREAK_MODES)
    mode, factor = read_break(break_mode, BREAK_MODES)
    m = int(included.numel())
    members = torch.nonzero(included).flatten()
    clip = float(max_grad_norm)
    # above every clipping norm the audit tries, so that a loose clip lets it all through
    canary_norm = max(CANARY_NORM_FACTOR, factor) * clip
    # float32, as a training run's models are (half the time of float64); scored in float64
    model, batch_losses = _stand_in(m)
    scores = torch.zeros(m, dtype=torch.float64)
    peak = torch.full((m,), -math.inf, dtype=torch.float64)
    for step in steps:
        gradient = _private_gradient(
            model, batch_losses, step.noise_multiplier, clip, generator, mode, factor, grad_mode
        )
        sampler = PoissonSampler(int(members.numel()), step.sampling_rate, generator)
        # What the nominal mechanism would show: +C on an included canary's coordinate, noise
        # of std σC on every coordinate; the score is the mixture's log-likelihood ratio.
        noise_std = step.noise_multiplier * clip
        for _ in range(step.steps):
            batch = members[sampler.next()]
            records = torch.zeros(int(batch.numel()), m, dtype=torch.float32)
            records[torch.arange(int(batch.numel())), batch] = canary_norm
            gradient.compute(records)
            released = model.weight.grad[0].double() * gradient.expected_batch_size
            scores += _log_likelihood_ratio(released, clip, noise_std, step.sampling_rate)
            peak = torch.maximum(peak, released / noise_std)
    return {"llr": scores, "max": peak}


def _private_gradient(
    model: nn.Module,
    batch_losses: Callable[[Tensor], Tensor],
    sigma: float,
    clip: float,
    generator: torch.Generator,
    break_mode: str | None,
    factor: float,
    grad_mode: str,
) -> PrivateGradient:
    """The privacy layer's DP-SGD gradient, or the audit's broken copy of it (`--break`).

    The expected batch size is 1: dividing the noisy sum by the public qN is post-processing,
    so the audit reads the sum itself.
    """
    if break_mode == "noise":
        sigma = sigma / factor
    if break_mode in ("clip", "sensitivity"):
        # A clipping norm F·C: a canary moves the sum by F·C; the noise std σ·C stays.
        loose = factor * clip
        return PrivateGradient(
            model,
            _linear_loss,
            noise_multiplier=sigma * clip / loose,
            max_grad_norm=loose,
            expected_batch_size=1.0,
            generator=generator,
            batch_loss_fn=batch_losses,
            grad_mode=grad_mode,
        )
    return PrivateGradient(
        model,
        _linear_loss,
        noise_multiplier=sigma,
        max_grad_norm=clip,
        expected_batch_size=1.0,
        # The audit's own stream: a fresh `torch.Generator()` here had the same default seed
        # for every step and every `--seed`, so the audits were not independent (issue 48).
        generator=generator,
        batch_loss_fn=batch_losses,
        grad_mode=grad_mode,
    )


def _log_likelihood_ratio(released: Tensor, clip: float, noise_std: float, q: float) -> Tensor:
    """log[(1 − q)·N(x; 0, s²) + q·N(x; C, s²)] − log N(x; 0, s²), per coordinate x."""
    shift = (clip * released - 0.5 * clip * clip) / (noise_std * noise_std)
    return mixture_log_ratio(shift, q)


def mixture_log_ratio(log_ratio: Tensor, q: float) -> Tensor:
    """log[(1 − q) + q·exp(log_ratio)]: a Poisson-sampled record's log-likelihood ratio from
    the ratio it would have if always included. q = 1 (a full-batch release, such as the
    frequency model's) is the ratio itself: log1p(−1) is −∞, not a number math can give."""
    if q >= 1:
        return log_ratio.clone()
    return torch.logaddexp(torch.full_like(log_ratio, math.log1p(-q)), log_ratio + math.log(q))


def audit_events(
    events: Sequence[DpEvent],
    max_grad_norm: float,
    delta: float,
    canaries: int,
    confidence: float,
    seed: int | None = None,
    break_mode: str | None = None,
    runs: int = 1,
) -> GuessOutcome:
    """`runs` white-box runs of the plan's events with `canaries` Dirac canaries each → the
    best guess."""
    steps = mechanism_steps(events)
    scores, included = pooled_runs(
        canaries,
        runs,
        seed,
        lambda inside, generator: canary_scores(
            steps, max_grad_norm, inside, generator, break_mode
        ),
    )
    return best_guesses(scores, included, delta, confidence, independent=True, family=events)
