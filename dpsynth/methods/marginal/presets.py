"""Presets of the marginal-based synthesizers (plain data).

Shared keys:
- `bins`: bins of a numeric column over its public [min, max] (an integer column with at most
  this many values gets one bin per value); `bound_bins`: the bounds are bins of their own.
- `selection_share`: the share of the budget (in Gaussian-DP terms, see
  `privacy/accounting/marginal_plan.py`) given to the exponential mechanism's selections.
- `max_cells`: the largest marginal (cells) a selection may pick.
- `iters`, `final_iters`: the most steps of the model's estimation (`mirror.py`) per round
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
# own (`bins` 12). The 10-bin grid is the one the marginal metric scores (`dpsynth.evaluate.
# marginals`) and the one the SmartNoise bench gets; a grid that does not line up with it
# spreads a spiky integer column (german-credit's durations at 12, 24, 36 months) across the
# metric's bins (the representation alone: 2-way TVD 0.119 against the 0.106 of the real rows).
# german-credit at ε = 1, aim, 2-way TVD over 6 runs each
# (bench/results/2026-11-23-tuning-logs/tuning-tables.md): 12 bins 0.119–0.127 (mean 0.123); 16
# (before) 0.137–0.151 (0.142); 22 0.124–0.138; 70 (ages and durations exact) 0.138–0.153; without
# the bound bins, 10, 12 or 20 bins: means 0.129–0.132. At ε = 10 (aim 0.110–0.111 against
# 0.118–0.122) and on census (mst 0.033–0.034 against 0.038) 12 is ahead too.
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
        # census at ε = 10 (41 columns, 199,523 rows;
        # bench/results/2026-11-23-tuning-logs/tuning-tables.md, 2026-11-28): 16 MB (2.1M cells) and
        # 150 / 400 steps train in about 100 s for a 2-way TVD of 0.019 (LR ROC-AUC 0.86); 32 MB
        # 0.025 in 150 s, 8 MB 0.021 (LR 0.83) in 63 s; 1,000 final steps instead of 400 gave the
        # same marginals (0.019) in 180 s.
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
        # augmented naive Bayes, `mst.py`). bench/results/2026-11-23-tuning-logs/tuning-tables.md,
        # 2026-11-27: census (2 runs per ε) 2-way TVD 0.032 against 0.033–0.034, logreg ROC-AUC
        # 0.919 against 0.82–0.84 (GBM 0.92); german-credit at ε = 10 (3 runs) 0.113–0.115 against
        # 0.110–0.112, logreg 0.75–0.77 against 0.73–0.74; at ε = 1 0.152–0.158 against
        # 0.135–0.143 (where `auto` picks aim).
        "label_edges": True,
        "iters": 300,
        "final_iters": 3000,
    },
}
