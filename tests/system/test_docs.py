"""The docs against the code: the command reference (docs/commands.md) and the CLI list the same
commands and options, every `dpsynth ...` command line written in the docs, the examples and
the Makefile uses commands and options that exist, and every relative link in README.md and
docs/**/*.md resolves to a file (and its #anchor to a heading).

The CLI side is read from the Typer app itself (`typer.main.get_command(app)`), so renaming,
adding or removing a flag fails here until the reference follows.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import typer

from dpsynth.cli import app

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "commands.md"
MARKDOWN = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
SCRIPTS = [ROOT / "Makefile", *sorted((ROOT / "examples").glob("*.sh"))]

# Flags of other programs that the reference shows next to dpsynth's (the torchrun launcher).
FOREIGN_FLAGS = {
    "--nproc-per-node",
    "--nnodes",
    "--rdzv-backend",
    "--rdzv-endpoint",
    "--rdzv-id",
    "--no-python",
}
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
SECTION = re.compile(r"^#{2,3} `dpsynth ([a-z ]+)`\s*$")


def _cli() -> dict[str, dict[str, bool]]:
    """Each command path ("" for the root, "ledger show") → {option name: hidden}: every name
    the parser accepts (long, short and secondary names)."""
    out: dict[str, dict[str, bool]] = {}

    def walk(command, path: list[str]) -> None:
        options = {
            name: bool(getattr(param, "hidden", False))
            for param in command.params
            if param.param_type_name == "option"
            for name in (*param.opts, *param.secondary_opts)
        }
        options["--help"] = False
        out[" ".join(path)] = options
        for name, sub in getattr(command, "commands", {}).items():
            walk(sub, [*path, name])

    walk(typer.main.get_command(app), [])
    return out


CLI = _cli()
GROUPS = {path for path in CLI if any(p.startswith(f"{path} ") for p in CLI if path)}
LEAVES = {path for path in CLI if path and path not in GROUPS}
ALL_FLAGS = {name for options in CLI.values() for name in options}


def _sections(text: str) -> dict[str, list[str]]:
    """The reference's command sections: command path → the section's lines."""
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        found = SECTION.match(line)
        if found:
            current = sections.setdefault(found.group(1).strip(), [])
        elif line.startswith("## "):
            current = None  # a section that is not a command's ends the command's
        elif current is not None:
            current.append(line)
    return sections


def _option_table_flags(lines: list[str]) -> set[str]:
    """The flags named in the first column of a section's option table."""
    flags: set[str] = set()
    for line in lines:
        if line.startswith("| `"):
            first_cell = re.split(r"(?<!\\)\|", line)[1]
            flags |= set(FLAG.findall(first_cell))
    return flags


def test_reference_sections_are_the_cli_commands():
    sections = _sections(REFERENCE.read_text())
    assert set(sections) == LEAVES, (
        f"in docs/commands.md, not in the CLI: {sorted(set(sections) - LEAVES)}; "
        f"in the CLI, not in docs/commands.md: {sorted(LEAVES - set(sections))}"
    )


@pytest.mark.parametrize("command", sorted(LEAVES))
def test_reference_lists_exactly_the_options_of(command):
    documented = _option_table_flags(_sections(REFERENCE.read_text()).get(command, []))
    options = CLI[command]
    unknown = documented - set(options)
    assert not unknown, f"docs/commands.md lists options `dpsynth {command}` lacks: {unknown}"
    missing = {
        name
        for name, hidden in options.items()
        if name.startswith("--") and name != "--help" and not hidden and name not in documented
    }
    assert not missing, f"`dpsynth {command}` options missing from docs/commands.md: {missing}"


def test_every_flag_in_the_reference_exists():
    text = REFERENCE.read_text()
    unknown = set(FLAG.findall(text)) - ALL_FLAGS - FOREIGN_FLAGS
    assert not unknown, f"docs/commands.md names flags no dpsynth command has: {sorted(unknown)}"
    shorts = {n for options in CLI.values() for n in options if not n.startswith("--")}
    assert all(f"`{short}`" in text for short in shorts), "a short option is not in the reference"


def _code(text: str, markdown: bool) -> list[str]:
    """The code of a file: fenced blocks and inline spans of Markdown, or a whole script, as
    logical lines (backslash continuations joined)."""
    if not markdown:
        return text.replace("\\\n", " ").splitlines()
    pieces: list[str] = []
    fenced = re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.M | re.S)
    for block in fenced:
        pieces += block.replace("\\\n", " ").splitlines()
    prose = re.sub(r"^```[^\n]*\n.*?^```", "", text, flags=re.M | re.S)
    pieces += re.findall(r"`([^`\n]+)`", prose)
    return pieces


