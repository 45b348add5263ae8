"""Name → backend lookup, importing a backend's module only when it is asked for."""

from __future__ import annotations

import importlib

from dpsynth.errors import UsageError
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


def method_names() -> list[str]:
    """Names accepted by `--method`."""
    return list(_BACKENDS)


def get_method(name: str) -> Method:
    """An instance of the backend called `name` (UsageError if unknown)."""
    if name not in _BACKENDS:
        raise UsageError(f"unknown method {name!r}; choose from {', '.join(_BACKENDS)}")
    module_name, class_name = _BACKENDS[name].split(":")
    return getattr(importlib.import_module(module_name), class_name)()
