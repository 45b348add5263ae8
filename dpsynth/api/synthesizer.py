"""`Synthesizer`: fit a generator on a pandas DataFrame (or a data spec) and sample from it.

    synth = Synthesizer.create("mst", epsilon=1.0, ledger="ledger.jsonl")
    synth.fit(frame, schema="schema.json")
    rows = synth.sample(1000)          # a pandas DataFrame with the schema's columns

The DataFrame is trained on in memory, through the same path as `dpsynth train`: the same
checks, the spend reserved in the ledger before the first read, the same accountant. It is read
as its Arrow table, the way a Parquet file of it would be (`dpsynth.data.frames`); nothing of it
is written to disk. `sample(n)` draws in memory too and records the release in the ledger as
`dpsynth sample` does. Images work the same way with a data spec (`fit("mnist-5k")`,
`fit("folder:DIR")`, or a `Path`), and `sample(n)` returns an `ImageBatch` (uint8 images
[n, C, H, W], their labels and the class names).
"""

from __future__ import annotations

import shutil
import tempfile
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dpsynth.api.pipeline import train
from dpsynth.api.results import ImageBatch, TrainResult
from dpsynth.errors import UsageError

if TYPE_CHECKING:
    import pandas as pd

    from dpsynth.data.schema import Schema


@dataclass(frozen=True)
class PrivacySpend:
    """What a fit spent: `epsilon`, the proven bound of the training spend at `delta` (inf:
    not private); `dataset_total_epsilon`, every spend on the data in the ledger composed (a
    schema or class-weights release included); the ledger and the spend's seq in it."""

    private: bool
    epsilon: float
    delta: float
    dataset_total_epsilon: float | None
    ledger: Path | None
    ledger_seq: int | None

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict ("inf" for an infinite ε)."""
        return {
            "private": self.private,
            "epsilon": _json_eps(self.epsilon),
            "delta": self.delta,
            "dataset_total_epsilon": _json_eps(self.dataset_total_epsilon),
            "ledger": None if self.ledger is None else str(self.ledger),
            "ledger_seq": self.ledger_seq,
        }


def _json_eps(value: float | None) -> float | str | None:
    return "inf" if value == float("inf") else value


class Synthesizer:
    """A generator fitted under DP, DataFrame in and DataFrame out for tables.

    Build one with `Synthesizer.create(method, epsilon=..., ...)`; `fit` trains it (one ledger
    spend), `sample(n)` draws records (no privacy cost), `privacy` says what the fit spent and
    `result` is the full `TrainResult`. Without `out`, the run directory is a private temporary
    folder removed when the synthesizer is garbage-collected.
    """

    def __init__(
        self,
        method: str,
        *,
        epsilon: float | str,
        delta: float | None = None,
        preset: str = "auto",
        ledger: Path | str | None = None,
        out: Path | str | None = None,
        dataset_id: str | None = None,
        device: str = "auto",
        seed: int = 0,
        overrides: Mapping[str, Any] | None = None,
        schema_public: bool = False,
        schema_epsilon: float | None = None,
        class_weights_epsilon: float | None = None,
        privacy_unit: str | None = None,
        max_rows_per_unit: int | None = None,
    ) -> None:
        self.method = method
        self.options: dict[str, Any] = {
            "epsilon": epsilon, "delta": delta, "preset": preset, "ledger": ledger,
            "dataset_id": dataset_id, "device": device, "seed": seed,
            "overrides": dict(overrides or {}), "class_weights_epsilon": class_weights_epsilon,
        }  # fmt: skip
        if privacy_unit is not None or max_rows_per_unit is not None:
            self.options["privacy_unit"] = privacy_unit
            self.options["max_rows_per_unit"] = max_rows_per_unit
        self.schema_public = schema_public
        self.schema_epsilon = schema_epsilon
        self._out = None if out is None else Path(out)
        self._result: TrainResult | None = None
        self._table = False
        self._columns: tuple[str, ...] = ()

    @classmethod
    def create(cls, method: str, *, epsilon: float | str, **options: Any) -> Synthesizer:
        """A synthesizer of the backend `method` ("mst", "aim", "dpkernel", ... for tables;
        "pge", "dpkernel", ... for images; "auto") for a total budget `epsilon` on the data.

        Options: `delta`, `preset`, `ledger` (default: $DPSYNTH_LEDGER, else
        ./dpsynth-ledger.jsonl), `out` (the run directory to keep), `dataset_id` (the ledger's
        id of the data; default "dataframe" for a DataFrame), `device`, `seed` (public
        randomness only), `overrides` (preset values), and for tables `schema_public`,
        `schema_epsilon`, `class_weights_epsilon` (see `fit`), `privacy_unit` and
        `max_rows_per_unit` (the column naming a person and the most rows one keeps: the
        guarantee is then per person).
        """
        return cls(method, epsilon=epsilon, **options)

    @property
    def result(self) -> TrainResult:
        """The fit's `TrainResult` (UsageError before `fit`)."""
        if self._result is None:
            raise UsageError("this synthesizer is not fitted yet: call fit(data) first")
        return self._result

    @property
    def privacy(self) -> PrivacySpend:
        """What the fit spent, as the ledger records it (UsageError before `fit`)."""
        result = self.result
        return PrivacySpend(
            private=result.private,
            epsilon=result.epsilon,
            delta=result.delta,
            dataset_total_epsilon=result.dataset_total_epsilon,
            ledger=result.ledger,
            ledger_seq=result.ledger_seq,
        )

    def fit(
        self,
        data: pd.DataFrame | Path | str,
        *,
        schema: Schema | Mapping[str, Any] | Path | str | None = None,
        target: str | None = None,
        schema_public: bool | None = None,
        schema_epsilon: float | None = None,
    ) -> Synthesizer:
        """Train on `data`: a pandas DataFrame (a table, trained on in memory), a path (a CSV
        or Parquet file, an NPZ, an image folder) or a data spec ("mnist-5k", "folder:DIR",
        "csv:FILE", "german-credit", ...). Returns the synthesizer.

        A table needs its public `schema` (a `Schema`, its JSON as a dict, or a file). A
        DataFrame without one is refused unless its entries read off the data are released
        with DP (`schema_epsilon=E`, part of ε) or declared public (`schema_public=True`,
        your statement): the schema is then drafted from the frame with `target` (default:
        the last column) as the label. A built-in table uses its bundled schema.
        """
        from dpsynth.data.frames import FRAME, is_frame
        from dpsynth.data.sources import is_table_spec

        if self._result is not None:
            raise UsageError("this synthesizer is already fitted; create another to fit again")
        public = self.schema_public if schema_public is None else schema_public
        released = self.schema_epsilon if schema_epsilon is None else schema_epsilon
        in_memory = is_frame(data)
        if not (isinstance(data, str | Path) or in_memory):
            raise UsageError(
                "{data} must be a pandas DataFrame, a path or a data spec string",
                parameter="data",
            )
        self._table = is_table_spec(data)
        if not self._table and schema is not None:
            raise UsageError("{schema} is for tables; the data is images", parameter="schema")
        if in_memory:
            self._columns = tuple(str(c) for c in data.columns)  # type: ignore[union-attr]
            if schema is None:
                schema = _drafted_schema(data, target, public, released)
        options = dict(self.options)
        if in_memory:
            options["dataset_id"] = options["dataset_id"] or FRAME
        if self._table:
            options |= {"schema": schema, "schema_public": public, "schema_epsilon": released}
        result = train(method=self.method, data=data, out=self._run_dir(), **options)
        if result is None:
            raise UsageError("a Synthesizer fits in one process, not under torchrun")
        self._result = result
        return self

    def sample(self, n: int, *, labels: str = "auto", seed: int = 0) -> pd.DataFrame | ImageBatch:
        """`n` synthetic records, drawn in memory (post-processing: no privacy cost; the
        release is recorded in the ledger). A table: a pandas DataFrame with the schema's
        columns, typed by the schema (identifiers fresh surrogate keys). Images: an
        `ImageBatch` (uint8 [n, C, H, W], int64 labels into its `classes`). `labels` as for
        `dpsynth sample --labels`."""
        from dpsynth.sampling.images import sample_images_array
        from dpsynth.sampling.options import SampleOptions
        from dpsynth.sampling.table import sample_table_frame

        result = self.result
        opts = SampleOptions(
            labels=labels, seed=seed, device=self.options["device"], ledger_path=result.ledger
        )
        if self._table:
            if n < 1:
                raise UsageError(f"{{n}} must be at least 1, got {n}", parameter="n")
            rows, _ = sample_table_frame(result.run_dir, n, opts)
            return rows
        images, image_labels, classes, manifest = sample_images_array(result.run_dir, n, opts)
        return ImageBatch(images, image_labels, tuple(classes), manifest)

    def _run_dir(self) -> Path:
        """The run directory: `out`, else a private temporary one kept while `self` lives."""
        if self._out is not None:
            return self._out
        holder = Path(tempfile.mkdtemp(prefix="dpsynth-run-"))
        weakref.finalize(self, shutil.rmtree, holder, True)
        return holder / "run"


def _drafted_schema(
    frame: pd.DataFrame, target: str | None, public: bool, released: float | None
) -> Schema:
    """A schema drafted from the frame (as `dpsynth data schema`), every entry read off the
    data marked so: `train` then releases it with DP or takes the user's declaration. Refused
    (before any spend) when neither is asked for."""
    from dpsynth.data.frames import read_frame
    from dpsynth.data.schema_draft import draft_table

    if not public and released is None:
        raise UsageError(
            "a DataFrame needs its public {schema}; without one, pass {schema_epsilon}=E to "
            "release the schema read off the data with DP (part of epsilon) or "
            "{schema_public}=True to declare it public",
            parameters=("schema", "schema_epsilon", "schema_public"),
        )
    raw = read_frame(frame)
    drafted, _ = draft_table(raw.header, raw.columns, target or raw.header[-1])
    return drafted
