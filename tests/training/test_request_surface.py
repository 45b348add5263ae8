"""One set of names: every field of the training request is one `dpsynth train` option and one
`dpsynth.train` keyword of the same name, and the reverse, with the same defaults; a library
error naming a field is printed as that option's flag. The exceptions: the test-only fields
(`TEST_ONLY`: keywords, never options), the CLI's own options (`CLI_ONLY`) and the API's
progress callback (`API_ONLY`)."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import typer

import dpsynth
from dpsynth.cli import app
from dpsynth.cli.flags import flag_of
from dpsynth.training.request import _PARTS, FIELDS, TEST_ONLY, TrainRequest

# The CLI's own options: how to show the result, and the two every command has.
CLI_ONLY = {"as_json", "quiet", "threads", "debug"}
# The API's own keyword: a callback for progress reports.
API_ONLY = {"progress"}
# A new run needs these: the API asks for them (None with `resume`), the CLI checks them.
API_REQUIRED = {"method", "data", "epsilon", "out"}


def _defaults() -> dict[str, Any]:
    """Each request field's default (`out` has none)."""
    out: dict[str, Any] = {}
    for cls in _PARTS.values():
        for f in dataclasses.fields(cls):
            if not f.init:
                continue
            if f.default is not dataclasses.MISSING:
                out[f.name] = f.default
            elif f.default_factory is not dataclasses.MISSING:
                out[f.name] = f.default_factory()
    return out


def _same_default(given: Any, field_default: Any) -> bool:
    """An option's default against the field's (None stands for an empty mapping)."""
    if given is None and field_default == {}:
        return True
    return given == field_default


def _cli_options() -> dict[str, Any]:
    command = typer.main.get_command(app)
    train = command.commands["train"]  # type: ignore[attr-defined]
    return {param.name: param for param in train.params}


def test_every_field_is_in_one_part_under_one_name() -> None:
    names = [f.name for cls in _PARTS.values() for f in dataclasses.fields(cls) if f.init]
    assert len(names) == len(set(names)) == len(FIELDS)
    assert set(TEST_ONLY) <= set(FIELDS)
    assert [f.name for f in dataclasses.fields(TrainRequest)] == [
        "run", "input", "images", "table", "privacy", "backend",
    ]  # fmt: skip


def test_the_cli_options_are_the_request_fields() -> None:
    options = _cli_options()
    assert set(options) - CLI_ONLY == set(FIELDS) - set(TEST_ONLY)
    defaults = _defaults()
    for name, option in options.items():
        if name in CLI_ONLY:
            continue
        # the flag users know, and the one a library error naming the field is printed as
        assert flag_of(name) in option.opts, (name, option.opts)
        if name in defaults:
            assert _same_default(option.default, defaults[name]), name


def test_the_api_keywords_are_the_request_fields() -> None:
    parameters = inspect.signature(dpsynth.train).parameters
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in parameters.values())
    # all the fields, the test-only ones too (`dpsynth train` has no option for them)
    assert set(parameters) - API_ONLY == set(FIELDS)
    defaults = _defaults()
    for name, parameter in parameters.items():
        if name in API_ONLY:
            continue
        if name in API_REQUIRED:
            assert parameter.default is inspect.Parameter.empty, name
        else:
            assert _same_default(parameter.default, defaults[name]), name


def test_the_cli_keeps_the_flags_users_know() -> None:
    options = _cli_options()
    assert options["overrides"].opts == ["--set"]
    assert options["checkpoint_every_s"].opts == ["--checkpoint-every"]
    assert options["ledger"].opts == ["--ledger"]
    assert options["as_json"].opts == ["--json"]


def test_the_synthesizer_options_are_request_fields() -> None:
    parameters = inspect.signature(dpsynth.Synthesizer.__init__).parameters
    names = {n for n, p in parameters.items() if p.kind is inspect.Parameter.KEYWORD_ONLY}
    assert names <= set(FIELDS) - set(TEST_ONLY), names - set(FIELDS)
    defaults = _defaults()
    # `out` None is a private temporary run directory; `epsilon` is required
    for name in names - {"out", "epsilon"}:
        assert _same_default(parameters[name].default, defaults[name]), name
