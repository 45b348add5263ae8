"""docs/api.md against the API: it names every public name of `dpsynth.__all__`, the names its
examples import exist, and its Python examples run (tiny presets, in a scratch folder)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

import dpsynth
from dpsynth.data.builtin_tables import TABLES_DIR

DOC = Path(__file__).resolve().parents[2] / "docs" / "api.md"
TEXT = DOC.read_text(encoding="utf-8")
EXAMPLES = re.findall(r"^```python\n(.*?)^```", TEXT, flags=re.M | re.S)


def _code_words() -> set[str]:
    """Every identifier written in the page's code (inline spans and fenced blocks)."""
    spans = re.findall(r"`([^`\n]+)`", re.sub(r"^```.*?^```", "", TEXT, flags=re.M | re.S))
    return {word for code in [*spans, *EXAMPLES] for word in re.findall(r"[A-Za-z_]\w*", code)}


def test_the_page_names_every_public_name() -> None:
    missing = sorted(set(dpsynth.__all__) - _code_words())
    assert not missing, f"docs/api.md does not name {missing}"


def test_every_public_name_resolves() -> None:
    for name in dpsynth.__all__:
        assert getattr(dpsynth, name) is not None, name


def test_the_examples_compile_and_import_names_that_exist() -> None:
    assert len(EXAMPLES) >= 3
    for code in EXAMPLES:
        compile(code, str(DOC), "exec")
        for names in re.findall(r"^from dpsynth import (.+)$", code, flags=re.M):
            for name in names.split(","):
                assert hasattr(dpsynth, name.strip()), name
        for attribute in re.findall(r"\bdpsynth\.(\w+)", code):
            assert hasattr(dpsynth, attribute), attribute


def test_the_examples_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, one_torch_thread
) -> None:
    monkeypatch.chdir(tmp_path)
    # the DataFrame example reads "credit.csv": here, the bundled german-credit table
    shutil.copy(TABLES_DIR / "german_credit.csv", tmp_path / "credit.csv")
    shutil.copy(TABLES_DIR / "german_credit.schema.json", tmp_path / "credit.schema.json")
    for code in EXAMPLES:
        exec(compile(code, str(DOC), "exec"), {"__name__": "docs_api"})
    ledger = dpsynth.Ledger(tmp_path / "ledger.jsonl")
    # the digits run, its sample and report, and the DataFrame fit and sample: all recorded
    assert {e.get("command") for e in ledger.entries()} >= {"train", "sample", "evaluate"}
