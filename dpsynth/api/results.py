"""The typed results of the Python API: frozen dataclasses built from what the engines return.

Each result keeps the engine's JSON-ready summary (`to_json()` returns it: the same document as
the command's `--json`) and lifts out the fields a researcher reads: the ε bound spent and δ,
the run directory and the files written, the metrics. An ε is always the accountant's proven
upper bound as the engine reported it (`inf` for a run that is not private), never an estimate.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    import torch


def _epsilon(value: Any) -> float:
    """An ε as the engines write it (a number, or "inf" for no privacy) as a float."""
    return math.inf if value is None or value == "inf" else float(value)


def _optional_float(value: Any) -> float | None:
    return None if value is None else float(value)


def _path(value: Any) -> Path | None:
    return None if value in (None, "") else Path(str(value))


@dataclass(frozen=True)
class _Result:
    """What every result shares: the engine's summary, returned by `to_json()`."""

    summary: Mapping[str, Any] = field(repr=False, compare=False, kw_only=True)

    def to_json(self) -> dict[str, Any]:
        """The JSON-ready summary (what the command prints with `--json`)."""
        return copy.deepcopy(dict(self.summary))


@dataclass(frozen=True)
class TrainResult(_Result):
    """A trained run: where it is, what it spent, and how far it got.

    `epsilon` is the proven bound of this run's spend at `delta` (inf: not private);
    `dataset_total_epsilon` the bound of every spend on the data set composed, this one
    included. `ledger_seq` is the run's spend in `ledger`.
    """

    run_dir: Path
    run_id: str
    method: str
    preset: str
    dataset_id: str
    private: bool
    epsilon: float
    delta: float
    dataset_total_epsilon: float | None
    steps: int
    total_steps: int
    # σ of the loop's clipped Gaussian sum; None for a plan without one (mst, aim), whose
    # noise `mechanisms` lists
    noise_multiplier: float | None
    sampling_rate: float
    accountant: str
    ledger: Path | None
    ledger_seq: int | None
    ledger_status: str | None
    privacy_label: str | None = None
    preview: Path | None = None
    warnings: tuple[str, ...] = ()
    # what the plan applies, one line per mechanism
    mechanisms: tuple[str, ...] = ()

    @property
    def finished(self) -> bool:
        """True once the run has taken every step of its plan."""
        return self.steps >= self.total_steps

    @classmethod
    def from_summary(cls, summary: Mapping[str, Any], ledger: Path | None) -> TrainResult:
        """The result of `training.train`'s summary (and the ledger it was charged to)."""
        total = summary.get("dataset_total_epsilon")
        return cls(
            run_dir=Path(summary["run"]),
            run_id=str(summary.get("run_id", "")),
            method=str(summary["method"]),
            preset=str(summary["preset"]),
            dataset_id=str(summary.get("dataset_id", "")),
            private=bool(summary["private"]),
            epsilon=_epsilon(summary["epsilon"]),
            delta=float(summary["delta"]),
            dataset_total_epsilon=None if total is None else _epsilon(total),
            steps=int(summary["steps"]),
            total_steps=int(summary["total_steps"]),
            noise_multiplier=_optional_float(summary.get("noise_multiplier")),
            sampling_rate=float(summary["sampling_rate"]),
            accountant=str(summary["accountant"]),
            ledger=ledger,
            ledger_seq=summary.get("ledger_seq"),
            ledger_status=summary.get("ledger_status"),
            privacy_label=summary.get("privacy_label"),
            preview=_path(summary.get("preview")),
            warnings=tuple(summary.get("warnings") or ()),
            mechanisms=tuple(summary.get("mechanisms") or ()),
            summary=summary,
        )


@dataclass(frozen=True)
class SampleResult(_Result):
    """Synthetic records written from a run (post-processing: no privacy cost).

    `out` is the folder (images: PNG class folders or `samples.npz`) or the table's file (CSV
    or Parquet); `manifest` its manifest. `privacy` is the run's statement as the ledger
    anchors it, `epsilon` and `delta` its spend's bound; `release_seq` the zero-cost release
    recorded in the ledger for this output.
    """

    out: Path
    manifest: Path
    modality: str
    n: int
    format: str
    private: bool
    privacy: str
    epsilon: float
    delta: float
    output_sha256: str
    label_counts: tuple[int, ...]
    release_seq: int | None = None
    partial: bool = False

    @classmethod
    def from_summary(cls, summary: Mapping[str, Any]) -> SampleResult:
        """The result of `sampling.sample_run`'s summary."""
        source = summary.get("privacy_source") or {}
        out = Path(summary["out"])
        manifest = _path(summary.get("manifest")) or out / "manifest.json"
        training = summary.get("training") or {}
        release = summary.get("ledger") or {}
        return cls(
            out=out,
            manifest=manifest,
            modality=str(summary.get("modality") or "image"),
            n=int(summary["n"]),
            format=str(summary["format"]),
            private=bool(summary.get("private")),
            privacy=str(summary.get("privacy") or ""),
            epsilon=_epsilon(source.get("epsilon")),
            delta=float(source.get("delta") or 0.0),
            output_sha256=str(summary["output_sha256"]),
            label_counts=tuple(int(c) for c in summary.get("label_counts") or ()),
            release_seq=release.get("seq") if isinstance(release, Mapping) else None,
            partial=bool(training.get("partial")) if isinstance(training, Mapping) else False,
            summary=summary,
        )