def _command_lines(path: Path) -> list[tuple[str, list[str]]]:
    """Each `dpsynth ...` invocation in the file: (command path, the flags given to it)."""
    found = []
    for line in _code(path.read_text(), markdown=path.suffix == ".md"):
        # dpsynth as the program: at the start, after a path (`$(BIN)/dpsynth`) or torchrun's
        # --no-python; not as an argument of another program (`ruff check dpsynth tests`).
        program = r"(?:^|(?<=/)|(?<=--no-python ))dpsynth ((?:[a-z][a-z-]* ?)+|--)"
        line = line.strip()
        for match in re.finditer(program, line):
            words = line[match.start(1) :]
            words = re.split(r"\s(?:\||;|&&|>|#)\s?", words)[0].split()
            command = words[0] if words else ""
            if command.startswith("-"):
                command = ""
            elif command in GROUPS and len(words) > 1:
                command = f"{command} {words[1]}"
            found.append((command, FLAG.findall(" ".join(words))))
    return found


@pytest.mark.parametrize("path", MARKDOWN + SCRIPTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_command_lines_use_existing_commands_and_options(path):
    for command, flags in _command_lines(path):
        assert command in CLI, f"{path.name}: `dpsynth {command}` is not a command"
        unknown = set(flags) - set(CLI[command])
        assert not unknown, f"{path.name}: `dpsynth {command}` has no option {sorted(unknown)}"


def test_the_reference_and_readme_show_command_lines():
    # Guard against a parser that silently finds nothing to check.
    assert len(_command_lines(REFERENCE)) > 20
    assert len(_command_lines(ROOT / "README.md")) > 15


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, markup and punctuation dropped, spaces → -."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").lower().strip()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.M | re.S)
    seen: dict[str, int] = {}
    anchors = set()
    for heading in re.findall(r"^#{1,6} (.+?)\s*$", text, flags=re.M):
        slug = _slug(heading)
        anchors.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return anchors


@pytest.mark.parametrize("path", MARKDOWN, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path):
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.M | re.S)
    text = re.sub(r"`[^`\n]*`", "", text)  # code spans are not links
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z][a-z+.-]*:", target):  # https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        assert linked.exists(), f"{path.name}: link to {target} does not resolve"
        if anchor and linked.suffix == ".md":
            assert anchor in _anchors(linked), f"{path.name}: no heading for #{anchor} in {target}"


def test_slug_follows_github():
    assert _slug("`dpsynth ledger show`") == "dpsynth-ledger-show"
    assert _slug("What `ledger verify` can detect") == "what-ledger-verify-can-detect"
    assert _slug("Multi-GPU and multi-node") == "multi-gpu-and-multi-node"


# Size limits: the front door stays a front door, the leaderboard holds the runs of record only
# (git history keeps the superseded ones), bench/results keeps only the files the docs cite,
# and bench/ modules stay as small as the package's.
README_MAX_LINES = 150
LEADERBOARD_MAX_LINES = 400
RESULTS_MAX_FILES = 60
BENCH_MAX_LINES = 400
# What git keeps of bench/results: .gitignore ignores everything there but the dated folders.
DATED_FOLDER = re.compile(r"^\d{4}-\d{2}-\d{2}-")


def _lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def test_the_readme_and_the_leaderboard_stay_short():
    readme = _lines(ROOT / "README.md")
    assert readme <= README_MAX_LINES, (
        f"README.md has {readme} lines (at most {README_MAX_LINES}): move detail into docs/"
    )
    board = _lines(ROOT / "docs" / "leaderboard.md")
    assert board <= LEADERBOARD_MAX_LINES, (
        f"docs/leaderboard.md has {board} lines (at most {LEADERBOARD_MAX_LINES}): keep the runs "
        "of record and their current figures; git history keeps the superseded ones"
    )


def test_bench_results_keeps_only_the_runs_of_record():
    results = ROOT / "bench" / "results"
    kept = [
        path
        for folder in results.iterdir()
        if folder.is_dir() and DATED_FOLDER.match(folder.name)
        for path in folder.rglob("*")
        if path.is_file()
    ]
    assert len(kept) <= RESULTS_MAX_FILES, (
        f"bench/results holds {len(kept)} files (at most {RESULTS_MAX_FILES}): keep only what "
        "the docs cite (docs/benchmarks.md#results)"
    )


def test_bench_modules_are_as_small_as_the_packages():
    too_long = {
        path.name: _lines(path)
        for path in (ROOT / "bench").glob("*.py")
        if _lines(path) > BENCH_MAX_LINES
    }
    assert not too_long, f"bench modules over {BENCH_MAX_LINES} lines: {too_long}; split them"
