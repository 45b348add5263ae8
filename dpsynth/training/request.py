"""The request of one `train`: its fields, their checks, and the device and ε it names.

`TrainRequest` is built by the CLI from its flags (or by Python code), and parsed and checked
once, when it is built: ε becomes a float (inf: not private), and what cannot start is refused
(UsageError, exit 2, naming the parameter) before anything is read or written.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from dpsynth.errors import UsageError

_TABLE_PARAMETERS = (
    "schema",
    "schema_public",
    "schema_epsilon",
    "class_weights_epsilon",
    "privacy_unit",
    "max_rows_per_unit",
)


def resolve_device(device: str) -> torch.device:
    """`auto` → CUDA when present, else CPU; `cuda` without a GPU is a UsageError."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        chosen = torch.device(device)
    except RuntimeError:
        raise UsageError(
            f"{{device}} must be auto, cpu or cuda[:N], got {device!r}", parameter="device"
        ) from None
    if chosen.type == "cuda":
        if not torch.cuda.is_available():
            raise UsageError(
                "{device} cuda was asked for, but no CUDA device is available",
                parameter="device",
            )
        if chosen.index is not None and chosen.index >= torch.cuda.device_count():
            raise UsageError(
                f"{{device}} {device}: only {torch.cuda.device_count()} CUDA devices",
                parameter="device",
            )
    elif chosen.type != "cpu":
        raise UsageError(
            f"{{device}} must be auto, cpu or cuda[:N], got {device!r}", parameter="device"
        )
    return chosen


def parse_epsilon(value: str | float) -> float:
    """`inf` (the non-private baseline) or a positive finite number."""
    try:
        epsilon = float(value)
    except ValueError:
        raise UsageError(
            f"{{epsilon}} must be a number or 'inf', got {value!r}", parameter="epsilon"
        ) from None
    if math.isnan(epsilon) or epsilon <= 0:
        raise UsageError(
            f"{{epsilon}} must be positive (or 'inf' for no privacy), got {value!r}",
            parameter="epsilon",
        )
    return epsilon


