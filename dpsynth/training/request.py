"""The request of one `train`: its typed parts, their checks, and the device and engine it names.

`TrainRequest` is the one spelling of what `train` takes. `TrainRequest.build(**keywords)`
makes it from the flat keyword names that `dpsynth train`'s options and `dpsynth.train`'s
keywords share (one name per concept, `FIELDS`; tests/training/test_request_surface.py checks
both surfaces against it). Each part parses and checks its own fields when it is built (ε
becomes a float, inf: not private; the device and the engine are resolved here, once); the
request then checks what concerns several parts. What cannot start is refused (UsageError,
exit 2, naming the parameter) before anything is read or written.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path, PurePath
from typing import TYPE_CHECKING, Any

import torch

from dpsynth.errors import UsageError

if TYPE_CHECKING:
    import pandas

    from dpsynth.data.engines import EngineChoice
    from dpsynth.data.schema_file import SchemaInput


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


def _set(part: object, name: str, value: Any) -> None:
    """A frozen part's field parsed in place while it is built."""
    object.__setattr__(part, name, value)


@dataclass(frozen=True)
class InputOptions:
    """What is read: the data (a spec such as `digits` or `csv:FILE`, a pandas DataFrame, or a
    path, made its spec here: `dpsynth.data.sources.spec_of_path`), its ledger id, and a public
    bound N' on its record count used in place of N (q, δ, config.json)."""

    data: str | pandas.DataFrame | None = None
    dataset_id: str | None = None
    public_size: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.data, PurePath):  # one spelling from here on: the spec
            from dpsynth.data.sources import spec_of_path

            _set(self, "data", spec_of_path(self.data))
        if self.public_size is not None and not 1 <= self.public_size < 2**53:
            raise UsageError(
                f"{{public_size}} must be a whole number ≥ 1, got {self.public_size}",
                parameter="public_size",
            )


@dataclass(frozen=True)
class ImageOptions:
    """Images: the size and channels they are brought to, the public label set ("a,b,c" is
    split), and images the data owner declares public (a data spec), pretrained on at no
    privacy cost (with `resume`, the set the run recorded, used when this is None)."""

    image_size: int | None = None
    channels: int | None = None
    classes: tuple[str, ...] | None = None
    public: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.classes, str):
            from dpsynth.data.sources import parse_classes

            _set(self, "classes", parse_classes(self.classes))
        elif self.classes is not None:
            _set(self, "classes", tuple(self.classes))


@dataclass(frozen=True)
class TableOptions:
    """Tables: the schema file (default: a built-in table's bundled schema), what to do with
    its entries read off the data (declare them public, or release them with DP), the DP
    release of the target's class proportions, where the marginals are counted (parsed into an
    `EngineChoice` here, once), the memory budget in bytes (a size such as "4G" is parsed;
    None: `dpsynth.data.limits.memory_budget()`), the out-of-core engines' counting processes
    or, on Dask, tasks in flight (None: every CPU; every task), and a TLS cluster's client
    credentials (None: Dask's own configuration), which the engine choice then carries."""

    schema: SchemaInput | None = None  # a file, a Schema or its JSON as a dict
    schema_public: bool = False
    schema_epsilon: float | None = None
    class_weights_epsilon: float | None = None
    engine: EngineChoice = "auto"  # type: ignore[assignment]  # parsed when built
    memory_budget: int | None = None
    workers: int | None = None
    tls_ca_file: Path | str | None = None
    tls_cert: Path | str | None = None
    tls_key: Path | str | None = None

    def __post_init__(self) -> None:
        from dpsynth.data.engines import ENGINES, parse_engine

        if isinstance(self.engine, str):
            try:
                _set(self, "engine", parse_engine(self.engine))
            except UsageError:
                raise UsageError(
                    f"{{engine}} must be one of {', '.join(ENGINES)}, got {self.engine!r}",
                    parameter="engine",
                ) from None
        if isinstance(self.memory_budget, str):
            from dpsynth.data.limits import parse_bytes

            try:
                _set(self, "memory_budget", parse_bytes(self.memory_budget))
            except UsageError:
                raise UsageError(
                    f"{{memory_budget}} {self.memory_budget!r}: expected a size in bytes such "
                    "as 4G or 512M",
                    parameter="memory_budget",
                ) from None
        if self.memory_budget is not None and self.memory_budget < 2**16:
            raise UsageError(
                f"{{memory_budget}} must be at least 64K bytes, got {self.memory_budget}",
                parameter="memory_budget",
            )
        from dpsynth.data.engines import check_workers, with_tls

        check_workers(self.workers, self.engine)
        if self.engine.name != "auto":  # `auto` with credentials: a resume (else refused)
            _set(self, "engine", with_tls(self.engine, *self.tls))  # carried by the choice

    @property
    def tls(self) -> tuple[Path | str | None, Path | str | None, Path | str | None]:
        """A TLS cluster's client credentials as given (CA, certificate, key)."""
        return (self.tls_ca_file, self.tls_cert, self.tls_key)

    def recorded_engine(self, recorded: str | None) -> EngineChoice:
        """A resumed run's engine: the one it recorded (None: memory), with this request's
        `workers` and TLS credentials checked against it (UsageError for an engine that would
        not use them)."""
        from dpsynth.data.engines import check_workers, parse_engine, with_tls

        choice = parse_engine(recorded or "memory")
        check_workers(self.workers, choice)
        return with_tls(choice, *self.tls)

    @property
    def flagged(self) -> bool:
        """Whether any option that only a table takes was given."""
        released = self.schema_epsilon is not None or self.class_weights_epsilon is not None
        return self.schema is not None or self.schema_public or released


