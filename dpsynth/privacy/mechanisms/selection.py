"""The exponential mechanism: choosing one candidate by a private quality score.

A candidate r is drawn with probability ∝ exp(ε · u_r / (2Δ)), where u_r is its quality on
the private data and Δ bounds how much any u_r changes between neighbouring data sets
(add/remove one record). That is ε-DP (McSherry & Talwar 2007); the ledger records each
selection as a `pure_dp` event of that ε, which the accountant composes through the
dominating pair of every ε-DP mechanism, randomized response (`privacy/accounting/compose.py`).
Adaptivity is allowed: which candidates are offered and their public offsets may depend on
earlier releases; only ε and Δ are fixed by the plan.

The draw is the Gumbel-max trick: argmax_r (ε u_r / (2Δ) + G_r) with G_r i.i.d. standard
Gumbel is distributed exactly as the softmax above. The uniform draws come from the run's
secret stream (`PrivateRandomness`), never from the public seed.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from dpsynth.errors import DpsynthError
from dpsynth.privacy.accounting.events import PureDp

SELECTION_MECHANISM = "exponential mechanism (ε-DP, quality sensitivity Δ, add/remove)"


def selection_event(epsilon: float, count: int, **annotations: Any) -> PureDp:
    """The event of `count` exponential-mechanism selections at ε each."""
    return PureDp(
        float(epsilon),
        int(count),
        annotations={"mechanism": SELECTION_MECHANISM, **annotations},
    )


def exponential_mechanism(
    scores: np.ndarray, sensitivity: float, epsilon: float, generator: torch.Generator
) -> int:
    """The index of one candidate drawn with probability ∝ exp(ε·score / (2·sensitivity)).

    `scores` are the candidates' qualities on the private data (float, one per candidate),
    each changing by at most `sensitivity` between neighbouring data sets. ε = inf takes the
    best candidate (the `--epsilon inf` baseline only).
    """
    scores = np.asarray(scores, dtype=np.float64).reshape(-1)
    if scores.size == 0:
        raise DpsynthError("the exponential mechanism needs at least one candidate")
    if not (sensitivity > 0 and math.isfinite(sensitivity)):
        raise DpsynthError(f"the quality sensitivity must be positive, got {sensitivity}")
    if not epsilon > 0:
        raise DpsynthError(f"the selection ε must be positive, got {epsilon}")
    if not np.isfinite(scores).all():
        raise DpsynthError("the exponential mechanism's scores must be finite")
    if math.isinf(epsilon):
        return int(np.argmax(scores))
    logits = torch.from_numpy(scores * (epsilon / (2.0 * sensitivity)))
    uniform = torch.rand(
        scores.size, generator=generator, dtype=torch.float64, device=generator.device
    ).cpu()
    # −log(−log U) is standard Gumbel; U = 0 gives −inf (a draw of probability zero).
    gumbel = -torch.log(-torch.log(uniform))
    return int(torch.argmax(logits + gumbel))
