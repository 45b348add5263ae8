"""`Synthesizer`: fit a generator on a pandas DataFrame (or a data spec) and sample from it.

    synth = Synthesizer.create("mst", epsilon=1.0, ledger="ledger.jsonl")
    synth.fit(frame, schema="schema.json")
    rows = synth.sample(1000)          # a pandas DataFrame with the schema's columns

The DataFrame is written to a CSV file in a private temporary folder (mode 0700, removed as
soon as training ends) and trained on through the same path as `dpsynth train --data
csv:FILE`: the same checks, the spend reserved in the ledger before the first read, the same
accountant. Sampling goes through `dpsynth sample` into another private temporary file that is
read back and removed; the release is recorded in the ledger as for the command. Images work
the same way with a data spec (`fit("mnist-5k")`, `fit("folder:DIR")`), and `sample(n)` returns
uint8 records [n, C, H, W] and their labels.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dpsynth.api.pipeline import sample as sample_run
from dpsynth.api.pipeline import train
from dpsynth.api.results import TrainResult
from dpsynth.errors import UsageError

if TYPE_CHECKING:
    import numpy as np
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
        data: pd.DataFrame | str,
        *,
        schema: Schema | Mapping[str, Any] | Path | str | None = None,
        target: str | None = None,
        schema_public: bool | None = None,
        schema_epsilon: float | None = None,
    ) -> Synthesizer:
        """Train on `data`: a pandas DataFrame (a table) or a data spec ("mnist-5k",
        "folder:DIR", "csv:FILE", "german-credit", ...). Returns the synthesizer.

        A table needs its public `schema` (a `Schema`, its JSON as a dict, or a file). A
        DataFrame without one is refused unless its entries read off the data are released
        with DP (`schema_epsilon=E`, part of ε) or declared public (`schema_public=True`,
        your statement): the schema is then drafted from the frame with `target` (default:
        the last column) as the label. A built-in table uses its bundled schema.
        """
        if self._result is not None:
            raise UsageError("this synthesizer is already fitted; create another to fit again")
        public = self.schema_public if schema_public is None else schema_public
        released = self.schema_epsilon if schema_epsilon is None else schema_epsilon
        private_dir = Path(tempfile.mkdtemp(prefix="dpsynth-fit-"))  # mode 0700
        try:
            spec, schema_path, dataset_id = self._prepare(
                data, schema, target, public, released, private_dir
            )
            table_options = (
                {"schema": schema_path, "schema_public": public, "schema_epsilon": released}
                if self._table
                else {}
            )
            options = dict(self.options)
            options["dataset_id"] = options["dataset_id"] or dataset_id
            result = train(
                method=self.method, data=spec, out=self._run_dir(), **options, **table_options
            )
            if result is None:
                raise UsageError("a Synthesizer fits in one process, not under torchrun")
            self._result = result
        finally:
            shutil.rmtree(private_dir, ignore_errors=True)  # the frame's private copy
        return self

    def sample(
        self, n: int, *, labels: str = "auto", seed: int = 0
    ) -> pd.DataFrame | tuple[np.ndarray, np.ndarray]:
        """`n` synthetic records (post-processing: no privacy cost; the release is recorded in
        the ledger). A table: a pandas DataFrame with the schema's columns, identifiers fresh
        surrogate keys. Images: uint8 records [n, C, H, W] and their int64 labels (indices
        into the run's classes). `labels` as for `dpsynth sample --labels`."""
        result = self.result
        scratch = Path(tempfile.mkdtemp(prefix="dpsynth-sample-"))
        try:
            if self._table:
                import pandas as pd

                path = scratch / "rows.csv"
                sample_run(
                    result.run_dir, n, path, labels=labels, seed=seed, ledger=result.ledger,
                    device=self.options["device"],
                )  # fmt: skip
                # Cells as written: an empty cell is missing, "NA" and the like stay text.
                return pd.read_csv(path, keep_default_na=False, na_values=[""])
            import numpy as np

            out = scratch / "images"
            sample_run(
                result.run_dir, n, out, fmt="npz", labels=labels, seed=seed,
                ledger=result.ledger, device=self.options["device"],
            )  # fmt: skip
            with np.load(out / "samples.npz", allow_pickle=False) as archive:
                return archive["x"], archive["y"]
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def _run_dir(self) -> Path:
        """The run directory: `out`, else a private temporary one kept while `self` lives."""
        if self._out is not None:
            return self._out
        holder = Path(tempfile.mkdtemp(prefix="dpsynth-run-"))
        weakref.finalize(self, shutil.rmtree, holder, True)
        return holder / "run"

    def _prepare(
        self,
        data: Any,
        schema: Any,
        target: str | None,
        public: bool,
        released: float | None,
        private_dir: Path,
    ) -> tuple[str, Path | None, str | None]:
        """The data spec to train on, the schema file (tables) and the default dataset id."""
        from dpsynth.data.sources import is_table_spec

        if isinstance(data, str):
            self._table = is_table_spec(data)
            if not self._table and schema is not None:
                raise UsageError("{schema} is for tables; the data is images", parameter="schema")
            return data, self._schema_file(schema, private_dir), None
        if not hasattr(data, "to_csv") or not hasattr(data, "columns"):
            raise UsageError(
                "{data} must be a pandas DataFrame or a data spec string", parameter="data"
            )
        self._table = True
        self._columns = tuple(str(c) for c in data.columns)
        path = private_dir / "data.csv"
        data.to_csv(path, index=False)
        spec = f"csv:{path}"
        schema_path = self._schema_file(schema, private_dir)
        if schema_path is None:
            if not public and released is None:
                raise UsageError(
                    "a DataFrame needs its public {schema}; without one, pass "
                    "{schema_epsilon}=E to release the schema read off the data with DP "
                    "(part of epsilon) or {schema_public}=True to declare it public",
                    parameters=("schema", "schema_epsilon", "schema_public"),
                )
            schema_path = _drafted_schema(spec, target, private_dir)
        return spec, schema_path, "dataframe"

    @staticmethod
    def _schema_file(schema: Any, private_dir: Path) -> Path | None:
        """The schema as a file train reads: a path as given, a `Schema` or dict written out."""
        if schema is None or isinstance(schema, str | Path):
            return None if schema is None else Path(schema)
        obj = schema.to_json() if hasattr(schema, "to_json") else schema
        if not isinstance(obj, Mapping):
            raise UsageError(
                "{schema} must be a Schema, its JSON as a dict, or a file", parameter="schema"
            )
        path = private_dir / "schema.json"
        path.write_text(json.dumps(obj), encoding="utf-8")
        return path


def _drafted_schema(spec: str, target: str | None, private_dir: Path) -> Path:
    """A schema drafted from the table (as `dpsynth data schema`), every entry read off the
    data marked so: `train` then releases it with DP or takes the user's declaration."""
    from dpsynth.data.schema_draft import draft_table
    from dpsynth.data.sources import read_table

    raw, _, _ = read_table(spec)
    drafted, _ = draft_table(raw.header, raw.columns, target or raw.header[-1])
    path = private_dir / "schema.json"
    path.write_text(json.dumps(drafted.to_json()), encoding="utf-8")
    return path