@dataclass(frozen=True)
class PrivacyOptions:
    """The guarantee: ε, the data set's total budget after this run (a number or "inf", held
    as a float; None only on resume), δ (None: the default for N), and for a table the column
    naming a person with the most rows one person keeps (public; the guarantee is then per
    person). `privacy_seed` fixes the secret of the DP randomness, for tests only."""

    epsilon: float | None = None
    delta: float | None = None
    privacy_unit: str | None = None
    max_rows_per_unit: int | None = None
    privacy_seed: int | None = None

    def __post_init__(self) -> None:
        if self.epsilon is not None:
            _set(self, "epsilon", parse_epsilon(self.epsilon))

    @property
    def target_epsilon(self) -> float:
        """The ε of a new run (math.inf: the non-private baseline)."""
        return math.inf if self.epsilon is None else float(self.epsilon)


@dataclass(frozen=True)
class BackendOptions:
    """What trains: the method (or `auto`), its preset (or `auto`), preset values by name
    (`--set key=value`), and the seed of public randomness (initialisation, the preview)."""

    method: str | None = None
    preset: str = "auto"
    overrides: Mapping[str, Any] = field(default_factory=dict)
    seed: int = 0

    def __post_init__(self) -> None:
        _set(self, "overrides", dict(self.overrides or {}))
        if not -(2**63) <= self.seed < 2**63:
            raise UsageError(f"{{seed}} must fit in 64 bits, got {self.seed}", parameter="seed")


@dataclass(frozen=True)
class RunOptions:
    """Where and how it runs: the run directory, the ledger (None only on resume: the run's
    recorded one), whether to resume, the device (resolved here, once, into `torch_device`),
    seconds between checkpoints, whether to log the private losses; `stop_after_steps` ends
    the loop early as an interruption would, for tests only."""

    out: Path | str
    ledger: Path | str | None = None
    resume: bool = False
    device: str = "auto"
    checkpoint_every_s: float = 120.0
    log_private_loss: bool = False
    stop_after_steps: int | None = None
    torch_device: torch.device = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _set(self, "torch_device", resolve_device(self.device))
        if not (self.checkpoint_every_s >= 0 and math.isfinite(self.checkpoint_every_s)):
            raise UsageError(
                "{checkpoint_every_s} must be a number of seconds ≥ 0, got "
                f"{self.checkpoint_every_s}",
                parameter="checkpoint_every_s",
            )


