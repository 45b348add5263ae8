"""The `dpsynth` command line: parses flags, calls the library, renders (rich or --json).

Only this module prints. Errors are one line on stderr with the exit code of their class
(2 usage, 3 budget, 4 data, 1 anything else); `--debug` shows the traceback instead.
"""

from __future__ import annotations

import functools
import json
import math
import os
import signal
import sys
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from dpsynth import __version__
from dpsynth.errors import DpsynthError, UsageError

try:  # recent typer versions vendor click as typer._click; older ones use click itself
    from typer._click import exceptions as click_errors
except ImportError:  # pragma: no cover
    from click import exceptions as click_errors  # type: ignore[no-redef]


class _OneLineErrors(typer.core.TyperGroup):
    """The root command group, with usage errors (bad flag values, unknown commands or options)
    printed as one `error: ...` line and exit 2 instead of typer's boxed panel."""

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


app = typer.Typer(
    cls=_OneLineErrors,
    name="dpsynth",
    help="Differentially private synthetic data, with a ledger of every privacy spend.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
ledger_app = typer.Typer(help="Show, verify and cap the privacy spent per dataset.")
data_app = typer.Typer(help="List built-in data sets and inspect data specs.")
app.add_typer(ledger_app, name="ledger", no_args_is_help=True)
app.add_typer(data_app, name="data", no_args_is_help=True)

stdout = Console(soft_wrap=True)
stderr = Console(stderr=True, soft_wrap=True)

F = TypeVar("F", bound=Callable[..., Any])

JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document, nothing else.")]
LedgerOpt = Annotated[
    Path | None,
    typer.Option(
        "--ledger",
        help="Ledger file [default: $DPSYNTH_LEDGER or ./dpsynth-ledger.jsonl].",
        show_default=False,
    ),
]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="No progress bars.")]
DebugOpt = Annotated[bool, typer.Option("--debug", help="Show tracebacks on errors.")]
DeviceOpt = Annotated[str, typer.Option("--device", help="auto, cpu or cuda.")]
ClassesOpt = Annotated[
    str | None,
    typer.Option(
        "--classes",
        help="The public label set a,b,... (needed for npz: without a stored classes array).",
    ),
]
ChannelsOpt = Annotated[
    int | None,
    typer.Option(
        "--channels", help="Convert images to 1 or 3 channels (needed for mixed folders)."
    ),
]


def _ledger_path(path: Path | None) -> Path:
    from dpsynth.privacy.ledger import default_ledger_path

    return path if path is not None else default_ledger_path()


