"""`dpsynth ledger show|verify|head|budget`: read, check and cap the privacy ledger."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from dpsynth.cli.app import app, handle_errors, resolve_ledger_path
from dpsynth.cli.options import JsonOpt, LedgerOpt
from dpsynth.cli.render import emit_json, fmt_eps, print_rows, print_warnings, stdout
from dpsynth.errors import UsageError
from dpsynth.privacy.accounting.plan_check import NOT_DP_LABEL, not_dp_label

ledger_app = typer.Typer(help="Show, verify and cap the privacy spent per dataset.")
app.add_typer(ledger_app, name="ledger", no_args_is_help=True)


def _entry_eps(entry: dict) -> str:
    """An entry's ε for the table; a run labelled not a DP guarantee shows the label, never
    the ε its method claims."""
    if entry.get("kind") not in ("spend", "status"):
        return "0"
    if not_dp_label(entry.get("events") or ()):
        return f"∞ ({NOT_DP_LABEL})"
    return fmt_eps(entry.get("epsilon"))


@ledger_app.command("show")
@handle_errors
def ledger_show(
    dataset: Annotated[str | None, typer.Option(help="Only this dataset id.")] = None,
    ledger: LedgerOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """What was spent per dataset: entries, composed total ε, budget left."""
    from dpsynth.ledger import Ledger

    path = resolve_ledger_path(ledger)
    book = Ledger(path)
    datasets = book.summary()["datasets"]
    if dataset is not None:
        datasets = {k: v for k, v in datasets.items() if k == dataset}
    entries = [e for e in book.entries() if dataset is None or e.get("dataset_id") == dataset]
    if as_json:
        emit_json({"ledger": str(path), "datasets": datasets, "entries": entries})
        return
    if not entries:
        stdout.print(f"{path}: no entries" + (f" for {dataset}" if dataset else ""), markup=False)
        return
    totals = []
    for name, row in datasets.items():
        budget = row.get("budget") or {}
        private = row.get("private", True)
        totals.append(
            [
                name,
                f"{row.get('spends', 0)} ({row.get('open_spends', 0)})",
                str(row.get("releases", 0)),
                fmt_eps(row.get("total_epsilon")) if private else "∞ (NOT PRIVATE)",
                f"{row['delta']:g}" if row.get("delta") is not None else "-",
                fmt_eps(budget.get("epsilon")) if budget else "-",
                fmt_eps(row.get("remaining")) if budget else "-",
            ]
        )
    print_rows(
        f"privacy ledger {path}",
        ["dataset", "spends (open)", "releases", "total ε", "δ", "budget ε", "left ε"],
        totals,
    )
    for name, row in datasets.items():
        if row.get("linked_ids"):
            stdout.print(
                f"{name}: total includes the linked ids {', '.join(row['linked_ids'])} "
                "(same data by id or fingerprint)",
                markup=False,
            )
    rows = [
        [
            str(entry.get("seq")),
            str(entry.get("time", ""))[:19],
            entry.get("kind", ""),
            entry.get("dataset_id", ""),
            entry.get("command", "") or "",
            entry.get("method", "") or "",
            entry.get("run_id", "") or str(entry.get("ref", "")),
            entry.get("status", "") or "",
            _entry_eps(entry),
        ]
        for entry in entries
    ]
    columns = ["seq", "time", "kind", "dataset", "command", "method", "run", "status", "ε"]
    print_rows("entries", columns, rows)
    for entry in entries:
        label = not_dp_label(entry.get("events") or ()) if entry.get("kind") == "spend" else None
        if label:  # in full, whatever the terminal's width: no ε of this run is a bound
            stdout.print(
                f"seq {entry.get('seq')} (run {entry.get('run_id')}): NOT PRIVATE, {label}",
                markup=False,
            )
        public = entry.get("public") if entry.get("kind") == "spend" else None
        if isinstance(public, dict):  # declared-public images the run pretrained on
            used = ", ".join(map(str, public.get("used_by") or []))
            stdout.print(
                f"seq {entry.get('seq')} (run {entry.get('run_id')}): public input "
                f"{public.get('spec')} ({public.get('n')} images, sha256 "
                f"{str(public.get('content_digest'))[:12]}…; no ε), pretrained: {used}",
                markup=False,
            )


@ledger_app.command("verify")
@handle_errors
def ledger_verify(
    quick: Annotated[
        bool,
        typer.Option("--quick", help="Check the hash chain only, not the recorded totals."),
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
) -> None:
    """Recompute the hash chain and every total; exit 1 if any line was edited or moved, or if
    a run's spend or a published head is not in the chain (a cut or rewritten ledger)."""
    from dpsynth.ledger import Ledger
    from dpsynth.ledger.anchors import SpendAnchor
    from dpsynth.rundir import RunDir

    if more_runs and not against:
        raise UsageError("give run directories with --against RUN [RUN ...]")
    path = resolve_ledger_path(ledger)
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
        emit_json({"ledger": str(path), **result})
        return
    what = "chain intact" + ("" if quick else ", totals recomputed")
    stdout.print(
        f"[green]ok[/green]: {escape(str(path))}: {result.get('entries', 0)} entries, {what}"
    )
    for dataset, row in result.get("datasets", {}).items():
        stdout.print(
            f"  {dataset}: ε ≤ {fmt_eps(row.get('total_epsilon'))} at δ={row.get('delta')}",
            markup=False,
        )
    if result.get("other_accountant_seqs"):
        stdout.print(
            "  lines written by another accountant version, checked not to under-report: "
            + ", ".join(map(str, result["other_accountant_seqs"]))
        )
    if result.get("plain_digest_seqs"):
        stdout.print(
            "  lines from before the fingerprint key name their data by its plain digest (a "
            "membership test): do not publish this ledger as it is; lines "
            + ", ".join(map(str, result["plain_digest_seqs"])),
            markup=False,
        )
    if runs:
        stdout.print(
            f"  spends of {len(runs)} run(s) found in the chain: " + ", ".join(runs), markup=False
        )
    if head:
        stdout.print(f"  {len(head)} published head(s) found in the chain")


