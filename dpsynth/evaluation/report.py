"""The `evaluate` command: run FID / accuracy on synthetic images against real held-out data,
and write the report (JSON, Markdown, sample grid, per-class chart, ε curve).

The real data read here is supposed to be held out from training. Its dataset id and its
fingerprint are looked up in the privacy ledger, and when a DP run spent budget on either (the
same data under another id, or the same id with a record added or removed) the result is marked
non-private: a loud warning, `non_private: true`, and the same in the ledger's release entry.
Metrics on a user's own held-out data are statistics of private records too, computed without
DP: they are listed in `non_private_contents` (not for the built-in public sets). Evaluating
synthetic data is post-processing, recorded in the ledger as a zero-cost release with the hash
of the report.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from dpsynth.data.images import ImageData
from dpsynth.errors import UsageError
from dpsynth.evaluation import downstream, fid, folders
from dpsynth.evaluation.release import (
    check_report_dir,
    record_evaluation_release,
    report_fingerprint,
    training_data_warnings,
)
from dpsynth.evaluation.render import (
    render_epsilon_curve,
    render_markdown,
    render_per_class,
    render_sample_grid,
)
from dpsynth.rundir import write_bytes_atomic
from dpsynth.training import resolve_device

METRICS = ("fid", "accuracy", "precision", "recall")
SMALL_FID_N = 2048

Progress = Callable[[str, int, int], None]


# The public seed of the `--fid-n` draw: the same images for every evaluation of a folder.
FID_SUBSET_SEED = 20_251_128


def fid_subset(images: torch.Tensor, count: int | None) -> torch.Tensor:
    """`count` of the images drawn without replacement with a fixed public seed (all of them,
    in order, when `count` is None or not smaller): a fixed-n FID of a larger release."""
    if count is None or count >= len(images):
        return images
    order = torch.randperm(len(images), generator=torch.Generator().manual_seed(FID_SUBSET_SEED))
    return images[order[:count]]


# `--metrics auto` (the default): what each modality is scored on.
AUTO_IMAGE_METRICS = ("fid", "accuracy")
AUTO_TABLE_METRICS = ("ml", "marginals")


def run_evaluation(
    *,
    synthetic: str,
    real: str,
    metrics: Sequence[str],
    classifier: str = "cnn",
    seeds: int = 3,
    n: int | None = None,
    fid_n: int | None = None,
    report_dir: str | os.PathLike[str] | None = None,
    inception_weights: str | os.PathLike[str] | None = None,
    device: str = "auto",
    real_train: str | None = None,
    real_classes: tuple[str, ...] | None = None,
    real_channels: int | None = None,
    ledger_path: str | os.PathLike[str] | None = None,
    progress: Progress | None = None,
    cnn_schedule: downstream.CnnSchedule | None = None,
    fid_batch_size: int = fid.DEFAULT_BATCH_SIZE,
    schema: str | os.PathLike[str] | None = None,
    ml_rows: int | None = None,
) -> dict:
    """Evaluate synthetic images (a sample folder or a run dir) against a real data spec.

    `metrics` is a subset of fid, accuracy, precision, recall ("auto": fid and accuracy for
    images, ml and marginals for tables). For a run dir, `n` images are
    sampled (default: as many as the real reference set). FID, precision and recall use
    `fid_n` of the synthetic images (a draw with a fixed public seed; default: all). When
    `ledger_path` is given, the real data's fingerprint is checked against the ledger's
    spends (warning when it was trained on) and a zero-cost release event with the SHA-256 of
    report.json (or of the result JSON) is appended when the synthetic data's source data set
    is known. `real_classes` and `real_channels` declare the real data's label set and
    channels (`--classes`, `--channels`) for `--real` and `--real-train`. Returns a JSON-ready
    dict.
    A table (`--real csv:FILE` or a built-in table) is evaluated by
    `dpsynth.evaluation.table_report` (logistic regression and gradient boosting; `schema`
    reads it; `ml_rows` caps the rows they train and test on).
    """
    from dpsynth.data.sources import is_table_spec

    if [m.strip().lower() for m in metrics] in ([], ["auto"]):  # what fits the data
        metrics = list(AUTO_TABLE_METRICS if is_table_spec(real) else AUTO_IMAGE_METRICS)
    if is_table_spec(real):
        from dpsynth.evaluation.table_pass import ML_ROWS
        from dpsynth.evaluation.table_report import run_table_evaluation

        return run_table_evaluation(
            synthetic=synthetic, real=real, metrics=metrics, seeds=seeds, real_train=real_train,
            schema_path=schema, report_dir=report_dir, ledger_path=ledger_path,
            ml_rows=ML_ROWS if ml_rows is None else ml_rows, progress=progress,
        )  # fmt: skip
    for name, given in (("schema", schema), ("ml_rows", ml_rows)):
        if given is not None:
            raise UsageError(
                f"{{{name}}} is for tables ({{real}} csv:FILE or a built-in table)",
                parameters=(name, "real"),
            )
    wanted = _parse_metrics(metrics)
    torch_device = resolve_device(device)
    if report_dir is not None:
        check_report_dir(Path(report_dir))  # before any slow work
    if wanted & {"fid", "precision", "recall"}:
        fid.find_inception_weights(inception_weights)  # fail fast, before any slow work
    declared = {"classes": real_classes, "channels": real_channels}
    real_data = _load(real, **declared)
    warnings = training_data_warnings(real_data, ledger_path, "--real")
    non_private = bool(warnings)
    if n is not None and n < 1:
        raise UsageError("{n} must be at least 1", parameter="n")
    if fid_n is not None and fid_n < 2:
        raise UsageError("{fid_n} must be at least 2", parameter="fid_n")
    privacy = _run_privacy(synthetic, ledger_path)
    warnings.extend(_unfinished_warnings(synthetic, privacy))
    synth = folders.load_synthetic(
        synthetic,
        tuple(real_data.classes),
        real_data.shape,
        n=n if n is not None or not folders.is_run_dir(Path(synthetic)) else real_data.n,
        device=str(torch_device),
    )
    missing = sorted(set(range(len(real_data.classes))) - set(synth.y.unique().tolist()))
    if missing:
        names = ", ".join(real_data.classes[i] for i in missing)
        warnings.append(f"the synthetic data have no images of class(es) {names}")

    result_metrics: dict = {}
    if wanted & {"fid", "precision", "recall"}:
        fid_result = fid.compute_fid(
            fid_subset(synth.x, fid_n),
            real_data.x,
            real_digest=real_data.content_digest,
            weights=inception_weights,
            device=torch_device,
            batch_size=fid_batch_size,
            with_fid="fid" in wanted,
            with_precision_recall=bool(wanted & {"precision", "recall"}),
            progress=progress,
        )
        fid_result["reference"] = real_data.spec
        if "fid" in wanted:
            result_metrics["fid"] = {
                key: fid_result[key]
                for key in (
                    *("value", "n_synthetic", "n_real", "reference", "weights"),
                    *("weights_sha256", "real_features_cached", "pipeline"),
                )
            }
        for name in ("precision", "recall"):
            if name in wanted:
                result_metrics[name] = {
                    "value": fid_result[name],
                    "k": fid_result["k"],
                    "n_synthetic": fid_result["n_synthetic"],
                    "n_real": fid_result["n_real"],
                    "reference": real_data.spec,
                    "real_features_cached": fid_result["real_features_cached"],
                }
        if "fid" in wanted and min(fid_result["n_synthetic"], fid_result["n_real"]) < SMALL_FID_N:
            warnings.append(
                f"FID from fewer than {SMALL_FID_N} images per side is biased upwards; "
                "compare only FIDs computed with the same n"
            )

    if "accuracy" in wanted:
        count_before = len(warnings)
        result_metrics["accuracy"] = _accuracy(
            synth, real_data, classifier, seeds, real_train, ledger_path, torch_device,
            cnn_schedule or downstream.CnnSchedule(), progress, warnings, declared,
        )  # fmt: skip
        non_private = non_private or any(w.startswith("WARNING:") for w in warnings[count_before:])

    result: dict = {
        "synthetic": str(synth.path),
        "synthetic_source": synth.source,
        "n_synthetic": len(synth.y),
        "real": real_data.spec,
        "real_kind": real_data.kind,
        # True when --real or --real-train is data a DP run in the ledger spent budget on.
        "non_private": non_private,
        "real_n": real_data.n,
        "real_fingerprint": report_fingerprint(real_data.content_digest, ledger_path),
        "classes": list(real_data.classes),
        "metrics": result_metrics,
        "provenance": synth.provenance,
        "device": str(torch_device),
        "warnings": warnings,
        "report_dir": None,
    }
    if privacy is not None:
        result["privacy"] = privacy
    result["non_private_contents"] = non_private_contents(result, report_dir is not None)
    if report_dir is not None:
        result["report_dir"] = str(Path(report_dir))
        digest = write_report(result, Path(report_dir), synth, real_data)
    else:
        digest = hashlib.sha256(canonical_json(result)).hexdigest()
    result["release"] = record_evaluation_release(ledger_path, result, digest)
    return result


def _run_privacy(synthetic: str, ledger_path: str | os.PathLike[str] | None) -> dict | None:
    """For a run dir, its privacy statement from the ledger spend it is anchored to (checked;
    refused with exit 2 when the run does not match the ledger; a run whose training did not
    finish is evaluated, and its statement says so); None for a sample folder."""
    if not folders.is_run_dir(Path(synthetic)):
        return None
    from dpsynth.sampling import run_privacy

    return run_privacy(synthetic, ledger_path, partial=True)


def _unfinished_warnings(synthetic: str, privacy: dict | None) -> list[str]:
    """A warning when the synthetic images come from a run whose training did not finish: the
    run dir's checkpoint, or a sample folder whose manifest records a partial release."""
    from dpsynth.sampling.trained_run import TrainingState, partial_note, released_training_state

    state: TrainingState | None = None
    if privacy is not None:
        training = privacy.get("training")
        if training is not None:
            state = TrainingState(training["steps"], training["total_steps"])
    else:
        try:
            manifest = json.loads((Path(synthetic) / "manifest.json").read_text())
        except (OSError, ValueError, RecursionError):
            manifest = None
        state = released_training_state(manifest) if isinstance(manifest, dict) else None
    if state is None or state.finished:
        return []
    return [f"{synthetic}: the images come from an unfinished run: {partial_note(state)}"]