_PARTS = {
    "input": InputOptions,
    "images": ImageOptions,
    "table": TableOptions,
    "privacy": PrivacyOptions,
    "backend": BackendOptions,
    "run": RunOptions,
}
# Every keyword of `TrainRequest.build`, with the part that holds it (one name per concept).
FIELDS: dict[str, str] = {
    f.name: part for part, cls in _PARTS.items() for f in fields(cls) if f.init
}
_TABLE_FLAGS = ("schema", "schema_public", "schema_epsilon", "class_weights_epsilon")
# Fields for tests only (a known secret voids the guarantee; an early stop leaves the run's
# spend reserved): keywords of `dpsynth.train`, never options of `dpsynth train`.
TEST_ONLY = ("privacy_seed", "stop_after_steps")


@dataclass(frozen=True)
class TrainRequest:
    """Everything one `train` needs, in typed parts, built and checked once (`build` from flat
    keywords), before anything is read or written.

    A new run needs `method`, `data`, `epsilon` and `ledger`; `resume=True` needs only `out`
    (the run's recorded settings are used, and its recorded ledger when `ledger` is None).
    """

    run: RunOptions
    input: InputOptions = field(default_factory=InputOptions)
    images: ImageOptions = field(default_factory=ImageOptions)
    table: TableOptions = field(default_factory=TableOptions)
    privacy: PrivacyOptions = field(default_factory=PrivacyOptions)
    backend: BackendOptions = field(default_factory=BackendOptions)

    @classmethod
    def build(cls, **keywords: Any) -> TrainRequest:
        """The request from its fields by name (`FIELDS`), each given to its part."""
        unknown = sorted(set(keywords) - set(FIELDS))
        if unknown:
            raise TypeError(f"unknown training parameter(s): {', '.join(unknown)}")
        grouped: dict[str, dict[str, Any]] = {part: {} for part in _PARTS}
        for name, value in keywords.items():
            grouped[FIELDS[name]][name] = value
        if "out" not in grouped["run"]:
            raise TypeError("a training request needs out (the run directory)")
        parts = {part: _PARTS[part](**values) for part, values in grouped.items()}
        return cls(**parts)

    def __post_init__(self) -> None:
        self.validate()

    @property
    def target_epsilon(self) -> float:
        """The ε of a new run (math.inf: the non-private baseline)."""
        return self.privacy.target_epsilon

    @staticmethod
    def check_complete(
        *, resume: bool, method: str | None, data: object, epsilon: float | str | None
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
        """UsageError (exit 2) for what concerns several parts (each part checked its own
        fields when it was built); run when the request is built."""
        data = self.input.data
        self.check_complete(
            resume=self.run.resume,
            method=self.backend.method,
            data=data,
            epsilon=self.privacy.epsilon,
        )
        if self.run.resume:  # workers and credentials: checked against the recorded engine
            return
        if self.run.ledger is None:
            raise UsageError("a new run needs a ledger path")
        if self.table.engine.name == "auto":
            from dpsynth.data.engines import with_tls

            with_tls(self.table.engine, *self.table.tls)  # credentials need dask+tls://
        from dpsynth.data.sources import is_table_spec

        if self.images.public is not None and data is not None and is_table_spec(data):
            raise UsageError(
                "{public} takes images to pretrain on; {data} is a table",
                parameters=("public", "data"),
            )
        from dpsynth.training.table_units import unit_bound

        privacy = self.privacy
        unit = unit_bound(privacy.privacy_unit, privacy.max_rows_per_unit)  # both or neither
        if data is not None and (self.table.flagged or unit is not None):
            if unit is not None and not is_table_spec(data):
                from dpsynth.training.image_units import check_image_unit

                check_image_unit(data, unit.column, unit.max_rows)
            elif not is_table_spec(data):
                raise UsageError(
                    "{schema}, {schema_public}, {schema_epsilon} and "
                    "{class_weights_epsilon} are for tables",
                    parameters=_TABLE_FLAGS,
                )
        if self.table.workers is not None and data is not None and not is_table_spec(data):
            raise UsageError(
                "{workers} sets the processes that count a table out of core; {data} is images",
                parameters=("workers", "data"),
            )
        for name, value in (
            ("schema_epsilon", self.table.schema_epsilon),
            ("class_weights_epsilon", self.table.class_weights_epsilon),
        ):
            if value is not None and not (math.isfinite(value) and value > 0):
                raise UsageError(
                    f"{{{name}}} must be a positive number, got {value}", parameter=name
                )
