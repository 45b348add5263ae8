"""Name → backend lookup, importing a backend's module only when it is asked for."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from dpsynth.errors import UsageError

if TYPE_CHECKING:  # the CLI reads the lists below at start-up: no backend, no torch import
    from dpsynth.methods.base import Method

_BACKENDS: dict[str, str] = {
    "pge": "dpsynth.methods.pge.method:PGEMethod",
    "dpkernel": "dpsynth.methods.dpkernel.method:DPKernelMethod",
    "psg": "dpsynth.methods.psg.method:PSGMethod",
    "dpaf": "dpsynth.methods.dpaf.method:DPAFMethod",
    "rdpgan": "dpsynth.methods.rdpgan.method:RDPGANMethod",
    "freq": "dpsynth.methods.freq.method:FreqMethod",
    "aim": "dpsynth.methods.marginal.aim:AIMMethod",
    "mst": "dpsynth.methods.marginal.mst:MSTMethod",
}


# The kinds of data a backend trains on where it is not images alone: its `Method.modalities`
# (tests/methods/test_method_lists.py checks that they agree), kept here so that the CLI's help and
# the docs can list the backends without importing them (a backend's import takes seconds).
_NOT_ONLY_IMAGES: dict[str, tuple[str, ...]] = {
    "dpkernel": ("image", "table"),
    "rdpgan": ("image", "table"),
    "aim": ("table",),
    "mst": ("table",),
}


def method_names() -> list[str]:
    """Names accepted by `--method`."""
    return list(_BACKENDS)


def modalities_of(name: str) -> tuple[str, ...]:
    """The kinds of data backend `name` trains on ("image", "table"), without importing it."""
    return _NOT_ONLY_IMAGES.get(name, ("image",))


def methods_for(modality: str) -> list[str]:
    """The registered backends that train on `modality` ("image" or "table"), in order."""
    return [name for name in _BACKENDS if modality in modalities_of(name)]


def methods_summary(code: bool = False) -> str:
    """The backends by kind of data, for the CLI's help and the docs (`code`: names in
    Markdown backticks), e.g. "pge, … or freq for images; dpkernel, … or mst for tables"."""

    def listed(names: list[str]) -> str:
        names = [f"`{n}`" if code else n for n in names]
        return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"

    return "; ".join(
        f"{listed(methods_for(kind))} for {label}"
        for kind, label in (("image", "images"), ("table", "tables"))
        if methods_for(kind)
    )


def get_method(name: str) -> Method:
    """An instance of the backend called `name` (UsageError if unknown)."""
    if name not in _BACKENDS:
        raise UsageError(f"unknown method {name!r}; choose from {', '.join(_BACKENDS)}")
    module_name, class_name = _BACKENDS[name].split(":")
    return getattr(importlib.import_module(module_name), class_name)()
