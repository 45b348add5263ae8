"""Black-box one-run audit of a whole table run: canary rows in, `train` → `sample`, a score
from the released rows only.

Steinke, Nasr and Jagielski's one-run audit with the release as the only view: m canary rows,
each added to the real training table with probability 1/2, the library's own `train_run`
(plan, ledger spend, the method's training) and `sample_table` (the synthetic CSV) run on it,
in a temporary folder with its own ledger, and each canary scored by how closely the nearest
released row matches it (the number of its columns that row reproduces: a category exactly, a
number within `_NUMBER_TOLERANCE` of its public range). The canaries are rare by design: every
column drawn uniformly from its public domain, so a synthetic row that reproduces many of
them is hard to explain without the canary.

What it shows: the run as a whole, through its real code path, did not let this attacker
tell members from non-members beyond the bound. A black-box bound is usually far below the
claim (the score sees only what the synthetic rows reproduce, a weak attack on a mechanism
made of noisy marginals); it does not show that ε is tight nor that a stronger attack fails.
Only public or synthetic rows are read: the built-in table (public) and the canaries.
"""

from __future__ import annotations

import csv
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from dpsynth.auditing.guesses import GuessOutcome, best_guesses, draw_canaries
from dpsynth.data.builtin_tables import TABLE_BUILTINS, TABLES_DIR, load_builtin_table
from dpsynth.data.schema import Column, Schema
from dpsynth.errors import UsageError
from dpsynth.methods.registry import get_method

__all__ = ["BlackBoxResult", "canary_rows", "match_scores", "run_blackbox"]

_NUMBER_TOLERANCE = 0.05


