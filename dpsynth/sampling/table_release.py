"""What a table's sample states whatever its layout (one CSV or Parquet file, or a partitioned
Parquet folder): the checks of `--out` against the run and the ledger, the label counts and
the rule that chose them, and the manifest's common fields."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dpsynth.data.images import DataInfo
from dpsynth.errors import UsageError
from dpsynth.methods.base import Generator
from dpsynth.rundir import RunDir
from dpsynth.sampling.labels import AUTO_LABELS, table_label_counts, weighted_counts
from dpsynth.sampling.outputs import release_header
from dpsynth.sampling.units import units_of


def check_not_protected(out: Path, run: RunDir, ledger: Path | str) -> None:
    """Refuse (exit 2) an `--out` that is the ledger or lies inside the run directory."""
    resolved = out.resolve()
    if resolved == Path(ledger).resolve() or run.path.resolve() in resolved.parents:
        raise UsageError(f"--out {out}: would overwrite the ledger or the run directory")


def table_labels(
    generator: Generator, labels: str, n: int, info: DataInfo
) -> tuple[list[int], str]:
    """Rows per class and the rule stated in the manifest: the model's own fitted class
    proportions (aim, mst: public, post-processing) for `model` and `auto`, else
    `table_label_counts`."""
    proportions = getattr(generator, "class_proportions", None)
    if labels in ("model", AUTO_LABELS) and proportions is not None:
        return weighted_counts(n, list(proportions())), "the model's own"
    return table_label_counts(labels, n, info)


def table_manifest(
    run_dir: Path | str,
    run_config: dict[str, Any],
    privacy: dict[str, Any],
    info: DataInfo,
    generator: Generator,
    release: dict[str, Any],
) -> dict[str, Any]:
    """The manifest fields every table sample has that do not depend on what was drawn: the
    run, its privacy statement and where it comes from, the schema and the data's ids;
    `release` (n, format, labels, seed, digest, ledger entry, ...) goes in the middle."""
    schema = info.schema or {}
    units = units_of(run_config, schema)
    return {
        **release_header(run_dir, run_config, privacy),
        **release,
        "truncation": generator.truncation,
        "columns": [c["name"] for c in schema.get("columns", ())],
        "schema": info.schema,
        **({"privacy_unit": units.to_json()} if units is not None else {}),
        "dataset_id": info.dataset_id,
        "fingerprint": info.fingerprint,
    }