def handle_errors(func: F) -> F:
    """Turn library errors into one line on stderr and the right exit code."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        debug = bool(kwargs.get("debug"))
        try:
            return func(*args, **kwargs)
        except typer.Exit:
            raise
        except DpsynthError as exc:
            if debug:
                raise
            stderr.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
            raise typer.Exit(exc.exit_code) from None
        except KeyboardInterrupt:
            stderr.print("interrupted", highlight=False)
            raise typer.Exit(130) from None
        except Exception as exc:
            if debug:
                raise
            stderr.print(
                f"[red]unexpected error:[/red] {exc.__class__.__name__}: {escape(str(exc))} "
                "(run again with --debug for the traceback)",
                highlight=False,
            )
            raise typer.Exit(1) from None

    return wrapper  # type: ignore[return-value]


def _emit_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(_json_ready(obj), indent=2) + "\n")


def _json_ready(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return "inf" if obj > 0 else ("-inf" if obj < 0 else "nan")
    if isinstance(obj, dict):
        return {str(k): _json_ready(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_ready(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    return obj


def _show_progress(quiet: bool, as_json: bool) -> bool:
    return not quiet and not as_json and sys.stdout.isatty() and sys.stderr.isatty()


def _fmt_eps(value: Any) -> str:
    if value in (None, "inf") or (isinstance(value, float) and math.isinf(value)):
        return "∞ (not private)"
    return f"{float(value):.4g}"


def _kv_table(title: str, rows: list[tuple[str, Any]]) -> Table:
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    for key, value in rows:
        table.add_row(key, str(value))
    return table


def _warn(lines: list[str]) -> None:
    for line in lines:
        stderr.print(f"[yellow]warning:[/yellow] {escape(line)}", highlight=False)


# ----------------------------------------------------------------------------- calibrate


@app.command()
@handle_errors
def calibrate(
    epsilon: Annotated[
        float | None, typer.Option(help="Target ε (total for the dataset with --dataset).")
    ] = None,
    delta: Annotated[
        float | None, typer.Option(help="δ [default: the budget's δ, else 1e-5].")
    ] = None,
    sampling_rate: Annotated[float | None, typer.Option(help="Poisson sampling rate q.")] = None,
    batch_size: Annotated[int | None, typer.Option(help="Expected batch size B (q = B/N).")] = None,
    dataset_size: Annotated[int | None, typer.Option(help="Number of records N.")] = None,
    steps: Annotated[int | None, typer.Option(help="Number of steps T.")] = None,
    epochs: Annotated[float | None, typer.Option(help="Epochs E (T = ceil(E/q)).")] = None,
    noise_multiplier: Annotated[
        float | None, typer.Option(help="σ: report ε (or the most steps, with --epsilon).")
    ] = None,
    dataset: Annotated[
        str | None, typer.Option(help="Dataset id in the ledger whose earlier spends count.")
    ] = None,
    ledger: LedgerOpt = None,
    as_json: JsonOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Noise multiplier for a target (ε, δ), sampling rate and length; or ε for a given noise."""
    from dpsynth.privacy import accounting

    q, n = _sampling_rate(sampling_rate, batch_size, dataset_size)
    length = _length(steps, epochs, q)
    prior: tuple[dict, ...] = ()
    budget_info: dict[str, Any] | None = None
    if dataset is not None:
        from dpsynth.privacy.ledger import Ledger

        book = Ledger(_ledger_path(ledger))
        prior = book.events_for(dataset)
        budget = book.budget_for(dataset)
        if budget is not None:
            if delta is None:
                delta = float(budget["delta"])
            if epsilon is None and noise_multiplier is None:
                epsilon = float(budget["epsilon"])
            spent = accounting.compose_epsilon(prior, float(budget["delta"])).epsilon
            budget_info = {
                "epsilon": float(budget["epsilon"]),
                "delta": float(budget["delta"]),
                "spent": spent,
                # Composition is not additive: the σ reported is what fits; this is a guide.
                "headroom": float(budget["epsilon"]) - spent,
            }
    delta = 1e-5 if delta is None else delta
    warnings: list[str] = []
    if n is not None and delta >= 1.0 / n:
        warnings.append(f"δ={delta:g} is not below 1/N = {1.0 / n:.3g}; use a smaller --delta")
    if epsilon is not None and noise_multiplier is not None:
        if length is not None:
            raise UsageError(
                "give at most two of --epsilon, --noise-multiplier and --steps/--epochs"
            )
        result = accounting.max_steps(noise_multiplier, epsilon, delta, q, prior)
        mode = "max_steps"
    elif noise_multiplier is not None:
        if length is None:
            raise UsageError("--noise-multiplier needs --steps or --epochs (or --epsilon)")
        result = accounting.epsilon_report(noise_multiplier, delta, q, length, prior)
        mode = "epsilon"
    elif epsilon is not None:
        if length is None:
            raise UsageError("--epsilon needs --steps or --epochs (or --noise-multiplier)")
        result = accounting.calibrate_noise(epsilon, delta, q, length, prior)
        mode = "noise_multiplier"
    else:
        raise UsageError("give --epsilon (to find the noise) or --noise-multiplier (to find ε)")
    out = {"mode": mode, **result.to_json(), "dataset": dataset, "warnings": warnings}
    if budget_info is not None:
        out["budget"] = budget_info
    if as_json:
        _emit_json(out)
        return
    _warn(warnings)
    rows = [
        ("noise multiplier σ", f"{result.noise_multiplier:.4f}"),
        ("steps T", result.steps),
        ("sampling rate q", f"{result.sampling_rate:.6g}"),
        ("δ", f"{result.delta:g}"),
        ("ε (this run alone)", _fmt_eps(result.epsilon)),
    ]
    if prior:
        rows += [
            ("ε already spent", _fmt_eps(result.prior_epsilon)),
            ("ε total after this run", _fmt_eps(result.total_epsilon)),
        ]
    if budget_info is not None:
        rows.append(
            (
                "budget cap",
                f"ε={budget_info['epsilon']:g} at δ={budget_info['delta']:g}, "
                f"spent {_fmt_eps(budget_info['spent'])}, headroom {budget_info['headroom']:.4g}",
            )
        )
    rows.append(("accountant", result.accountant))
    stdout.print(_kv_table(f"calibrate ({mode.replace('_', ' ')})", rows))
    for note in result.notes:
        stderr.print(f"note: {note}", highlight=False)


