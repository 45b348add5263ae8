"""The ablation rows of issue 45 as named leaderboard variants (`python -m bench.leaderboard
--ablation`): what each method's own mechanism adds, alone and beside the shared stages.

- `preset`: the recommended preset as it ships (for most 28×28 presets: the method's own
  mechanism warm-started by the DP frequency model, no teacher);
- `alone`: the method's own mechanism on all of ε (no frequency model, no central images);
- `teacher`: `alone` plus the DP teacher relabelling the samples, on half of ε;
- `both`: the preset plus the teacher on half of ε (the preset's stages share the other half).

A setting a method's preset does not have is skipped for that method (`settings_for`), so for
`freq`, whose release is the frequency model, `alone` is its preset; `distinct_variants`
drops such repeats so that no row is trained twice.
"""

from __future__ import annotations

from dpsynth.methods.blocks import HALF_BUDGET_TEACHER

# The teacher of the ablation: the relabelling teacher at half of ε instead of the other
# methods' `mnist-teacher` 70%, so that the rows with and without it give the method's own
# stages the same or half the budget.
TEACHER = [f"{key}={value}" for key, value in HALF_BUDGET_TEACHER.items()]
NO_SHARED_STAGES = ["frequency_share=0", "warm_start_share=0"]

ABLATION_VARIANTS: list[tuple[str, list[str]]] = [
    ("preset", []),
    ("alone", NO_SHARED_STAGES),
    ("teacher", [*NO_SHARED_STAGES, *TEACHER]),
    ("both", TEACHER),
]


def distinct_variants(
    variants: list[tuple[str, list[str]]], settings: list[list[str]]
) -> list[tuple[str, list[str]]]:
    """The variants whose effective settings (`settings[i]`, what the method's preset keeps
    of variant i) differ from every earlier one's: the first of a repeated set stays."""
    seen: list[list[str]] = []
    kept = []
    for variant, effective in zip(variants, settings, strict=True):
        if sorted(effective) in seen:
            continue
        seen.append(sorted(effective))
        kept.append(variant)
    return kept