@dataclass(frozen=True)
class TrainRequest:
    """Everything one `train` needs: built by the CLI from its flags (or by Python code),
        parsed and checked (`validate`) when built, before anything is read or written.

        A new run needs `method`, `data`, `epsilon` and `ledger_path`; `resume=True` needs only
        `out` (the run's recorded settings are used, and its recorded ledger when `ledger_path` is
        None). `epsilon` is the data set's total budget after this run (given as a number or
    "inf", held as a float; math.inf: not private).
        `stop_after_steps` and `privacy_seed` are for tests only (see `train`).
    """

    out: Path | str
    method: str | None = None
    data: str | None = None
    epsilon: float | None = None
    delta: float | None = None
    preset: str = "auto"
    ledger_path: Path | str | None = None
    device: str = "auto"
    seed: int = 0
    resume: bool = False
    overrides: Mapping[str, Any] = field(default_factory=dict)
    image_size: int | None = None
    dataset_id: str | None = None
    # A public upper bound N' on the record count, used in place of N (q, δ, config.json).
    public_size: int | None = None
    classes: tuple[str, ...] | None = None  # a "a,b,c" string is split
    channels: int | None = None
    checkpoint_every_s: float = 120.0
    stop_after_steps: int | None = None
    log_private_loss: bool = False
    privacy_seed: int | None = None
    # Tables: the schema file (default: a built-in table's bundled schema), and what to do with
    # its entries read off the data (declare them public, or release them with DP).
    schema: Path | str | None = None
    schema_public: bool = False
    schema_epsilon: float | None = None
    # Tables: release the target's class proportions with DP (this ε, part of the total).
    class_weights_epsilon: float | None = None
    # Images the data owner declares public (a data spec), pretrained on at no privacy cost;
    # with `resume`, it must be the set the run recorded (which is used when this is None).
    public: str | None = None
    # Tables: where the marginals are counted (auto, memory, duckdb or dask://HOST:PORT; see
    # `dpsynth.data.engines`) and the memory budget in bytes that `auto` and DuckDB keep to
    # (None: `dpsynth.data.limits.memory_budget()`).
    engine: str = "auto"
    memory_budget: int | None = None
    # Tables: the column naming a person and the most rows one person keeps (public): the
    # guarantee is then per person, not per row (`dpsynth.training.table_units`).
    privacy_unit: str | None = None
    max_rows_per_unit: int | None = None

    def __post_init__(self) -> None:
        # Parsed once into typed fields, then checked: a built request can start.
        if self.epsilon is not None:
            object.__setattr__(self, "epsilon", parse_epsilon(self.epsilon))
        object.__setattr__(self, "overrides", dict(self.overrides or {}))
        if isinstance(self.classes, str):
            from dpsynth.data.sources import parse_classes

            object.__setattr__(self, "classes", parse_classes(self.classes))
        elif self.classes is not None:
            object.__setattr__(self, "classes", tuple(self.classes))
        self.validate()

    @property
    def target_epsilon(self) -> float:
        """The ε of a new run (math.inf: the non-private baseline)."""
        return math.inf if self.epsilon is None else float(self.epsilon)

    @staticmethod
    def check_complete(
        *, resume: bool, method: str | None, data: str | None, epsilon: float | str | None
    ) -> None:
        """UsageError naming what a new run lacks (method, data, epsilon); a resumed run
        takes them from its directory."""
        if resume:
            return
        given = (("method", method), ("data", data), ("epsilon", epsilon))
        missing = [name for name, value in given if value is None]
        if missing:
            named = ", ".join("{" + name + "}" for name in missing)
            raise UsageError(
                f"missing {named} (or use {{resume}})", parameters=(*missing, "resume")
            )

    def validate(self) -> None:
        """UsageError (exit 2) for a request that cannot start, before anything is read (run
        when the request is built)."""
        self.check_complete(
            resume=self.resume, method=self.method, data=self.data, epsilon=self.epsilon
        )
        resolve_device(self.device)
        if not (self.checkpoint_every_s >= 0 and math.isfinite(self.checkpoint_every_s)):
            raise UsageError(
                "{checkpoint_every_s} must be a number of seconds ≥ 0, got "
                f"{self.checkpoint_every_s}",
                parameter="checkpoint_every_s",
            )
        if not -(2**63) <= self.seed < 2**63:
            raise UsageError(f"{{seed}} must fit in 64 bits, got {self.seed}", parameter="seed")
        if self.public_size is not None and not 1 <= self.public_size < 2**53:
            raise UsageError(
                f"{{public_size}} must be a whole number ≥ 1, got {self.public_size}",
                parameter="public_size",
            )
        if self.engine != "auto":
            from dpsynth.data.engines import ENGINES, parse_engine

            try:
                parse_engine(self.engine)
            except UsageError:
                raise UsageError(
                    f"{{engine}} must be one of {', '.join(ENGINES)}, got {self.engine!r}",
                    parameter="engine",
                ) from None
        if self.memory_budget is not None and self.memory_budget < 2**16:
            raise UsageError(
                f"{{memory_budget}} must be at least 64K bytes, got {self.memory_budget}",
                parameter="memory_budget",
            )
        if not self.resume:
            if self.ledger_path is None:
                raise UsageError("a new run needs a ledger path")
            if self.public is not None and self.data is not None:
                from dpsynth.data.sources import is_table_spec

                if is_table_spec(self.data):
                    raise UsageError(
                        "{public} takes images to pretrain on; {data} is a table",
                        parameters=("public", "data"),
                    )
            from dpsynth.training.table_units import unit_bound

            unit = unit_bound(self.privacy_unit, self.max_rows_per_unit)  # both or neither
            table_flags = self.schema is not None or self.schema_public
            released = self.schema_epsilon is not None or self.class_weights_epsilon is not None
            if self.data is not None and (table_flags or released or unit is not None):
                from dpsynth.data.sources import is_table_spec

                if unit is not None and not is_table_spec(self.data):
                    from dpsynth.training.image_units import check_image_unit

                    check_image_unit(self.data, unit.column, unit.max_rows)
                elif not is_table_spec(self.data):
                    raise UsageError(
                        "{schema}, {schema_public}, {schema_epsilon} and "
                        "{class_weights_epsilon} are for tables",
                        parameters=_TABLE_PARAMETERS[:4],
                    )
            for name, value in (
                ("schema_epsilon", self.schema_epsilon),
                ("class_weights_epsilon", self.class_weights_epsilon),
            ):
                if value is not None and not (math.isfinite(value) and value > 0):
                    raise UsageError(
                        f"{{{name}}} must be a positive number, got {value}", parameter=name
                    )
