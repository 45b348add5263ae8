"""The library's parameter names as the CLI's flags: a library error names the parameter it is
about (`UsageError("{epsilon} must be positive", parameter="epsilon")`, see `dpsynth.errors`),
and the CLI prints it as the flag the user typed (`--epsilon must be positive`)."""

from __future__ import annotations

from dpsynth.errors import DpsynthError

# Parameters whose flag is not `--` + the name with dashes (the API's names are Pythonic).
_FLAGS = {
    "checkpoint_every_s": "--checkpoint-every",
    "ledger_path": "--ledger",
    "overrides": "--set",
    "report_dir": "--report",
    "fmt": "--format",
    "real_classes": "--classes",
    "real_channels": "--channels",
    "schema_path": "--schema",
}


def flag_of(parameter: str) -> str:
    """The CLI flag of a library parameter: `schema_epsilon` → `--schema-epsilon`."""
    return _FLAGS.get(parameter, "--" + parameter.replace("_", "-"))


def cli_message(exc: BaseException) -> str:
    """An error's one line as the CLI prints it: the parameters it names written as flags."""
    if isinstance(exc, DpsynthError) and exc.parameters:
        return exc.render(flag_of)
    return str(exc)