def _parse_metrics(metrics: Sequence[str]) -> set[str]:
    wanted = {m.strip().lower() for m in metrics if m.strip()}
    unknown = sorted(wanted - set(METRICS))
    if unknown or not wanted:
        raise UsageError(
            f"{{metrics}} takes a comma-separated subset of {', '.join(METRICS)}"
            + (f" (unknown: {', '.join(unknown)})" if unknown else ""),
            parameter="metrics",
        )
    return wanted


def _load(
    spec: str, classes: tuple[str, ...] | None = None, channels: int | None = None
) -> ImageData:
    from dpsynth.data.sources import load_data

    return load_data(spec, classes=classes, channels=channels)


def _accuracy(
    synth: folders.SyntheticImages,
    real_data: ImageData,
    classifier: str,
    seeds: int,
    real_train: str | None,
    ledger_path: str | os.PathLike[str] | None,
    device: torch.device,
    schedule: downstream.CnnSchedule,
    progress: Progress | None,
    warnings: list[str],
    declared: dict | None = None,
) -> dict:
    classes = tuple(real_data.classes)
    test = (real_data.x, real_data.y)
    out = downstream.accuracy_over_seeds(
        (synth.x, synth.y), test, classes, classifier=classifier, seeds=seeds,
        schedule=schedule, device=device, progress=progress, stage="accuracy",
    )  # fmt: skip
    out["reference"] = real_data.spec
    if real_train is not None:
        train_data = _load(real_train, **(declared or {}))
        warnings.extend(training_data_warnings(train_data, ledger_path, "--real-train"))
        warnings.append(
            f"the real-trained upper bound reads {train_data.spec} without DP: it is a "
            "non-private statistic of that data; do not publish it for private data"
        )
        y = folders.map_labels_by_name(train_data.y, tuple(train_data.classes), classes)
        x = folders.match_shape(train_data.x, real_data.shape)
        upper = downstream.accuracy_over_seeds(
            (x, y), test, classes, classifier=classifier, seeds=seeds,
            schedule=schedule, device=device, progress=progress, stage="accuracy-real-train",
        )  # fmt: skip
        out["real_train"] = train_data.spec
        out["real_train_accuracy"] = upper["mean"]
        out["real_train_std"] = upper["std"]
        out["real_train_per_class"] = upper["per_class"]
    return out


