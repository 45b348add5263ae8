"""What the CLI prints outside a terminal and in its help pages.

Piped output (stdout not a terminal) prints every value in full: rich used to fit tables to 80
columns and cut values (`ledger show | cat` printed `relea…`, `germa…`). Help pages read as
sentences: every command's and option's help text appears whole (not broken where its source
line ended, no `[...]` eaten as rich markup), and nothing is cut with "…" at 80 columns.
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys

import pytest
import typer
from rich.console import Console
from typer.testing import CliRunner

from dpsynth.cli import app, render

runner = CliRunner()
LONG_ID = "hospital-admissions-2019-2024-all-wards-" + "x" * 40


def _plain(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def test_piped_ledger_show_prints_long_values_in_full(tmp_path):
    ledger = tmp_path / ("a-ledger-with-a-rather-long-file-name-" + "y" * 30 + ".jsonl")
    cap = ["ledger", "budget", "--dataset", LONG_ID, "--epsilon", "1", "--delta", "1e-5"]
    assert runner.invoke(app, [*cap, "--ledger", str(ledger)]).exit_code == 0
    result = runner.invoke(app, ["ledger", "show", "--ledger", str(ledger)])
    assert result.exit_code == 0, result.output
    assert "…" not in result.output
    assert f"privacy ledger {ledger}" in result.output
    # One tab-separated line per dataset under a header line, whole values in each field.
    header = "dataset\tspends (open)\treleases\ttotal ε\tδ\tbudget ε\tleft ε"
    assert header in result.output.splitlines()
    row = next(line for line in result.output.splitlines() if line.startswith(LONG_ID))
    assert row.split("\t")[0] == LONG_ID and len(row.split("\t")) == 7
    entry = next(line for line in result.output.splitlines() if "\tbudget\t" in line)
    assert entry.split("\t")[3] == LONG_ID
    # --json is unchanged: one document with the same values.
    as_json = runner.invoke(app, ["ledger", "show", "--ledger", str(ledger), "--json"])
    document = json.loads(as_json.output)
    assert list(document["datasets"]) == [LONG_ID] and document["ledger"] == str(ledger)


def test_piped_key_value_output_prints_in_full_through_a_real_pipe(tmp_path):
    from dpsynth.data.sources import load_data
    from dpsynth.ledger import Ledger

    ledger = tmp_path / "ledger.jsonl"
    Ledger(ledger).data_fingerprint(load_data("digits").content_digest)  # makes the key
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    inspect = ["data", "inspect", "digits", "--ledger", str(ledger)]
    command = [sys.executable, "-m", "dpsynth.cli", *inspect]
    piped = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
    facts = json.loads(runner.invoke(app, [*inspect, "--json"]).output)
    lines = piped.stdout.splitlines()
    assert lines[0] == "data"
    # the keyed fingerprint, 85 characters, whole
    assert f"ledger fingerprint: {facts['fingerprint']}" in lines
    assert len(facts["fingerprint"]) == 85
    assert f"dataset id: {facts['dataset_id']}" in lines
    assert "…" not in piped.stdout and "│" not in piped.stdout


def test_terminal_tables_show_values_as_text_not_markup(monkeypatch):
    screen = io.StringIO()
    monkeypatch.setattr(render, "stdout", Console(file=screen, width=120, force_terminal=True))
    monkeypatch.setattr(render, "stdout_is_terminal", lambda: True)
    render.print_kv("run", [("out", "runs/[bold]odd[/bold]")])
    render.print_rows("ledger", ["dataset"], [["ward-[7]"]])
    shown = _plain(screen.getvalue())
    assert "runs/[bold]odd[/bold]" in shown and "ward-[7]" in shown
    assert "│" in shown  # a rich table on a terminal


def test_terminal_tables_wrap_long_values_instead_of_cutting_them(monkeypatch):
    screen = io.StringIO()
    monkeypatch.setattr(render, "stdout", Console(file=screen, width=40, force_terminal=True))
    monkeypatch.setattr(render, "stdout_is_terminal", lambda: True)
    fingerprint = "f" * 64
    render.print_kv("run", [("fingerprint", fingerprint)])
    render.print_rows("ledger", ["dataset", "ε"], [["d" * 50, "1"]])
    shown = _plain(screen.getvalue())
    assert "…" not in shown
    assert shown.count("f") == len(fingerprint) + 1  # the value and the f of "fingerprint"
    assert shown.count("d") == 50 + 2  # the value and the d's of "ledger" and "dataset"
    assert max(len(line) for line in shown.splitlines()) <= 40


def _commands() -> list[tuple[list[str], object]]:
    """Every command path with its click command (the root, the groups, the leaves)."""
    found = []

    def walk(command, path):
        found.append((path, command))
        for name, sub in getattr(command, "commands", {}).items():
            walk(sub, [*path, name])

    walk(typer.main.get_command(app), [])
    return found


COMMANDS = _commands()
IDS = [" ".join(path) or "dpsynth" for path, _ in COMMANDS]


def _help(path: list[str], columns: int) -> str:
    result = runner.invoke(app, [*path, "--help"], env={"COLUMNS": str(columns)})
    assert result.exit_code == 0, result.output
    return _plain(result.output)


@pytest.mark.parametrize(("path", "command"), COMMANDS, ids=IDS)
def test_help_at_80_columns_cuts_nothing(path, command):
    page = _help(path, 80)
    assert "…" not in page, page
    assert max(len(line) for line in page.splitlines()) <= 80


def _whole(text: str) -> str:
    """A help text as it should read: its words on one line, brackets literal."""
    return " ".join(text.replace("\\[", "[").split())


@pytest.mark.parametrize(("path", "command"), COMMANDS, ids=IDS)
def test_help_texts_read_whole(path, command):
    page = [" ".join(line.split()) for line in _help(path, 1000).splitlines()]
    texts = [
        param.help
        for param in command.params
        if getattr(param, "help", None) and not getattr(param, "hidden", False)
    ]
    # Each sub-command's first paragraph in the group's command list.
    texts += [sub.help.split("\n\n")[0] for sub in getattr(command, "commands", {}).values()]
    # The command's own paragraphs.
    texts += (command.help or "").split("\n\n")
    for text in texts:
        expected = _whole(text)
        assert any(expected in line for line in page), f"not whole in the help: {expected!r}"
