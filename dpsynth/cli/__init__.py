"""The `dpsynth` command line: parses flags, calls the library, renders (rich or --json).

Only this package prints. `app.py` holds the Typer app, the error handling and the shared
options; `render.py` the output; one module per command group registers its commands.
"""

from dpsynth.cli.app import app, main

# Importing the command modules registers their commands on the app; the order here is the
# order of `dpsynth --help`, so keep it.
# isort: off
from dpsynth.cli import calibrate, train, sample, evaluate  # noqa: F401
from dpsynth.cli import ledger, data, audit, cache  # noqa: F401

# isort: on

__all__ = ["app", "main"]
