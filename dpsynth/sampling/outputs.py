"""What `sample` writes besides the records: the release in the ledger, the manifest, and the
check that a folder holds only an earlier sample output."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from dpsynth.data.images import DataInfo
from dpsynth.ledger import Ledger
from dpsynth.rundir import RunDir
from dpsynth.staging import check_target

SampleProgress = Callable[[int, int], None]
# A partitioned sample's report as each partition is written: (partitions done, partitions,
# rows done, rows), called in the parent process.
PartitionProgress = Callable[[int, int, int, int], None]


def is_sample_output(folder: Path) -> bool:
    """True when `folder` holds only what `sample` writes, with its manifest."""
    try:
        manifest = json.loads((folder / "manifest.json").read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(manifest, dict) or not {"run_id", "output_sha256"} <= manifest.keys():
        return False
    if manifest.get("format") == "npz":
        return {p.name for p in folder.iterdir()} <= {"manifest.json", "samples.npz"}
    classes = {str(name) for name in manifest.get("classes") or []}
    for path in folder.iterdir():
        if path.name in ("manifest.json", "labels.csv") and path.is_file():
            continue
        if path.name not in classes or path.is_symlink() or not path.is_dir():
            return False
        if any(not (f.is_file() and _PNG_NAME.match(f.name)) for f in path.iterdir()):
            return False
    return True


_PNG_NAME = re.compile(r"^\d+\.png$")


def record_release(
    run_config: dict[str, Any],
    info: DataInfo,
    ledger_path: Path | str,
    output_sha: str,
    n: int,
    fmt: str,
    out: Path | None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any] | None:
    """Append the zero-cost `release` event of a sample (`extra`: more public details of
    what was written; `out` None: returned in memory, written nowhere); where it is in the
    ledger."""
    path = ledger_path
    entry = Ledger(path).record_release(
        dataset_id=info.dataset_id,
        fingerprint=info.fingerprint,
        command="sample",
        method=run_config["method"],
        run_id=run_config["run_id"],
        output_sha256=output_sha,
        details={
            "n": n,
            "format": fmt,
            "out": str(out.resolve()) if out is not None else "in memory",
            **(extra or {}),
        },
    )
    return {"path": str(Path(path).resolve()), "seq": entry["seq"]}


def release_header(
    run_dir: Path | str, run_config: Mapping[str, Any], privacy: Mapping[str, Any]
) -> dict[str, Any]:
    """The fields every sample's manifest opens with: the run, its method, and its privacy
    statement with where it comes from (the ledger spend the run is anchored to)."""
    return {
        "run_id": run_config["run_id"],
        "run": str(Path(run_dir).resolve()),
        "method": run_config["method"],
        "private": privacy["private"],
        "privacy": privacy["statement"],
        "privacy_source": {
            key: privacy[key]
            for key in ("ledger", "ledger_seq", "ledger_hash", "status", "epsilon", "delta")
        },
    }


def check_release_target(
    out: Path, run: RunDir, ledger: Path | str, force: bool, written_by_us: Callable[[Path], bool]
) -> None:
    """Refuse an `--out` folder that is, or holds, the run or the ledger, or that is not
    empty unless `force` and `written_by_us` says an earlier `sample` wrote it
    (`dpsynth.staging.check_target`)."""
    check_target(
        out,
        flag="--out",
        force=force,
        protected=[(run.path, "the run directory"), (Path(ledger), "the ledger")],
        written_by_us=written_by_us,
    )


def manifest_of(out_dir: Path | str) -> dict[str, Any]:
    """The manifest a `sample` output folder carries."""
    return json.loads((Path(out_dir) / "manifest.json").read_text())


def table_manifest_path(out: Path | str) -> Path:
    """Where `sample` writes the manifest of a CSV: `OUT.manifest.json` beside it."""
    out = Path(out)
    return out.with_name(out.name + ".manifest.json")