@ledger_app.command("head")
@handle_errors
def ledger_head(
    ledger: LedgerOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Print the ledger's head (last seq and hash) after checking the chain; keep or publish it,
    and `ledger verify --head HASH` later proves that nothing up to it was cut or rewritten."""
    from dpsynth.ledger import Ledger

    path = resolve_ledger_path(ledger)
    if not path.is_file():
        raise UsageError(f"no ledger at {path}")
    book = Ledger(path)
    book.verify(recompute=False)  # publish only the head of an intact chain
    found = book.head()
    if as_json:
        emit_json({"ledger": str(path), **found})
        return
    if found["seq"] is None:
        stdout.print(f"{path}: no entries (head {found['hash']})", markup=False)
        return
    stdout.print(f"{found['hash']}  seq {found['seq']}  {found['time']}  {path}", markup=False)


@ledger_app.command("budget")
@handle_errors
def ledger_budget(
    dataset: Annotated[str, typer.Option(help="Dataset id (as `data inspect` shows it).")],
    epsilon: Annotated[float, typer.Option(help="Cap on the dataset's total ε.")],
    delta: Annotated[float, typer.Option(help="δ at which the cap holds.")],
    ledger: LedgerOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Record a privacy budget cap for a dataset; later spends over it are refused (exit 3)."""
    from dpsynth.ledger import Ledger
    from dpsynth.privacy.accounting.compose import compose_epsilon, validate_probability_inputs

    validate_probability_inputs(epsilon, delta, 1.0, None)
    book = Ledger(resolve_ledger_path(ledger))
    entry = book.set_budget(dataset, epsilon, delta)
    spent = compose_epsilon(book.events_for(dataset), delta).epsilon
    out = {"dataset": dataset, "epsilon": epsilon, "delta": delta, "spent": spent, "entry": entry}
    if as_json:
        emit_json(out)
        return
    stdout.print(
        f"budget for {dataset}: ε ≤ {epsilon:g} at δ={delta:g} (spent so far: {fmt_eps(spent)})",
        markup=False,
    )
    if spent > epsilon:
        print_warnings([f"{dataset} has already spent more than the new cap"])
