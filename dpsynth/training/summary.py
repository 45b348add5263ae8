"""The run's summary (what `train` returns and prints), its preview grid, JSON values."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from dpsynth.data.images import DataInfo
from dpsynth.ledger import Ledger
from dpsynth.methods.base import Method, Trainer
from dpsynth.privacy.accounting.plan import PrivacyPlan
from dpsynth.privacy.accounting.plan_check import not_dp_label
from dpsynth.rundir import RunDir
from dpsynth.training.png_grid import save_grid


def json_eps(value: float) -> float | str:
    return value if math.isfinite(value) else "inf"


def json_stat(value: float) -> float | None:
    """A logged stat; non-finite (an empty batch's mean) is written as null."""
    value = float(value)
    return value if math.isfinite(value) else None


def write_preview(
    run: RunDir,
    backend: Method,
    info: DataInfo,
    config: Mapping[str, Any],
    trainer: Trainer,
    seed: int,
    device: torch.device,
) -> None:
    if info.modality != "image":
        return  # a table's preview is a `sample` away; there is no grid to draw
    per_class = 8
    labels = torch.arange(len(info.classes), device=device).repeat_interleave(per_class)
    rng = torch.Generator(device=device).manual_seed(seed + 99)
    batches = list(trainer.generator().sample(labels, 256, rng))
    save_grid(torch.cat(batches).cpu(), run.preview_path, nrow=per_class)


def run_summary(
    run: RunDir, run_config: Mapping[str, Any], ledger: Ledger, plan: PrivacyPlan, step: int
) -> dict[str, Any]:
    seq = int(run_config["ledger"]["spend_seq"])
    spend = ledger.spend(seq)
    loop = plan.gaussian_sum
    return {
        "run": str(run.path),
        "run_id": run_config["run_id"],
        "method": run_config["method"],
        "preset": run_config["preset"],
        "dataset_id": run_config["data"]["dataset_id"],
        "private": plan.private,
        "steps": step,
        "total_steps": plan.steps,
        # the loop's clipped Gaussian sum (σ, C), None for a plan without one (mst, aim)
        "noise_multiplier": None if loop is None else loop.noise_multiplier,
        "sampling_rate": plan.sampling_rate,
        "max_grad_norm": None if loop is None else json_eps(loop.max_grad_norm),
        # what the plan applies, one line per mechanism
        "mechanisms": [event.describe() for event in plan.events],
        "delta": plan.delta,
        "epsilon": json_eps(plan.epsilon_bound),
        "dataset_total_epsilon": spend.get("total_epsilon"),
        "accountant": plan.accountant,
        # whom the guarantee protects: a privacy unit of at most K rows, or None: one row
        "privacy_unit": run_config.get("privacy_unit"),
        "stages": run_config.get("stages"),
        # Declared-public images it pretrained on (`--public`; no ε), or None.
        "public": run_config.get("public"),
        # A run that added noise under a claimed ε that is not a proven bound says so.
        "privacy_label": not_dp_label(plan.events),
        "ledger_seq": seq,
        "ledger_status": spend.get("status"),
        "preview": str(run.preview_path) if run.preview_path.exists() else None,
    }
