"""The Typer app of the `dpsynth` command: errors → one line and an exit code, the one-line
usage errors, the `--debug` and `--threads` every command (or every one with numeric work) has,
`--version` and the entry point; the options' types are in `options.py`.

Errors are one line on stderr with the exit code of their class (2 usage, 3 budget, 4 data,
1 anything else); `--debug` shows the traceback instead. The commands live in one module per
command group (`calibrate`, `train`, `sample`, `evaluate`, `ledger`, `data`) and register
themselves on `app` when `dpsynth.cli` imports them.
"""

from __future__ import annotations

import functools
import inspect
import os
import signal
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.markup import escape

from dpsynth import __version__
from dpsynth.cli.flags import cli_message
from dpsynth.cli.options import DebugOpt, ThreadsOpt
from dpsynth.cli.render import stderr
from dpsynth.errors import DpsynthError

try:  # recent typer versions vendor click as typer._click; older ones use click itself
    from typer._click import exceptions as click_errors
except ImportError:  # pragma: no cover
    from click import exceptions as click_errors  # type: ignore[no-redef]


class _OneLineErrors(typer.core.TyperGroup):
    """The root command group, with usage errors (bad flag values, unknown commands or options)
    printed as one `error: ...` line and exit 2 instead of typer's boxed panel, and every help
    text tidied for the help pages (`tidy_help`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        tidy_help(self)

    def main(self, *args: Any, standalone_mode: bool = True, **kwargs: Any) -> Any:
        try:
            code = super().main(*args, standalone_mode=False, **kwargs)
        except click_errors.NoArgsIsHelpError as exc:
            exc.show()  # the help page: what a bare `dpsynth ledger` should print
            code = exc.exit_code
        except click_errors.ClickException as exc:
            command = f" (see `{exc.ctx.command_path} --help`)" if getattr(exc, "ctx", None) else ""
            message = " ".join(exc.format_message().split()).rstrip(".")
            stderr.print(f"[red]error:[/red] {escape(message)}{command}", highlight=False)
            code = exc.exit_code
        except typer.Abort:
            stderr.print("aborted", highlight=False)
            code = 1
        if not standalone_mode:
            return code
        sys.exit(code if isinstance(code, int) else 0)


def tidy_help(command: Any) -> None:
    """Make the help texts of `command`, its options and (recursively) its sub-commands read as
    sentences on any width: the line breaks of a docstring's paragraphs become spaces (typer
    keeps them in the command list and in later paragraphs, so a sentence broke where the source
    line ended), and square brackets are escaped (typer reads help as rich markup, which ate
    `[default: ...]` and `[png]`)."""
    command.help = _flow(command.help)
    command.short_help = _flow(command.short_help)
    for param in getattr(command, "params", ()):
        if getattr(param, "help", None):
            param.help = _flow(param.help)
    for sub in getattr(command, "commands", {}).values():
        tidy_help(sub)


def _flow(text: str | None) -> str | None:
    """Paragraphs (split at blank lines) each on one line, with rich markup escaped."""
    if not text:
        return text
    paragraphs = inspect.cleandoc(text).split("\n\n")
    return "\n\n".join(escape(" ".join(p.split())) for p in paragraphs)


app = typer.Typer(
    cls=_OneLineErrors,
    rich_markup_mode="rich",
    name="dpsynth",
    help="Differentially private synthetic data, with a ledger of every privacy spend.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
F = TypeVar("F", bound=Callable[..., Any])


def resolve_ledger_path(path: Path | None) -> Path:
    """The `--ledger` path, or the default ($DPSYNTH_LEDGER, else ./dpsynth-ledger.jsonl)."""
    from dpsynth.ledger import default_ledger_path

    return path if path is not None else default_ledger_path()


def handle_errors(func: F) -> F:
    """Turn library errors into one line on stderr and the right exit code; `--debug` (added
    to the command's options here unless it declares it) shows the traceback instead."""
    declares_debug = "debug" in inspect.signature(func).parameters

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        debug = bool(kwargs.get("debug") if declares_debug else kwargs.pop("debug", False))
        try:
            return func(*args, **kwargs)
        except typer.Exit:
            raise
        except DpsynthError as exc:
            if debug:
                raise
            if getattr(exc, "quiet", False):  # another process reports it (torchrun's rank 0)
                raise typer.Exit(exc.exit_code) from None
            line = escape(cli_message(exc))  # the parameters it names written as flags
            stderr.print(f"[red]error:[/red] {_rank_prefix()}{line}", highlight=False)
            raise typer.Exit(exc.exit_code) from None
        except KeyboardInterrupt as exc:
            # `train` says where it stopped and how to go on; a bare Ctrl-C says nothing more.
            detail = f": {exc}" if str(exc) else ""
            stderr.print(f"interrupted{escape(detail)}", highlight=False)
            raise typer.Exit(130) from None
        except Exception as exc:
            if debug:
                raise
            stderr.print(
                f"[red]unexpected error:[/red] {_rank_prefix()}{exc.__class__.__name__}: "
                f"{escape(str(exc))} "
                "(run again with --debug for the traceback)",
                highlight=False,
            )
            raise typer.Exit(1) from None

    if not declares_debug:
        _add_option(wrapper, func, "debug", DebugOpt, False)
    return wrapper  # type: ignore[return-value]


def threads_option(func: F) -> F:
    """Give a command `--threads` (the CPU threads of its numeric work), applied by the
    option's own callback as soon as it is parsed; the command itself never sees it."""

    @functools.wraps(func)
    def wrapper(*args: Any, threads: int | None = None, **kwargs: Any) -> Any:
        return func(*args, **kwargs)

    _add_option(wrapper, func, "threads", ThreadsOpt, None, before=("ledger", "as_json"))
    return wrapper  # type: ignore[return-value]


def _add_option(
    wrapper: Callable[..., Any],
    func: Callable[..., Any],
    name: str,
    annotation: Any,
    default: Any,
    before: tuple[str, ...] = (),
) -> None:
    """Typer reads a command's options from its signature: `wrapper`'s is `func`'s with the
    option `name` added before the first of the parameters `before` (else last), so that
    `--help` lists it where the commands have always had it."""
    params = list(inspect.signature(func, eval_str=True).parameters.values())
    at = next((i for i, p in enumerate(params) if p.name in before), len(params))
    option = inspect.Parameter(
        name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default, annotation=annotation
    )
    params.insert(at, option)
    wrapper.__signature__ = inspect.Signature(params, return_annotation=None)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {**func.__annotations__, name: annotation}


def _rank_prefix() -> str:
    """`rank N: ` on a torchrun rank other than 0 (whose errors are its own), else nothing."""
    from dpsynth.distributed import is_main_process

    return "" if is_main_process() else f"rank {os.environ.get('RANK')}: "


def _version_callback(value: bool) -> None:
    if value:
        sys.stdout.write(f"dpsynth {__version__}\n")
        raise typer.Exit()


@app.callback()
def _root(
    ctx: typer.Context,
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_version_callback,
            is_eager=True,
            help="Print the version and exit.",
        ),
    ] = False,
) -> None:
    """dpsynth: differentially private synthetic data with a privacy ledger."""
    # Under torchrun with several processes, only `train` knows how to share the work; any
    # other command would run W times over the same outputs and ledger.
    if ctx.invoked_subcommand not in (None, "train") and _launched_processes() > 1:
        from dpsynth.distributed import is_main_process

        if is_main_process():
            stderr.print(
                f"[red]error:[/red] only `dpsynth train` runs under torchrun with several "
                f"processes; run `dpsynth {ctx.invoked_subcommand}` directly",
                highlight=False,
            )
        raise typer.Exit(2)


def _launched_processes() -> int:
    """WORLD_SIZE as torchrun sets it (1 outside torchrun or when unreadable)."""
    try:
        return int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        return 1


def main() -> None:
    """Console-script entry point."""
    # torch's forward-mode AD (the score-matching loss uses jvp) loads its decompositions with
    # torch.jit.script, which warns on every run; it is torch's internals, not ours to act on.
    warnings.filterwarnings(
        "ignore", message=r"`torch\.jit\.script` is deprecated", category=FutureWarning
    )
    # A plain `kill` (SIGTERM) ends a command as Ctrl-C does: `sample` removes its staging
    # folder, `train` stops at the next step boundary with a checkpoint (it installs its own
    # handlers while its loop runs: dpsynth.training.interrupts), and the exit is one line (130).
    signal.signal(signal.SIGTERM, _interrupt)
    app()


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt
