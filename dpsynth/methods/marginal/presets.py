"""Presets of the marginal-based synthesizers (plain data).

Shared keys:
- `bins`: bins of a numeric column over its public [min, max] (an integer column with at most
  this many values gets one bin per value); `bound_bins`: the bounds are bins of their own.
- `selection_share`: the share of the budget (in Gaussian-DP terms, see
  `privacy/accounting/marginal_plan.py`) given to the exponential mechanism's selections.
- `max_cells`: the largest marginal (cells) a selection may pick.
- `iters`, `final_iters`: the most steps of the model's estimation (`estimator.py`) per round
  and at the end (fewer when the loss stops improving).
- `max_memory_mb`: the refusal cap of the memory estimate (before anything is spent).
MST only:
- `label_edges`: the tree spans the features and every edge is measured with the target.
AIM only:
- `selections`: the number of marginals selected and measured after the one-way ones (0: a
  public rule from the columns, N and ε, `aim.auto_selections`);
- `rounds`: estimation rounds they are spread over (each round selects its share from the
  model of the previous one, then measures them and re-estimates; 0: about 120 / d, within
  [2, 8]);
- `max_model_mb`: the cap on the junction tree's size (float64 cells), reached gradually over
  the rounds: every estimation step passes messages over every cell of it.
"""

from __future__ import annotations

from typing import Any

# Numbers: the public [min, max] in 10 equal-width bins plus the two bounds as bins of their
# own (`bins` 12). The 10-bin grid is the one the marginal metric scores (`dpsynth.evaluation.
# marginals`) and the one the SmartNoise bench gets; a grid that does not line up with it
# spreads a spiky integer column (german-credit's durations at 12, 24, 36 months) across the
# metric's bins. How 12 was chosen over 10, 16, 22 and 70 bins:
# bench/results/2026-11-23-tuning-logs/tuning-tables.md.
_COMMON: dict[str, Any] = {
    "bins": 12,
    "bound_bins": True,
    "max_cells": 10_000,
    "max_memory_mb": 8192,
}

AIM_PRESETS: dict[str, dict[str, Any]] = {
    # CPU tests in seconds: few rounds, short estimation.
    "tiny": {
        **_COMMON,
        "bins": 8,
        "selections": 4,
        "rounds": 1,
        "selection_share": 0.1,
        "max_model_mb": 4.0,
        "iters": 100,
        "final_iters": 200,
    },
    "small": {
        **_COMMON,
        "selections": 0,
        "rounds": 0,
        "selection_share": 0.1,
        # A model of at most 16 MB and 150 / 400 estimation steps: about 100 s on census's
        # 41 columns on a 2-core CPU (the sizes compared:
        # bench/results/2026-11-23-tuning-logs/tuning-tables.md).
        "max_model_mb": 16.0,
        "iters": 150,
        "final_iters": 400,
    },
}

MST_PRESETS: dict[str, dict[str, Any]] = {
    "tiny": {
        **_COMMON,
        "bins": 8,
        "selection_share": 1.0 / 3.0,
        "label_edges": True,
        "iters": 100,
        "final_iters": 200,
    },
    "small": {
        **_COMMON,
        "selection_share": 1.0 / 3.0,
        # The tree spans the features and each edge is measured with the target (tree-
        # augmented naive Bayes, `mst.py`): better marginals and classifiers on census and
        # german-credit than a plain tree
        # (bench/results/2026-11-23-tuning-logs/tuning-tables.md).
        "label_edges": True,
        "iters": 300,
        "final_iters": 3000,
    },
}
