"""Declared-public images (`train --public SPEC`): checked before the reservation, recorded with
the run and its spend, read again by a resumed or joining run, and handed to the trainer once,
before any private step of a new run.

The set costs no ε and never goes through `dpsynth.privacy`: declaring it public is the data
owner's statement. It is refused when it is the private data itself (same spec or dataset id,
same content digest, or the same pictures) and when the run's trainer would not use it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from dpsynth.data.images import DataInfo, ImageData
from dpsynth.data.public import PublicImages, load_public, same_as_private
from dpsynth.data.sources import parse_spec
from dpsynth.errors import DataError, UsageError
from dpsynth.methods.base import Trainer
from dpsynth.training.session import Session

# The fields of the run's public record that its ledger spend repeats.
LEDGER_FIELDS = ("spec", "n", "content_digest", "used_by")


def open_public(
    spec: str, records: ImageData, info: DataInfo, trainer: Trainer, method: str
) -> tuple[PublicImages, dict[str, Any]]:
    """Read the public set in the data's public shape and check it (UsageError, exit 2,
    before anything is reserved): not the private data, and used by the trainer. Returns it
    and its record for config.json (`ledger_record` gives the spend's part)."""
    public = load_public(spec, info.shape, info.classes)
    if same_as_private(public, records):
        raise UsageError(
            f"--public {spec} is the private data itself (--data {records.spec}): declare a "
            "different set, one that is public"
        )
    uses = trainer.public_uses(public.labelled)
    if not uses:
        raise UsageError(_unused(method, trainer, public))
    notes = []
    skipped = [part for part in trainer.public_uses(True) if part not in uses]
    if not public.labelled:
        notes.append(
            f"--public {public.spec}: its classes ({_names(public.classes)}) are not the data's "
            f"({_names(info.classes)}), so it is used unlabelled"
            + (f"; {', '.join(skipped)} (needs labels) skips it" if skipped else "")
        )
    record = {
        "spec": public.spec,
        "n": public.n,
        "content_digest": public.content_digest,
        "used_by": list(uses),
        "labelled": public.labelled,
        "classes": list(public.classes),
        "source_shape": list(public.source_shape) if public.source_shape else None,
        "transform": public.describe(info.shape),
        "privacy": "declared public by the data owner: no ε spent, not protected",
        "notes": notes,
    }
    return public, record


def ledger_record(record: Mapping[str, Any]) -> dict[str, Any]:
    """The part of the run's public record its ledger spend carries."""
    return {key: record[key] for key in LEDGER_FIELDS}


def check_resume_spec(spec: str | None, recorded: Mapping[str, Any] | None, name: str) -> None:
    """`--resume --public SPEC` must name the set the run recorded (UsageError otherwise);
    without `--public` the recorded one is used."""
    if spec is None:
        return
    if recorded is None:
        raise UsageError(f"{name} was started without --public; resume it without --public")
    if parse_spec(spec).canonical != recorded["spec"]:
        raise UsageError(
            f"--public {spec} differs from the set {name} was started with "
            f"({recorded['spec']}); resume with that one, or without --public"
        )


def reload_public(recorded: Mapping[str, Any], info: DataInfo, name: str) -> PublicImages:
    """The public set a run recorded, read again the same way (a restart before the first
    checkpoint redoes the pretraining): DataError if its content changed."""
    public = load_public(str(recorded["spec"]), info.shape, info.classes)
    if public.content_digest != recorded["content_digest"]:
        raise DataError(
            f"--public {recorded['spec']}: the public images changed since {name} started "
            "(content digest differs); a resumed run must pretrain on the same ones"
        )
    return public


def needs_reload(run_config: Mapping[str, Any], start_step: int, restored: Any) -> bool:
    """Whether a resumed or joining run must pretrain again (it restarts from scratch)."""
    return bool(run_config.get("public")) and start_step == 0 and restored is None


def pretrain_public(session: Session, device: torch.device) -> None:
    """Hand the public images to the trainer, once, for a run that starts from scratch (a
    resumed run's checkpoint already holds the pretrained weights)."""
    public = session.public
    if public is None or session.start_step > 0 or session.restored is not None:
        return
    labels = public.y.to(device) if public.y is not None else None
    session.trainer.pretrain_public(public.as_float().to(device), labels)


def _names(classes: tuple[str, ...]) -> str:
    shown = ", ".join(classes[:6])
    return shown + (", …" if len(classes) > 6 else "")


def _unused(method: str, trainer: Trainer, public: PublicImages) -> str:
    """Why `--public` is refused: nothing of the run would use the set."""
    base = f"--public is not used by --method {method}"
    if type(trainer).public_uses is Trainer.public_uses:
        return base
    if not public.labelled and trainer.public_uses(True):
        return (
            f"{base} with unlabelled images: only its DP teacher would use them, and it needs "
            "the data's classes"
        )
    return base + " with these settings (see public_pretrain_steps, public_teacher_steps)"