@dataclass(frozen=True)
class BlackBoxResult:
    """The run's claimed ε beside the black-box lower bound, and how it was measured."""

    method: str
    preset: str
    data: str
    target_epsilon: float
    claimed_epsilon: float
    delta: float
    lower_bound: float
    canaries: int
    canaries_in: int
    guesses: int
    correct: int
    confidence: float
    synthetic_rows: int
    mode: str = "black-box (train → sample, score from the released rows)"
    # `train`'s `--set` values the run was trained with ("key=value").
    overrides: tuple[str, ...] = ()

    @property
    def leaks(self) -> bool:
        """True when the lower bound exceeds the claimed ε."""
        return self.lower_bound > self.claimed_epsilon

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict with the verdict."""
        out = dict(self.__dict__)
        out["overrides"] = list(self.overrides)
        out["verdict"] = "FAIL" if self.leaks else "pass"
        return out

    @classmethod
    def of_run(
        cls,
        trained: dict[str, Any],
        data: str,
        epsilon: float,
        scores: dict[str, Any],
        included: torch.Tensor,
        confidence: float,
        synthetic_rows: int,
        overrides: Mapping[str, str] | None = None,
        **mode: str,
    ) -> BlackBoxResult:
        """The result of a trained run (`train_run`'s summary) whose canaries scored
        `scores`: the best guesses' lower bound at the run's δ beside its claimed ε."""
        delta = float(trained["delta"])
        outcome: GuessOutcome = best_guesses(scores, included, delta, confidence)
        return cls(
            method=str(trained["method"]),
            preset=str(trained["preset"]),
            data=data,
            target_epsilon=float(epsilon),
            claimed_epsilon=float(trained["epsilon"]),
            delta=delta,
            lower_bound=outcome.lower_bound,
            canaries=len(included),
            canaries_in=int(included.sum()),
            guesses=outcome.guesses,
            correct=outcome.correct,
            confidence=confidence,
            synthetic_rows=synthetic_rows,
            overrides=tuple(f"{k}={v}" for k, v in (overrides or {}).items()),
            **mode,
        )


def _draw(column: Column, count: int, rng: np.random.Generator) -> list[str]:
    """`count` values of one column drawn uniformly from its public domain, as CSV text."""
    if column.is_categorical:
        levels = list(column.levels)
        return [str(levels[i]) for i in rng.integers(0, len(levels), count)]
    low, high = float(column.min), float(column.max)  # type: ignore[arg-type]
    if column.type == "integer":
        return [str(int(v)) for v in rng.integers(int(low), int(high) + 1, count)]
    return [f"{v:.6g}" for v in rng.uniform(low, high, count)]


def canary_rows(schema: Schema, header: tuple[str, ...], count: int, seed: int) -> pd.DataFrame:
    """`count` canary rows (strings, in `header`'s column order), every used column drawn
    uniformly from its public domain; columns the schema ignores are left empty."""
    rng = np.random.default_rng(seed)
    used = {c.name: c for c in (*schema.features, schema.target_column)}
    return pd.DataFrame(
        {name: _draw(used[name], count, rng) if name in used else [""] * count for name in header}
    )


def match_scores(schema: Schema, canaries: pd.DataFrame, synthetic: pd.DataFrame) -> torch.Tensor:
    """For each canary, the most columns any one synthetic row reproduces (float64 [m])."""
    matches = np.zeros((len(canaries), len(synthetic)), dtype=np.int32)
    for column in (*schema.features, schema.target_column):
        ours = canaries[column.name].to_numpy()
        theirs = synthetic[column.name].to_numpy()
        if column.is_categorical:
            matches += ours[:, None] == theirs[None, :]
            continue
        span = max(float(column.max) - float(column.min), 1e-12)  # type: ignore[arg-type]
        a = pd.to_numeric(pd.Series(ours), errors="coerce").to_numpy(dtype=float)
        b = pd.to_numeric(pd.Series(theirs), errors="coerce").to_numpy(dtype=float)
        matches += np.abs(a[:, None] - b[None, :]) <= _NUMBER_TOLERANCE * span
    return torch.from_numpy(matches.max(axis=1).astype(np.float64))


def run_blackbox(
    method: str,
    preset: str,
    epsilon: float,
    *,
    canaries: int = 100,
    confidence: float = 0.95,
    data: str = "german-credit",
    seed: int | None = None,
    synthetic_rows: int | None = None,
    workdir: Path | str | None = None,
    overrides: Mapping[str, str] | None = None,
) -> BlackBoxResult:
    """One black-box run: canaries into the built-in table, `train` (with `overrides`, `train`'s
    `--set` values) and `sample` through the library, the guesses from the synthetic rows → a
    lower bound beside the run's claim."""
    from dpsynth.sampling import sample_table
    from dpsynth.training.entry import train_run

    if "table" not in get_method(method).modalities:
        raise UsageError(
            f"--method {method} takes image data only; --black-box audits a table method's "
            "whole run (e.g. --method mst) on a built-in table"
        )
    if data not in TABLE_BUILTINS:
        raise UsageError(
            f"--black-box audits a built-in table (one of {', '.join(TABLE_BUILTINS)}), "
            f"got --data {data}"
        )
    table = TABLE_BUILTINS[data]
    schema = table.schema()
    base = load_builtin_table(data, "train")
    generator, included = draw_canaries(canaries, seed)
    canary_seed = int(torch.randint(0, 2**31 - 1, (1,), generator=generator))
    rows = canary_rows(schema, base.header, canaries, canary_seed)
    real = pd.DataFrame({name: col for name, col in zip(base.header, base.columns, strict=True)})
    with tempfile.TemporaryDirectory(dir=workdir) as folder:
        work = Path(folder)
        train_csv = work / "train.csv"
        pd.concat([real, rows[included.numpy()]], ignore_index=True).to_csv(
            train_csv, index=False, quoting=csv.QUOTE_MINIMAL
        )
        ledger = work / "ledger.jsonl"
        trained = train_run(
            method=method,
            data=f"csv:{train_csv}",
            schema=TABLES_DIR / table.schema_file,
            epsilon=float(epsilon),
            preset=preset,
            out=work / "run",
            ledger_path=ledger,
            device="cpu",
            seed=0,
            overrides=dict(overrides or {}),
        )
        count = int(synthetic_rows or table.n_train)
        sample_table(work / "run", count, work / "synthetic.csv", ledger_path=ledger, device="cpu")
        synthetic = pd.read_csv(work / "synthetic.csv", dtype=str, keep_default_na=False)
    scores = match_scores(schema, rows, synthetic)
    return BlackBoxResult.of_run(
        trained, data, epsilon, {"matches": scores}, included, confidence, count, overrides
    )
