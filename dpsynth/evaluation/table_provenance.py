"""Where a synthetic table comes from, as a table's evaluation states it: the manifest beside
the file (`FILE.manifest.json`, written by `sample`), its privacy statement re-derived from the
ledger, and what the run released of its schema with DP.

The schema release is read off the manifest's schema (the run's: each entry released with DP
is marked `"source": "released with DP …"`, and a number whose range did not clear the noise
became `ignored`) and the `schema_release` record of the run's config.json (the run folder
the manifest names): the released columns, the noise of each kind of entry, the warnings.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dpsynth.data.column_values import RELEASED_PREFIX
from dpsynth.errors import DpsynthError
from dpsynth.ledger import Ledger
from dpsynth.ledger.anchors import privacy_statement
from dpsynth.training.release_notes import describe_released


def read_manifest(path: Path) -> dict[str, Any]:
    """The manifest beside a synthetic file (`FILE.manifest.json`), or {} without one."""
    sidecar = path.with_name(path.name + ".manifest.json")
    try:
        obj = json.loads(sidecar.read_text())
    except (OSError, ValueError):
        return {}
    return obj if isinstance(obj, dict) else {}


def checked_manifest_privacy(
    manifest: dict[str, Any],
    synthetic: Path,
    ledger_path: str | os.PathLike[str] | None,
    warnings_list: list[str],
) -> str | None:
    """The privacy statement of a sampled CSV, re-derived from the ledger spend its manifest
    names (`--ledger`, else the ledger the manifest records), or None with a warning when that
    ledger does not hold the spend: a manifest's own words are never repeated unchecked. A
    sample of an unfinished run (a partial release, or a spend not completed) says so."""
    if not manifest.get("privacy"):
        return None
    source = manifest.get("privacy_source")
    source = source if isinstance(source, dict) else {}
    seq, digest = source.get("ledger_seq"), source.get("ledger_hash")
    path = ledger_path or source.get("ledger")
    spend = None
    if path and isinstance(seq, int) and not isinstance(seq, bool):
        try:
            candidate = Ledger(path).spend(seq)
        except DpsynthError:
            candidate = None
        if (
            candidate is not None
            and candidate.get("hash") == digest
            and candidate.get("run_id") == manifest.get("run_id")
        ):
            spend = candidate
    if spend is None:
        warnings_list.append(
            f"{synthetic.name}: its manifest's privacy statement names ledger entry {seq}, "
            f"which {path or 'no ledger'} does not hold as run {manifest.get('run_id')}'s spend: "
            "the statement is not reported (pass --ledger with the run's own ledger)"
        )
        return None
    from dpsynth.sampling.trained_run import unfinished_note

    statement = str(privacy_statement(spend)["statement"])
    note = unfinished_note(manifest, spend.get("status"))
    return f"{statement}; {note}" if note else statement


def _run_config(manifest: Mapping[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
    """The run's config.json (when it is the manifest's run) and where it was looked for."""
    run = manifest.get("run")
    if not isinstance(run, str) or not run:
        return None, None
    path = Path(run) / "config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError):
        return None, str(path)
    if not isinstance(config, dict) or config.get("run_id") != manifest.get("run_id"):
        return None, str(path)
    return config, str(path)


def _short_number(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, int | float) else "not recorded"


def _noise(entry: Mapping[str, Any], target: str, record: Mapping[str, Any]) -> str | None:
    """The noise std of a released column's entries (None: the record does not give it)."""

    def std(key: str) -> float | None:
        value = record.get(key)
        return float(value) if isinstance(value, int | float) else None

    kind = entry.get("type")
    if kind == "categorical":
        key = "target" if entry.get("name") == target and std("target_noise_std") else "category"
        noise, cut = std(f"{key}_noise_std"), std(f"{key}_threshold")
        if noise is None:
            return None
        return f"{noise:.3g}" + (f" (threshold {cut:.3g})" if cut is not None else "")
    ranges, shapes = std("range_noise_std"), std("shape_noise_std")
    if kind == "boolean":
        booleans = std("boolean_noise_std") or shapes
        return None if booleans is None else f"{booleans:.3g}"
    if kind == "ignored":
        return None if ranges is None else f"range {ranges:.3g}"
    if ranges is None or shapes is None:
        return None
    return f"range {ranges:.3g}, shape {shapes:.3g}"