@dataclass(frozen=True, eq=False)
class ImageBatch:
    """Synthetic images in memory (`Synthesizer.sample` of an image run): `images` uint8
    [N, C, H, W], `labels` int64 [N] (indices into `classes`), the class names, and the
    release's manifest (its SHA-256 and ledger entry: a zero-cost release)."""

    images: np.ndarray
    labels: np.ndarray
    classes: tuple[str, ...]
    manifest: Mapping[str, Any] = field(repr=False)

    def __len__(self) -> int:
        return int(self.images.shape[0])

    @property
    def label_names(self) -> list[str]:
        """Each image's class name."""
        return [self.classes[i] for i in self.labels.tolist()]

    def to_torch(self, scale: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """(images, labels) as torch tensors, for a DataLoader: float32 in [0, 1] when
        `scale`, else the uint8 values."""
        import torch

        images = torch.from_numpy(self.images)
        return (images.float() / 255.0 if scale else images), torch.from_numpy(self.labels)


@dataclass(frozen=True)
class EvaluationReport(_Result):
    """Synthetic data scored against held-out real data.

    `metrics` is the engine's metrics as measured (images: `fid`, `precision`, `recall`,
    `accuracy`; tables: `classifiers`, `marginals`); `non_private` is True when the real data
    was data a DP run in the ledger spent budget on (the scores are then not private).
    """

    modality: str
    synthetic: str
    real: str
    metrics: Mapping[str, Any]
    non_private: bool
    report_dir: Path | None
    privacy: Any = None
    warnings: tuple[str, ...] = ()

    @classmethod
    def from_summary(cls, summary: Mapping[str, Any], real: str) -> EvaluationReport:
        """The report of `evaluate.report.run_evaluation`'s summary."""
        return cls(
            modality=str(summary.get("modality") or "image"),
            synthetic=str(summary.get("synthetic") or ""),
            real=str(summary.get("real") or real),
            metrics=copy.deepcopy(dict(summary.get("metrics") or {})),
            non_private=bool(summary.get("non_private")),
            report_dir=_path(summary.get("report_dir")),
            privacy=summary.get("privacy"),
            warnings=tuple(summary.get("warnings") or ()),
            summary=summary,
        )


@dataclass(frozen=True)
class CalibrationResult(_Result):
    """The noise for a target (ε, δ), the ε of a given noise, or the most steps that fit.

    `mode` says which was asked ("noise_multiplier", "epsilon" or "max_steps"). `epsilon` is
    the proven bound of this run alone, `total_epsilon` with the data set's earlier spends in
    the ledger composed in (`prior_epsilon` of them, from `prior_events` counting events);
    `budget` the data set's cap, if any.
    """

    mode: str
    noise_multiplier: float
    steps: int
    sampling_rate: float
    delta: float
    epsilon: float
    prior_epsilon: float
    total_epsilon: float
    accountant: str
    dataset: str | None = None
    budget: Mapping[str, float] | None = None
    prior_events: int = 0
    notes: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()

    @classmethod
    def from_summary(cls, summary: Mapping[str, Any], prior_events: int = 0) -> CalibrationResult:
        """The result of a calibration's JSON document (and how many earlier events of the
        data set were composed in)."""
        return cls(
            mode=str(summary["mode"]),
            noise_multiplier=float(summary["noise_multiplier"]),
            steps=int(summary["steps"]),
            sampling_rate=float(summary["sampling_rate"]),
            delta=float(summary["delta"]),
            epsilon=_epsilon(summary["epsilon"]),
            prior_epsilon=_epsilon(summary.get("prior_epsilon", 0.0)),
            total_epsilon=_epsilon(summary["total_epsilon"]),
            accountant=str(summary["accountant"]),
            dataset=summary.get("dataset"),
            budget=summary.get("budget"),
            prior_events=prior_events,
            notes=tuple(summary.get("notes") or ()),
            warnings=tuple(summary.get("warnings") or ()),
            summary=summary,
        )
