"""The method lists come from the registry: the CLI's help, docs/commands.md and README.md.

The registry lists the backends and the kinds of data each takes without importing them
(`methods_summary`); these tests check that list against the backends themselves and the
docs against the list, so adding, removing or renaming a backend fails here until the docs
follow. The text between `<!-- methods -->` and `<!-- /methods -->` is
`methods_summary(code=True)`, written out.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import typer

from dpsynth.methods.registry import (
    get_method,
    method_names,
    methods_for,
    methods_summary,
    modalities_of,
)

ROOT = Path(__file__).resolve().parents[2]
GENERATED = re.compile(r"<!-- methods -->(.*?)<!-- /methods -->", re.S)
TABLE_ROW = re.compile(r"^\| \[`([a-z0-9_-]+)`\]\(docs/methods/\1\.md\) \|.*\| ([a-z, ]+) \|$")


@pytest.mark.parametrize("name", method_names())
def test_the_registry_knows_each_backends_kinds_of_data(name):
    assert modalities_of(name) == tuple(get_method(name).modalities)


def test_the_summary_lists_every_backend_by_kind_of_data():
    summary = methods_summary()
    assert set(methods_for("image")) | set(methods_for("table")) == set(method_names())
    for name in method_names():
        assert re.search(rf"\b{re.escape(name)}\b", summary), name
    assert summary.endswith(" for tables") and " for images; " in summary


@pytest.mark.parametrize("doc", ["README.md", "docs/commands.md"])
def test_the_docs_generated_list_is_the_registrys(doc):
    found = GENERATED.findall((ROOT / doc).read_text(encoding="utf-8"))
    assert found, f"{doc} has no <!-- methods --> list"
    expected = methods_summary(code=True)
    for text in found:
        assert text == expected, f"{doc}: the method list should read\n{expected}"


def test_the_readme_table_has_one_row_per_backend_with_its_data():
    rows = {}
    for line in (ROOT / "README.md").read_text(encoding="utf-8").splitlines():
        match = TABLE_ROW.match(line)
        if match:
            rows[match.group(1)] = match.group(2)
    assert set(rows) == set(method_names())
    words = {"image": "images", "table": "tables"}
    for name, data in rows.items():
        assert data == ", ".join(words[m] for m in modalities_of(name)), name
        assert (ROOT / "docs" / "methods" / f"{name}.md").is_file(), name


def test_the_train_help_lists_the_registrys_backends():
    from dpsynth.cli import app

    train = typer.main.get_command(app).commands["train"]  # type: ignore[attr-defined]
    (option,) = [p for p in train.params if p.name == "method"]
    assert methods_summary() in " ".join(option.help.split())