def schema_release_summary(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """What the synthetic table's run released of its schema with DP: `status` ("released",
    "declared": nothing released, or "unknown"), a one-line `note`, and for a release one row
    per schema column (`column`, `type`, `released`, `what`, `noise_std`) and its warnings."""
    if not manifest:
        note = "The synthetic file has no manifest: what its run released of the schema is unknown."
        return {"status": "unknown", "note": note, "columns": []}
    config, config_path = _run_config(manifest)
    schema = manifest.get("schema")
    if not isinstance(schema, dict) and config is not None:
        schema = config.get("data", {}).get("schema")
    entries = schema.get("columns") if isinstance(schema, dict) else None
    if not isinstance(entries, list):
        note = "The manifest records no schema: what the run released of it is unknown."
        return {"status": "unknown", "note": note, "columns": []}
    record = (config or {}).get("schema_release")
    record = record if isinstance(record, dict) else {}
    released = {str(c) for c in record.get("released_columns") or ()} | {
        str(e.get("name"))
        for e in entries
        if isinstance(e, dict) and str(e.get("source", "")).startswith(RELEASED_PREFIX)
    }
    if not released:
        note = "Nothing was released with DP: the run's schema was declared (public)."
        return {"status": "declared", "note": note, "columns": []}
    target = str(schema.get("target"))
    warnings = [str(w) for w in record.get("warnings", [])]
    rows = []
    for entry in (e for e in entries if isinstance(e, dict)):
        name, kind = str(entry.get("name")), str(entry.get("type"))
        row: dict[str, Any] = {"column": name, "type": kind, "released": name in released}
        if name in released:
            clipped = (record.get("clipped") or {}).get(name)
            deviation = (record.get("clipped_deviation") or {}).get(name)
            row["what"] = describe_released(entry, target, warnings, clipped, deviation)
            row["noise_std"] = _noise(entry, target, record)
        else:
            row["what"] = {
                "id": "an identifier, never read (sample writes fresh keys)",
                "ignored": "ignored in the schema (not read, written empty)",
            }.get(kind, "declared (public)")
            row["noise_std"] = None
        rows.append(row)
    if record:
        note = (
            f"Released with DP by the run's ledger entry {record.get('ledger_seq')} "
            f"(ε = {_short_number(record.get('epsilon'))}, δ = "
            f"{_short_number(record.get('delta'))}, noise multiplier "
            f"{_short_number(record.get('noise_multiplier'))}), as the run's "
            "config.json records it."
        )
    else:
        where = config_path or "no run folder named"
        note = (
            "The schema's entries marked as released with DP; the run's config.json ("
            f"{where}) was not found or is another run's, so the noise is not shown."
        )
    return {"status": "released", "note": note, "columns": rows, "warnings": warnings}


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def schema_release_markdown(summary: Mapping[str, Any]) -> list[str]:
    """report.md's section on the schema release (see `schema_release_summary`)."""
    lines = ["## Schema release", "", str(summary["note"]), ""]
    if not summary["columns"]:
        return lines
    lines += ["| column | type | released with DP | noise std |", "|---|---|---|---|"]
    for row in summary["columns"]:
        what = row["what"] if row["released"] else f"not released: {row['what']}"
        noise = row["noise_std"] or ("not recorded" if row["released"] else "—")
        lines.append(f"| {_cell(row['column'])} | {row['type']} | {_cell(what)} | {noise} |")
    lines.append("")
    if summary.get("warnings"):
        lines += [f"- {_cell(w)}" for w in summary["warnings"]] + [""]
    return lines
