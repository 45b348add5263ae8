"""`train`, `sample`, `evaluate` and `audit` from Python: the engines the CLI runs, with keyword
arguments named as the command's options and typed results.

Nothing here adds to the engines: the same checks run, the same ledger entries are written
(the spend reserved before any record is read, the zero-cost releases of samples and reports),
and every ε reported is the accountant's proven bound.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dpsynth.api.results import EvaluationReport, SampleResult, TrainResult

if TYPE_CHECKING:
    import pandas as pd

    from dpsynth.auditing.planned_audit import AuditResult
    from dpsynth.data.schema import Schema
    from dpsynth.training import ProgressCallback, TrainRequest


def _ledger(ledger: Path | str | None) -> Path:
    """The ledger given, or the default ($DPSYNTH_LEDGER, else ./dpsynth-ledger.jsonl)."""
    from dpsynth.ledger import default_ledger_path

    return Path(ledger) if ledger is not None else default_ledger_path()


def _classes(classes: Sequence[str] | str | None) -> tuple[str, ...] | None:
    """A label set given as a sequence or as "a,b,c"."""
    if classes is None or not isinstance(classes, str):
        return None if classes is None else tuple(classes)
    from dpsynth.data.sources import parse_classes

    return parse_classes(classes)


def train(
    *,
    method: str | None,
    data: str | Path | pd.DataFrame | None,
    epsilon: float | str | None,
    out: Path | str,
    delta: float | None = None,
    preset: str = "auto",
    ledger: Path | str | None = None,
    device: str = "auto",
    seed: int = 0,
    resume: bool = False,
    overrides: Mapping[str, Any] | None = None,
    dataset_id: str | None = None,
    public_size: int | None = None,
    image_size: int | None = None,
    channels: int | None = None,
    classes: Sequence[str] | str | None = None,
    public: str | None = None,
    schema: Path | str | Schema | Mapping[str, Any] | None = None,
    schema_public: bool = False,
    schema_epsilon: float | None = None,
    class_weights_epsilon: float | None = None,
    engine: str = "auto",
    memory_budget: int | str | None = None,
    workers: int | None = None,
    tls_ca_file: Path | str | None = None,
    tls_cert: Path | str | None = None,
    tls_key: Path | str | None = None,
    privacy_unit: str | None = None,
    max_rows_per_unit: int | None = None,
    checkpoint_every_s: float = 120.0,
    log_private_loss: bool = False,
    stop_after_steps: int | None = None,
    privacy_seed: int | None = None,
    progress: ProgressCallback | None = None,
) -> TrainResult | None:
    """Train `method` on `data` under (ε, δ)-DP into the run directory `out`.

    `epsilon` is the data set's total budget after this run ("inf": not private); the spend is
    reserved in `ledger` (default: $DPSYNTH_LEDGER, else ./dpsynth-ledger.jsonl; with
    `resume` and no ledger, the run's recorded one) before any record is read. `overrides`
    are preset values by name (`dpsynth train --set`). The other keywords are the command's
    options by name (`dpsynth.training.TrainRequest`'s fields). `data` is a spec, a path, or a
    pandas DataFrame (a table, trained on in memory). For tables `schema` (a file, a `Schema` or
    its JSON as a dict) and, for its entries read off the data, `schema_public=True` or a DP
    release costing `schema_epsilon`, `class_weights_epsilon`, `engine`, `memory_budget` (bytes,
    or "4G"), `workers` (the out-of-core engines' counting processes, or the Dask tasks in
    flight; the release does not depend on it), `tls_ca_file`, `tls_cert` and `tls_key` (the
    client credentials of `engine="dask+tls://HOST:PORT"`; default: Dask's configuration), and
    a privacy unit (`privacy_unit="subject_id"`, `max_rows_per_unit=3`: the
    guarantee is then per person with at most that many rows, not per row); for images
    `image_size`, `channels`, `classes` ("a,b,c" or a sequence) and `public`; and `dataset_id`,
    `public_size`, `checkpoint_every_s`, `log_private_loss`. `stop_after_steps` and
    `privacy_seed` are for tests only (an early stop leaves the spend reserved; a known secret
    voids the guarantee), never `dpsynth train` options.
    Raises `UsageError` (naming the parameter) before anything is written for a bad request,
    `BudgetExceededError` when the ledger's cap would be passed, `DataError` for bad data.
    Under torchrun every rank calls it; ranks other than 0 get None.
    """
    # The keywords are the request's fields by name (tests/training/test_request_surface.py).
    keywords = dict(locals())
    from dpsynth.training import TrainRequest

    del keywords["progress"]
    keywords["ledger"] = None if resume and ledger is None else _ledger(ledger)
    return train_request(TrainRequest.build(**keywords), progress)


def train_request(
    request: TrainRequest, progress: ProgressCallback | None = None
) -> TrainResult | None:
    """Run a built `TrainRequest` (what `train` and `dpsynth train` do) as a `TrainResult`;
    None on a torchrun rank other than 0 (rank 0 holds the run's result)."""
    from dpsynth.training import train as run_training

    summary = run_training(request, progress)
    if "run" not in summary:  # another torchrun rank's short summary
        return None
    ledger = _recorded_ledger(request, summary)
    return TrainResult.from_summary(summary, ledger)


def _recorded_ledger(request: TrainRequest, summary: Mapping[str, Any]) -> Path | None:
    """The ledger the run is charged to: the request's, else the one the run recorded."""
    if request.run.ledger is not None:
        return Path(request.run.ledger)
    from dpsynth.errors import DpsynthError
    from dpsynth.rundir import RunDir
    from dpsynth.training.resume import recorded_ledger

    try:
        return Path(recorded_ledger(RunDir(summary["run"])))
    except DpsynthError:  # the run trained; only the path is unknown
        return None


def sample(
    run: Path | str,
    n: int,
    out: Path | str,
    *,
    fmt: str | None = None,
    labels: str = "auto",
    batch_size: int | None = None,
    seed: int = 0,
    truncation: float | None = None,
    force: bool = False,
    partial: bool = False,
    device: str = "auto",
    ledger: Path | str | None = None,
    progress: Callable[[int, int], None] | None = None,
    partitions: int | None = None,
    workers: int | None = None,
    on_partition: Callable[[int, int, int, int], None] | None = None,
) -> SampleResult:
    """Write `n` synthetic records from the trained `run` to `out` (post-processing: no
    privacy cost, recorded in the ledger as a zero-cost release with the output's SHA-256).

    Images: a folder of PNG class folders, or `fmt="npz"` for `OUT/samples.npz`; a table: a
    CSV file, or Parquet when `out` ends in `.parquet`. `labels` is auto, balanced, per-class
    counts "a,b,c", or for tables weights / model. The run's anchor in the ledger (default: the
    run's own) is checked before anything is generated. A table's `out` that is a folder (or
    `partitions`, or Parquet above a million rows) is a partitioned Parquet release written by
    `workers` processes (`on_partition(partitions done, partitions, rows done, rows)`).
    """
    from dpsynth.sampling import sample_run

    summary = sample_run(
        run, n, out, fmt=fmt, labels=labels, batch_size=batch_size, seed=seed, device=device,
        force=force, ledger_path=ledger, progress=progress, truncation=truncation,
        partial=partial, partitions=partitions, workers=workers, on_partition=on_partition,
    )  # fmt: skip
    return SampleResult.from_summary(summary)


def evaluate(
    synthetic: Path | str | pd.DataFrame,
    real: str | Path | pd.DataFrame,
    *,
    metrics: Sequence[str] | str = "auto",
    classifier: str = "cnn",
    seeds: int = 3,
    n: int | None = None,
    fid_n: int | None = None,
    report: Path | str | None = None,
    inception_weights: Path | str | None = None,
    real_train: str | Path | pd.DataFrame | None = None,
    schema: Path | str | None = None,
    classes: Sequence[str] | str | None = None,
    channels: int | None = None,
    device: str = "auto",
    ledger: Path | str | None = None,
    progress: Callable[[str, int, int], None] | None = None,
    cache_real_features: bool = False,
    **engine_options: Any,
) -> EvaluationReport:
    """Score synthetic data (a sample folder, a run directory, a table's sample file, or the
    DataFrame `Synthesizer.sample` returns) against the held-out `real` data (a spec, a path,
    or for a table a DataFrame).

    Images: `metrics` from fid, accuracy, precision, recall (FID needs the Inception weights);
    tables (`real="csv:FILE"` or a built-in table): accuracy, roc_auc, ml, marginals; "auto"
    (the default): fid and accuracy for images, ml and marginals for tables. `report`
    writes report.json/.md and figures there. `ledger` (default as for `train`) is checked for
    spends on the real data (the report then says it is not private) and receives the
    report's zero-cost release. `cache_real_features` keeps the real images' Inception features
    in the data owner's cache (`$DPSYNTH_CACHE_DIR/fid`, else `~/.cache/dpsynth/fid`; files
    0600) for the next evaluation against the same data; by default nothing is kept. Further
    `run_evaluation` options may be given by name.
    """
    from dpsynth.data.frames import is_frame
    from dpsynth.evaluation.feature_cache import caching
    from dpsynth.evaluation.report import run_evaluation

    wanted = metrics.split(",") if isinstance(metrics, str) else list(metrics)
    # Per-record features of the real (private) images: on disk only when asked for.
    with caching(cache_real_features):
        summary = run_evaluation(
            synthetic=synthetic if is_frame(synthetic) else os.fspath(synthetic),
            real=real,
            metrics=[m.strip() for m in wanted if m.strip()],
            classifier=classifier,
            seeds=seeds,
            n=n,
            fid_n=fid_n,
            report_dir=report,
            inception_weights=inception_weights,
            device=device,
            real_train=real_train,
            real_classes=_classes(classes),
            real_channels=channels,
            ledger_path=_ledger(ledger),
            progress=progress,
            schema=schema,
            **engine_options,
        )
    return EvaluationReport.from_summary(summary, real)


def audit(
    method: str,
    epsilon: float,
    *,
    preset: str = "tiny",
    canaries: int | None = None,
    runs: int = 1,
    confidence: float = 0.95,
    data: str = "digits",
    seed: int | None = None,
    **audit_options: Any,
) -> AuditResult:
    """Audit a backend's mechanism empirically (white-box): synthetic canaries through its
    planned σ, q, T and clipping, in `runs` independent runs of `canaries` each (default 5,000
    on images, 20,000 on a table), give a lower bound on ε, compared with the claimed bound
    (`AuditResult.leaks`, `.verdict`). Reads no user data and no ledger. Further
    `audit.planned_audit.run_audit` options may be given by name."""
    from dpsynth.auditing.planned_audit import run_audit

    return run_audit(
        method, preset, epsilon, canaries=canaries, confidence=confidence, data=data, seed=seed,
        runs=runs, **audit_options,
    )  # fmt: skip