def _sampling_rate(
    sampling_rate: float | None, batch_size: int | None, dataset_size: int | None
) -> tuple[float, int | None]:
    if sampling_rate is not None:
        if batch_size is not None:
            raise UsageError("give either --sampling-rate or --batch-size with --dataset-size")
        return sampling_rate, dataset_size
    if batch_size is None or dataset_size is None:
        raise UsageError("give --sampling-rate, or --batch-size together with --dataset-size")
    if dataset_size < 1 or batch_size < 1:
        raise UsageError("--batch-size and --dataset-size must be positive")
    if batch_size > dataset_size:
        raise UsageError(
            f"--batch-size {batch_size} exceeds --dataset-size {dataset_size} (q would be > 1)"
        )
    return batch_size / dataset_size, dataset_size


def _length(steps: int | None, epochs: float | None, q: float) -> int | None:
    if steps is not None and epochs is not None:
        raise UsageError("give either --steps or --epochs, not both")
    if epochs is not None:
        if not (epochs > 0 and math.isfinite(epochs)):
            raise UsageError(f"--epochs must be positive, got {epochs}")
        if not (0 < q <= 1):
            raise UsageError(f"the sampling rate must be in (0, 1], got {q}")
        return max(1, math.ceil(epochs / q - 1e-9))
    if steps is not None and steps < 1:
        raise UsageError(f"--steps must be at least 1, got {steps}")
    return steps


# ----------------------------------------------------------------------------- ledger


@ledger_app.command("show")
@handle_errors
def ledger_show(
    dataset: Annotated[str | None, typer.Option(help="Only this dataset id.")] = None,
    ledger: LedgerOpt = None,
    as_json: JsonOpt = False,
    debug: DebugOpt = False,
) -> None:
    """What was spent per dataset: entries, composed total ε, budget left."""
    from dpsynth.privacy.ledger import Ledger

    path = _ledger_path(ledger)
    book = Ledger(path)
    datasets = book.summary()["datasets"]
    if dataset is not None:
        datasets = {k: v for k, v in datasets.items() if k == dataset}
    entries = [e for e in book.entries() if dataset is None or e.get("dataset_id") == dataset]
    if as_json:
        _emit_json({"ledger": str(path), "datasets": datasets, "entries": entries})
        return
    if not entries:
        stdout.print(f"{path}: no entries" + (f" for {dataset}" if dataset else ""))
        return
    table = Table(title=f"privacy ledger {path}", title_justify="left")
    for column in ("dataset", "spends (open)", "releases", "total ε", "δ", "budget ε", "left ε"):
        table.add_column(column)
    for name, row in datasets.items():
        budget = row.get("budget") or {}
        private = row.get("private", True)
        table.add_row(
            name,
            f"{row.get('spends', 0)} ({row.get('open_spends', 0)})",
            str(row.get("releases", 0)),
            _fmt_eps(row.get("total_epsilon")) if private else "∞ (NOT PRIVATE)",
            f"{row['delta']:g}" if row.get("delta") is not None else "-",
            _fmt_eps(budget.get("epsilon")) if budget else "-",
            _fmt_eps(row.get("remaining")) if budget else "-",
        )
    stdout.print(table)
    for name, row in datasets.items():
        if row.get("linked_ids"):
            stdout.print(
                f"{name}: total includes the linked ids {', '.join(row['linked_ids'])} "
                "(same data by id or fingerprint)"
            )
    detail = Table(title="entries", title_justify="left")
    for column in ("seq", "time", "kind", "dataset", "command", "method", "run", "status", "ε"):
        detail.add_column(column)
    for entry in entries:
        detail.add_row(
            str(entry.get("seq")),
            str(entry.get("time", ""))[:19],
            entry.get("kind", ""),
            entry.get("dataset_id", ""),
            entry.get("command", "") or "",
            entry.get("method", "") or "",
            entry.get("run_id", "") or str(entry.get("ref", "")),
            entry.get("status", "") or "",
            _fmt_eps(entry.get("epsilon")) if entry.get("kind") in ("spend", "status") else "0",
        )
    stdout.print(detail)


