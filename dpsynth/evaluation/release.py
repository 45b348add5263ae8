"""What every evaluation (images and tables) shares: the `--report` folder check, the ledger's
warning when the real data is data a DP run trained on, and the zero-cost release record."""

from __future__ import annotations

import os
from pathlib import Path

from dpsynth.data.images import ImageData
from dpsynth.staging import check_target

REPORT_FILES = (
    "report.json",
    "report.md",
    "samples.png",
    "per_class_accuracy.png",
    "epsilon_curve.png",
)


def check_report_dir(report_dir: Path) -> None:
    """Refuse (exit 2) a `--report` path that is a file, the current directory or a folder
    holding anything but an earlier report: writing the report there could overwrite files."""

    def earlier_report(folder: Path) -> bool:
        names = {path.name for path in folder.iterdir()}
        return "report.json" in names and names <= set(REPORT_FILES)

    check_target(report_dir, flag="--report", force=True, written_by_us=earlier_report)


def spends_on(data: ImageData, ledger_path: str | os.PathLike[str] | None) -> list[dict]:
    """The ledger's spend lines whose dataset id or fingerprint is this data's.

    Either match makes the data private training data: the same records under another id, and
    the same id with one record added or removed (another fingerprint), are both the data a DP
    run read. Fingerprints are matched keyed (under the ledger's key) and, for lines written
    before the key, as the plain digest, compared in memory only.
    """
    if ledger_path is None or not Path(ledger_path).is_file():
        return []
    from dpsynth.ledger import Ledger

    ledger = Ledger(Path(ledger_path))
    same_data = {data.content_digest, ledger.data_fingerprint(data.content_digest, create=False)}
    return [
        entry
        for entry in ledger.entries()
        if entry.get("kind") == "spend"
        and (entry.get("dataset_id") == data.dataset_id or entry.get("fingerprint") in same_data)
    ]


def report_fingerprint(
    content_digest: str, ledger_path: str | os.PathLike[str] | None
) -> str | None:
    """The real data's fingerprint for a publishable report: keyed under the ledger's key, or
    None when there is no ledger key yet (never the plain digest, a membership test)."""
    if ledger_path is None:
        return None
    from dpsynth.ledger import Ledger

    return Ledger(Path(ledger_path)).data_fingerprint(content_digest, create=False)


def training_data_warnings(
    data: ImageData, ledger_path: str | os.PathLike[str] | None, flag: str
) -> list[str]:
    """A loud warning when the ledger shows DP spends on this data (by dataset id or bytes)."""
    spends = spends_on(data, ledger_path)
    if not spends:
        return []
    runs = sorted({str(s.get("run_id") or s.get("seq")) for s in spends})
    return [
        f"WARNING: {flag} {data.spec} is data that DP training spent privacy budget on "
        f"(ledger: {len(spends)} spend(s) on its dataset id or fingerprint, run(s) "
        f"{', '.join(runs)}). This evaluation is NOT private: its metrics leak information "
        "about those records; evaluate on a held-out split (e.g. NAME:test) instead."
    ]


def record_evaluation_release(
    ledger_path: str | os.PathLike[str] | None, result: dict, output_sha256: str
) -> dict | None:
    """Append a zero-cost `release` event for an evaluation of synthetic data.

    Skipped (returns None) without a ledger path, or when the synthetic data's source data set
    (from the run's config.json or the sample folder's manifest.json) is unknown.
    """
    provenance = result.get("provenance") or {}
    if ledger_path is None or not provenance.get("dataset_id"):
        return None
    from dpsynth.ledger import Ledger

    details = {
        "synthetic": result["synthetic"],
        "real": result["real"],
        "metrics": sorted(result["metrics"]),
        "report_dir": result.get("report_dir"),
        "non_private_contents": result.get("non_private_contents", []),
        "non_private": bool(result.get("non_private")),
    }
    return Ledger(Path(ledger_path)).record_release(
        dataset_id=provenance["dataset_id"],
        fingerprint=provenance.get("fingerprint", ""),
        command="evaluate",
        method=provenance.get("method", ""),
        run_id=provenance.get("run_id", ""),
        output_sha256=output_sha256,
        details=details,
    )