def canonical_json(obj: dict) -> bytes:
    """The bytes whose hash identifies a result: sorted keys, no spaces, UTF-8."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def non_private_contents(result: dict, with_report: bool) -> list[str]:
    """What in this evaluation's output is computed from real records without DP.

    The ledger's zero-cost release covers only post-processing of synthetic data; these parts
    are listed in the release entry so that nobody reads them as covered by the ε spent.
    """
    reasons = []
    if "real_train_accuracy" in result["metrics"].get("accuracy", {}):
        reasons.append("real-trained accuracy: a statistic of the real training data")
    if result.get("non_private"):
        reasons.append("metrics on data that DP training spent budget on")
    if result.get("real_kind") != "builtin":
        # Only the built-in sets (digits, mnist-5k and their :test splits) are public; a user's
        # own held-out records are private, and metrics on them are computed without DP.
        for name in sorted(result["metrics"]):
            reasons.append(
                f"{name} on {result['real']}: a statistic of the user's own held-out records, "
                "computed without DP"
            )
    if with_report:
        reasons.append("samples.png shows real records of the reference set")
    return reasons


def write_report(
    result: dict, report_dir: Path, synth: folders.SyntheticImages, real_data: ImageData
) -> str:
    """Write report.json, report.md and the PNGs into report_dir; the SHA-256 of report.json."""
    report_dir.mkdir(parents=True, exist_ok=True)
    images = {"samples": "samples.png"}
    write_bytes_atomic(report_dir / "samples.png", render_sample_grid(synth, real_data))
    accuracy = result["metrics"].get("accuracy")
    if accuracy:
        images["per_class_accuracy"] = "per_class_accuracy.png"
        write_bytes_atomic(report_dir / "per_class_accuracy.png", render_per_class(accuracy))
    log = folders.train_log(synth.path) if synth.source == "run" else []
    if log:
        images["epsilon_curve"] = "epsilon_curve.png"
        write_bytes_atomic(report_dir / "epsilon_curve.png", render_epsilon_curve(log))
    result["report_files"] = {"json": "report.json", "markdown": "report.md", **images}
    data = json.dumps(result, indent=2, ensure_ascii=False).encode() + b"\n"
    write_bytes_atomic(report_dir / "report.json", data)
    write_bytes_atomic(report_dir / "report.md", render_markdown(result, images).encode())
    return hashlib.sha256(data).hexdigest()