@ledger_app.command("verify")
@handle_errors
def ledger_verify(
    quick: Annotated[
        bool, typer.Option(help="Check the hash chain only, not the recorded totals.")
    ] = False,
    against: Annotated[
        list[Path] | None,
        typer.Option(
            "--against",
            help="Run directories whose spend (seq and hash) must be in the chain: "
            "--against RUN [RUN ...].",
        ),
    ] = None,
    more_runs: Annotated[
        list[Path] | None, typer.Argument(help="Further run directories for --against.")
    ] = None,
    head: Annotated[
        list[str] | None,
        typer.Option("--head", help="A head hash published earlier (`ledger head`)."),
    ] = None,
    ledger: LedgerOpt = None,
    as_json: JsonOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Recompute the hash chain and every total; exit 1 if any line was edited or moved, or if
    a run's spend or a published head is not in the chain (a cut or rewritten ledger)."""
    from dpsynth.privacy.anchors import SpendAnchor
    from dpsynth.privacy.ledger import Ledger
    from dpsynth.runs import RunDir

    if more_runs and not against:
        raise UsageError("give run directories with --against RUN [RUN ...]")
    path = _ledger_path(ledger)
    if not path.exists():
        raise UsageError(f"no ledger at {path}: nothing to verify (check --ledger)")
    runs: dict[str, tuple[int, str]] = {}
    for run_dir in [*(against or []), *(more_runs or [])]:
        anchor = SpendAnchor.from_run_config(RunDir(run_dir).read_config(), str(run_dir))
        runs[str(run_dir)] = (anchor.seq, anchor.hash)
    result = Ledger(path).verify(recompute=not quick, runs=runs, heads=list(head or []))
    result["runs_checked"] = list(runs)
    result["heads_checked"] = list(head or [])
    if as_json:
        _emit_json({"ledger": str(path), **result})
        return
    what = "chain intact" + ("" if quick else ", totals recomputed")
    stdout.print(f"[green]ok[/green]: {path}: {result.get('entries', 0)} entries, {what}")
    for dataset, row in result.get("datasets", {}).items():
        stdout.print(
            f"  {dataset}: ε ≤ {_fmt_eps(row.get('total_epsilon'))} at δ={row.get('delta')}"
        )
    if result.get("other_accountant_seqs"):
        stdout.print(
            "  lines written by another accountant version, checked not to under-report: "
            + ", ".join(map(str, result["other_accountant_seqs"]))
        )
    if runs:
        stdout.print(f"  spends of {len(runs)} run(s) found in the chain: " + ", ".join(runs))
    if head:
        stdout.print(f"  {len(head)} published head(s) found in the chain")


@ledger_app.command("head")
@handle_errors
def ledger_head(
    ledger: LedgerOpt = None,
    as_json: JsonOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Print the ledger's head (last seq and hash) after checking the chain; keep or publish it,
    and `ledger verify --head HASH` later proves that nothing up to it was cut or rewritten."""
    from dpsynth.privacy.ledger import Ledger

    path = _ledger_path(ledger)
    if not path.is_file():
        raise UsageError(f"no ledger at {path}")
    book = Ledger(path)
    book.verify(recompute=False)  # publish only the head of an intact chain
    found = book.head()
    if as_json:
        _emit_json({"ledger": str(path), **found})
        return
    if found["seq"] is None:
        stdout.print(f"{path}: no entries (head {found['hash']})")
        return
    stdout.print(f"{found['hash']}  seq {found['seq']}  {found['time']}  {path}")


@ledger_app.command("budget")
@handle_errors
def ledger_budget(
    dataset: Annotated[str, typer.Option(help="Dataset id (as `data inspect` shows it).")],
    epsilon: Annotated[float, typer.Option(help="Cap on the dataset's total ε.")],
    delta: Annotated[float, typer.Option(help="δ at which the cap holds.")],
    ledger: LedgerOpt = None,
    as_json: JsonOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Record a privacy budget cap for a dataset; later spends over it are refused (exit 3)."""
    from dpsynth.privacy.accounting import compose_epsilon, validate_probability_inputs
    from dpsynth.privacy.ledger import Ledger

    validate_probability_inputs(epsilon, delta, 1.0, None)
    book = Ledger(_ledger_path(ledger))
    entry = book.set_budget(dataset, epsilon, delta)
    spent = compose_epsilon(book.events_for(dataset), delta).epsilon
    out = {"dataset": dataset, "epsilon": epsilon, "delta": delta, "spent": spent, "entry": entry}
    if as_json:
        _emit_json(out)
        return
    stdout.print(
        f"budget for {dataset}: ε ≤ {epsilon:g} at δ={delta:g} (spent so far: {_fmt_eps(spent)})"
    )
    if spent > epsilon:
        _warn([f"{dataset} has already spent more than the new cap"])


# ----------------------------------------------------------------------------- data


@data_app.command("list")
@handle_errors
def data_list(as_json: JsonOpt = False, debug: DebugOpt = False) -> None:
    """Built-in real data sets (no download needed)."""
    from dpsynth.data.sources import list_builtin

    items = list_builtin()
    if as_json:
        _emit_json(items)
        return
    table = Table(title="built-in data sets", title_justify="left")
    for column in ("name", "records (train/test)", "shape", "classes", "description"):
        table.add_column(column)
    for item in items:
        table.add_row(
            item["name"],
            f"{item['n']}/{item['n_test']}",
            "x".join(map(str, item["shape"])),
            str(len(item["classes"])),
            item.get("description", ""),
        )
    stdout.print(table)
    stdout.print(
        "Your own data: mnist:DIR[:test] (IDX files), folder:DIR (one sub-folder per class), "
        "npz:FILE (x, y arrays; a `classes` array or --classes a,b,...: the label set is public)."
    )


@data_app.command("inspect")
@handle_errors
def data_inspect(
    spec: Annotated[str, typer.Argument(help="A data spec, e.g. digits or folder:DIR.")],
    image_size: Annotated[int | None, typer.Option(help="Resize images to this size.")] = None,
    classes: ClassesOpt = None,
    channels: ChannelsOpt = None,
    as_json: JsonOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Public facts about a data set (size, shape, classes, fingerprint); no statistics."""
    from dpsynth.data.sources import inspect_data, parse_classes

    info = inspect_data(
        spec, image_size=image_size, classes=parse_classes(classes), channels=channels
    )
    if as_json:
        _emit_json(info)
        return
    rows = [
        ("spec", info["spec"]),
        ("kind", info["kind"]),
        ("records", info["n"]),
        ("shape [C,H,W]", info["shape"]),
        ("classes", ", ".join(info["classes"])),
        ("dataset id", info["dataset_id"]),
        ("fingerprint", info["fingerprint"]),
    ]
    stdout.print(_kv_table("data", rows))


# ----------------------------------------------------------------------------- train


def _parse_sets(items: list[str] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items or []:
        if "=" not in item:
            raise UsageError(f"--set takes key=value, got {item!r}")
        key, value = item.split("=", 1)
        out[key.strip()] = value.strip()
    return out


@contextmanager
def _progress_bar(enabled: bool, description: str) -> Iterator[Progress | None]:
    if not enabled:
        yield None
        return
    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=stderr,
        transient=False,
    )
    with progress:
        yield progress


@app.command()
@handle_errors
def train(
    out: Annotated[Path, typer.Option("--out", help="Run directory to create (or resume).")],
    method: Annotated[str | None, typer.Option(help="Backend: pge or dpkernel.")] = None,
    data: Annotated[str | None, typer.Option(help="Data spec (see `dpsynth data list`).")] = None,
    epsilon: Annotated[
        str | None,
        typer.Option(help="Total ε for the dataset after this run, or 'inf' (not private)."),
    ] = None,
    delta: Annotated[float | None, typer.Option(help="δ [default: below 1/N].")] = None,
    preset: Annotated[str, typer.Option(help="tiny, small or paper.")] = "small",
    seed: Annotated[
        int,
        typer.Option(
            help="Seed for public randomness only (weight initialisation, preview). Batches "
            "and DP noise come from a fresh secret seed kept in RUN/private/."
        ),
    ] = 0,
    resume: Annotated[bool, typer.Option(help="Continue the run in --out.")] = False,
    log_private_loss: Annotated[
        bool,
        typer.Option(
            "--log-private-loss",
            help="Write the losses of private batches (computed without noise) to "
            "RUN/private/train-loss.jsonl and show them in the progress bar. Not private: "
            "never publish them.",
        ),
    ] = False,
    set_: Annotated[
        list[str] | None, typer.Option("--set", help="Override a preset value: key=value.")
    ] = None,
    image_size: Annotated[int | None, typer.Option(help="Resize images to this size.")] = None,
    dataset_id: Annotated[
        str | None, typer.Option(help="Ledger id of the data [default: from the spec].")
    ] = None,
    classes: ClassesOpt = None,
    channels: ChannelsOpt = None,
    checkpoint_every: Annotated[float, typer.Option(help="Seconds between checkpoints.")] = 120.0,
    device: DeviceOpt = "auto",
    ledger: LedgerOpt = None,
    as_json: JsonOpt = False,
    quiet: QuietOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Train a generator under DP; the spend is reserved in the ledger before any data is read."""
    from dpsynth.data.sources import parse_classes
    from dpsynth.training import train_run

    if not resume:
        missing = [
            flag
            for flag, value in (("--method", method), ("--data", data), ("--epsilon", epsilon))
            if value is None
        ]
        if missing:
            raise UsageError(f"missing {', '.join(missing)} (or use --resume)")
    show = _show_progress(quiet, as_json)
    with _progress_bar(show, "train") as bar:
        task = None

        def on_progress(p: Any) -> None:
            nonlocal task
            if bar is None:
                return
            if task is None:
                task = bar.add_task("train", total=p.total_steps, info="")
            eps = "ε=∞ (not private)" if math.isinf(p.epsilon) else f"ε≤{p.epsilon:.3g}"
            # The loss is shown only when the owner asked for it (--log-private-loss).
            loss = "" if p.loss is None else f"loss {p.loss:.4g}  "
            bar.update(task, completed=p.step, info=f"{loss}{eps}")

        result = train_run(
            method=method or "",
            data=data or "",
            epsilon=epsilon if epsilon is not None else "inf",
            delta=delta,
            preset=preset,
            out=out,
            # --resume without --ledger (or $DPSYNTH_LEDGER): the run's recorded ledger.
            ledger_path=(
                None
                if resume and ledger is None and not os.environ.get("DPSYNTH_LEDGER")
                else _ledger_path(ledger)
            ),
            device=device,
            seed=seed,
            resume=resume,
            overrides=_parse_sets(set_),
            image_size=image_size,
            dataset_id=dataset_id,
            classes=parse_classes(classes),
            channels=channels,
            checkpoint_every_s=checkpoint_every,
            progress=on_progress,
            log_private_loss=log_private_loss,
        )
    if as_json:
        _emit_json(result)
        return
    _warn(list(result.get("warnings", [])))
    if result.get("already_finished"):
        stdout.print(f"{out}: this run already finished ({result['steps']} steps); nothing to do")
    privacy = (
        "NOT PRIVATE (--epsilon inf: no clipping, no noise)"
        if not result["private"]
        else f"(ε ≤ {_fmt_eps(result['epsilon'])}, δ = {result['delta']:g})-DP"
    )
    rows = [
        ("run", result["run"]),
        ("method / preset", f"{result['method']} / {result['preset']}"),
        ("privacy", privacy),
        ("steps", f"{result['steps']} of {result['total_steps']}"),
        ("noise multiplier σ", f"{result['noise_multiplier']:.4f}"),
        ("sampling rate q", f"{result['sampling_rate']:.4g}"),
        ("dataset total ε", _fmt_eps(result["dataset_total_epsilon"])),
        ("accountant", result["accountant"]),
        ("ledger entry", f"seq {result['ledger_seq']} ({result['ledger_status']})"),
    ]
    if result.get("preview"):
        rows.append(("preview", result["preview"]))
    stdout.print(_kv_table("train", rows))


# ----------------------------------------------------------------------------- sample


@app.command()
@handle_errors
def sample(
    run: Annotated[Path, typer.Argument(help="A run directory written by `train`.")],
    n: Annotated[int, typer.Option("--n", help="Number of records to generate.")],
    out: Annotated[Path, typer.Option("--out", help="Output folder.")],
    fmt: Annotated[str, typer.Option("--format", help="png or npz.")] = "png",
    labels: Annotated[
        str, typer.Option(help="balanced, or per-class counts a,b,c,... summing to --n.")
    ] = "balanced",
    batch_size: Annotated[int, typer.Option(help="Images generated at once.")] = 500,
    seed: Annotated[int, typer.Option(help="Sampling seed.")] = 0,
    force: Annotated[bool, typer.Option(help="Replace a non-empty --out.")] = False,
    device: DeviceOpt = "auto",
    ledger: LedgerOpt = None,
    as_json: JsonOpt = False,
    quiet: QuietOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Write synthetic images from a trained run (post-processing: no privacy cost)."""
    from dpsynth.sampling import sample_run

    show = _show_progress(quiet, as_json)
    with _progress_bar(show, "sample") as bar:
        task = bar.add_task("sample", total=n, info="") if bar is not None else None

        def on_progress(done: int, total: int) -> None:
            if bar is not None and task is not None:
                bar.update(task, completed=done)

        result = sample_run(
            run,
            n,
            out,
            fmt=fmt,
            labels=labels,
            batch_size=batch_size,
            seed=seed,
            device=device,
            force=force,
            ledger_path=ledger,
            progress=on_progress,
        )
    if as_json:
        _emit_json(result)
        return
    stdout.print(
        f"wrote {result['n']} images to {result['out']} ({result['format']}); "
        f"{result['privacy']}; sha256 {result['output_sha256'][:16]}…"
    )


# ----------------------------------------------------------------------------- evaluate


@app.command()
@handle_errors
def evaluate(
    synthetic: Annotated[
        str, typer.Option(help="A folder written by `sample` (class sub-folders) or a run dir.")
    ],
    real: Annotated[str, typer.Option(help="Held-out real data spec, e.g. digits:test.")],
    metrics: Annotated[
        str, typer.Option(help="Comma list: fid, accuracy, precision, recall.")
    ] = "fid,accuracy",
    classifier: Annotated[str, typer.Option(help="cnn or logreg.")] = "cnn",
    seeds: Annotated[int, typer.Option(help="Classifier seeds (mean and std).")] = 3,
    n: Annotated[
        int | None, typer.Option("--n", help="Synthetic images to use (or to draw from a run).")
    ] = None,
    report: Annotated[
        Path | None, typer.Option(help="Write report.json/.md and PNGs here.")
    ] = None,
    inception_weights: Annotated[
        Path | None, typer.Option(help="TorchScript TF-Inception weights file.")
    ] = None,
    real_train: Annotated[
        str | None, typer.Option(help="Real training spec for the upper-bound accuracy.")
    ] = None,
    classes: ClassesOpt = None,
    channels: ChannelsOpt = None,
    device: DeviceOpt = "auto",
    ledger: LedgerOpt = None,
    as_json: JsonOpt = False,
    quiet: QuietOpt = False,
    debug: DebugOpt = False,
) -> None:
    """FID and downstream accuracy of synthetic images against held-out real data."""
    from dpsynth.data.sources import parse_classes
    from dpsynth.evaluate.report import run_evaluation

    show = _show_progress(quiet, as_json)
    with _progress_bar(show, "evaluate") as bar:
        tasks: dict[str, Any] = {}

        def on_progress(stage: str, done: int, total: int) -> None:
            if bar is None:
                return
            if stage not in tasks:
                tasks[stage] = bar.add_task(stage, total=total, info="")
            bar.update(tasks[stage], completed=done, total=total)

        result = run_evaluation(
            synthetic=synthetic,
            real=real,
            metrics=[m.strip() for m in metrics.split(",") if m.strip()],
            classifier=classifier,
            seeds=seeds,
            n=n,
            report_dir=report,
            inception_weights=inception_weights,
            device=device,
            real_train=real_train,
            real_classes=parse_classes(classes),
            real_channels=channels,
            ledger_path=_ledger_path(ledger),
            progress=on_progress,
        )
    if as_json:
        _emit_json(result)
        return
    _warn(list(result.get("warnings", [])))
    rows: list[tuple[str, Any]] = [("synthetic", result.get("synthetic")), ("real", real)]
    if result.get("non_private"):
        rows.append(("privacy", "NOT PRIVATE: evaluated on data a DP run spent budget on"))
    found = result.get("metrics", {})
    if "fid" in found:
        fid = found["fid"]
        rows.append(
            (
                "FID",
                f"{fid['value']:.3f} (n={fid.get('n_synthetic')} synthetic vs "
                f"{fid.get('n_real')} real from {fid.get('reference', real)})",
            )
        )
    for key in ("precision", "recall"):
        if key in found:
            rows.append((key, f"{found[key]['value']:.3f}"))
    if "accuracy" in found:
        acc = found["accuracy"]
        rows.append(
            (
                f"accuracy ({acc.get('classifier')})",
                f"{acc['mean']:.4f} ± {acc['std']:.4f} over {len(acc.get('per_seed', []))} seeds",
            )
        )
        if acc.get("real_train_accuracy") is not None:
            rows.append(("accuracy, real-trained", f"{acc['real_train_accuracy']:.4f}"))
    if result.get("report_dir"):
        rows.append(("report", os.path.join(str(result["report_dir"]), "report.md")))
    stdout.print(_kv_table("evaluate", rows))


# ----------------------------------------------------------------------------- entry


def _version_callback(value: bool) -> None:
    if value:
        sys.stdout.write(f"dpsynth {__version__}\n")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version_callback, is_eager=True, help="Version."),
    ] = False,
) -> None:
    """dpsynth: differentially private synthetic data with a privacy ledger."""


def main() -> None:
    """Console-script entry point."""
    # torch's forward-mode AD (the score-matching loss uses jvp) loads its decompositions with
    # torch.jit.script, which warns on every run; it is torch's internals, not ours to act on.
    warnings.filterwarnings(
        "ignore", message=r"`torch\.jit\.script` is deprecated", category=FutureWarning
    )
    # A plain `kill` (SIGTERM) ends a command as Ctrl-C does: `train` checkpoints, `sample`
    # removes its staging folder, and the exit is the one-line "interrupted" (130).
    signal.signal(signal.SIGTERM, _interrupt)
    app()


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    main()
