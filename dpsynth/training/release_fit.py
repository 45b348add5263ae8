"""Before a table's DP releases are spent: the run's backend (`--method auto` chosen on the
table's public description before the release, the one the release is planned on) and the
check that its training plan still fits under `--epsilon` after the releases' events. Shared
by the in-memory path (`training.start`) and the out-of-core engines
(`training.engine_release`), so that both refuse the same runs before anything is spent."""

from __future__ import annotations

from collections.abc import Sequence

from dpsynth.data.images import DataInfo
from dpsynth.ledger import Ledger
from dpsynth.methods.base import Method
from dpsynth.methods.recommend import recommend_method, resolve_preset
from dpsynth.methods.registry import get_method
from dpsynth.privacy.accounting.events import DpEvent
from dpsynth.privacy.accounting.plan import PrivacyTarget
from dpsynth.training.request import TrainRequest


def recommended(info: DataInfo, target_epsilon: float) -> Method:
    """The backend `--method auto` picks for this public description."""
    return get_method(recommend_method(info, target_epsilon))


def check_training_fits(
    backend: Method,
    request: TrainRequest,
    info: DataInfo,
    events: Sequence[DpEvent],
    delta: float,
    ledger: Ledger,
    rows_in_memory: bool = True,
) -> None:
    """UsageError (exit 2), from public facts only, when the run's config or training plan
    would fail after the releases' `events` (composed with the data set's earlier spends);
    `rows_in_memory` false for an engine's source (its rows are counted, never held)."""
    target_epsilon = request.target_epsilon
    preset = resolve_preset(backend, request.preset, info, target_epsilon)
    config = backend.config(preset, dict(request.overrides), info)
    if rows_in_memory:
        backend.validate_config(config, info)
    else:
        backend.validate_config(config, info, rows_in_memory=False)  # type: ignore[call-arg]
    prior = (*ledger.events_for(info.dataset_id, info.fingerprint or None), *events)
    backend.plan(info, PrivacyTarget(target_epsilon, delta), config, prior)
