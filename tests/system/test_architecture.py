"""The import rules of ARCHITECTURE.md, checked on the source (every import, also in functions).

- `dpsynth.privacy` stands alone: it imports only itself, `dpsynth.errors` and the version
  (never the ledger).
- `dpsynth.ledger` imports only itself, `dpsynth.privacy`, `dpsynth.errors` and the version.
- `dpsynth.data` imports only itself and `dpsynth.errors`.
- A method never imports another method (`methods.base`, `methods.template`,
  `methods.registry` and the shared `methods.blocks` are not methods); only the registry lists
  them all.
- Nothing imports the CLI, and only the CLI prints (no `print(` elsewhere in the package).
- The floors, top to bottom: cli → api → evaluation / auditing → sampling → training →
  methods → data / privacy / ledger and the foundations → errors; a module imports only its own
  floor and those below.
- Inside `dpsynth.privacy` the same holds for its sub-packages: releases → mechanisms →
  accounting (the events are accounting's); the package's own `__init__` imports none of them.
- The package root `dpsynth` is a foundation (floor 0): it imports only `dpsynth.errors` at
  import time. Its one reference upwards is its public face, the PEP 562 `__getattr__` that
  imports `dpsynth.api` when an API name (`dpsynth.train`, ...) is first used, so a module below
  the API may take only `__version__` and the errors from the root, never an API name.
- No module imports in a circle (lazy imports inside functions count too).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "dpsynth"
SHARED_METHOD_MODULES = {"base", "sampler", "settings", "template", "registry", "blocks"}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Every dpsynth module `path` imports, absolute or relative, at any depth."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names)
    return {name for name in found if name == "dpsynth" or name.startswith("dpsynth.")}


def _sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _method_of(module: str) -> str | None:
    """`pge` for dpsynth.methods.pge[.x]; None outside methods or for shared modules."""
    parts = module.split(".")
    if len(parts) < 3 or parts[1] != "methods" or parts[2] in SHARED_METHOD_MODULES:
        return None
    return parts[2]


def _allowed(importer: str, imported: str) -> bool:
    if importer.startswith("dpsynth.privacy"):
        return imported.startswith(("dpsynth.privacy", "dpsynth.errors")) or imported in {
            "dpsynth",
            "dpsynth.__version__",
        }
    if importer.startswith("dpsynth.ledger"):
        return imported.startswith(
            ("dpsynth.ledger", "dpsynth.privacy", "dpsynth.errors")
        ) or imported in {"dpsynth", "dpsynth.__version__"}
    if importer.startswith("dpsynth.data"):
        return imported.startswith(("dpsynth.data", "dpsynth.errors")) or imported == "dpsynth"
    return True


# (package prefix, floor): higher floors may import lower ones, never the reverse.
FLOORS = (
    ("dpsynth.errors", 0),
    *((name, 1) for name in (
        "dpsynth.privacy", "dpsynth.ledger", "dpsynth.data", "dpsynth.rundir",
        "dpsynth.staging", "dpsynth.distributed", "dpsynth.threads",
    )),
    ("dpsynth.methods", 2),
    ("dpsynth.training", 3),
    ("dpsynth.sampling", 4),
    ("dpsynth.evaluation", 5),
    ("dpsynth.auditing", 5),
    ("dpsynth.api", 6),
    ("dpsynth.cli", 7),
)  # fmt: skip


ROOT = PACKAGE / "__init__.py"


def _root_api_names() -> set[str]:
    """The names the root resolves lazily from `dpsynth.api` (its `_API` tuple)."""
    for node in ast.parse(ROOT.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "_API" for t in node.targets
        ):
            return {elt.value for elt in node.value.elts}  # type: ignore[attr-defined]
    raise AssertionError("dpsynth/__init__.py has no _API tuple")


API_FLOOR = dict(FLOORS)["dpsynth.api"]
ROOT_API = frozenset(f"dpsynth.{name}" for name in _root_api_names())


def _floor(module: str) -> int | None:
    if module in ROOT_API:  # `from dpsynth import train`: the API, through the root's face
        return API_FLOOR
    if module == "dpsynth" or module.startswith("dpsynth.__"):  # the root and its __version__
        return 0
    for prefix, floor in FLOORS:
        if module == prefix or module.startswith(prefix + "."):
            return floor
    return None


def test_the_rules_see_every_module_and_its_imports() -> None:
    modules = {_module_name(p) for p in _sources()}
    assert {
        "dpsynth.ledger.spends",
        "dpsynth.privacy.accounting.plan",
        "dpsynth.training",
    } <= modules
    # the parser finds imports inside functions too (the CLI imports lazily)
    train_command = next(p for p in _sources() if _module_name(p) == "dpsynth.cli.train")
    assert any(name.startswith("dpsynth.api") for name in _imports(train_command))


@pytest.mark.parametrize("path", _sources(), ids=lambda p: _module_name(p))
def test_layer_imports(path: Path) -> None:
    importer = _module_name(path)
    bad = sorted(name for name in _imports(path) if not _allowed(importer, name))
    assert not bad, f"{importer} may not import {bad} (see ARCHITECTURE.md)"


@pytest.mark.parametrize("path", _sources(), ids=lambda p: _module_name(p))
def test_no_method_imports_another_and_nothing_imports_the_cli(path: Path) -> None:
    importer = _module_name(path)
    own = _method_of(importer)
    for name in _imports(path):
        other = _method_of(name)
        if own is not None and other is not None:
            assert other == own, f"method {own} imports method {other} ({importer} → {name})"
        if not importer.startswith("dpsynth.cli"):
            assert not name.startswith("dpsynth.cli"), f"{importer} imports the CLI ({name})"


@pytest.mark.parametrize("path", _sources(), ids=lambda p: _module_name(p))
def test_only_the_cli_prints(path: Path) -> None:
    if _module_name(path).startswith("dpsynth.cli"):
        return
    tree = ast.parse(path.read_text(encoding="utf-8"))
    prints = [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "print"
    ]
    assert not prints, f"{_module_name(path)} calls print() at lines {prints}"


def _module_edges(path: Path, modules: set[str]) -> set[str]:
    """The dpsynth modules `path` imports: `from P import name` is an edge to the module
    `P.name` when there is one (a submodule), else to `P`."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    edges: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            edges.update(alias.name for alias in node.names if alias.name in modules)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            for alias in node.names:
                if f"{target}.{alias.name}" in modules:
                    edges.add(f"{target}.{alias.name}")
                elif target in modules:
                    edges.add(target)
    return edges - {module}


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of `graph` (its modules in order, the first repeated), or None."""
    done: set[str] = set()
    for start in sorted(graph):
        path: list[str] = []
        on_path: set[str] = set()
        stack = [(start, iter(sorted(graph[start])))]
        if start in done:
            continue
        path.append(start)
        on_path.add(start)
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                stack.pop()
                path.pop()
                on_path.discard(node)
                done.add(node)
            elif child in on_path:
                return [*path[path.index(child) :], child]
            elif child not in done and child in graph:
                stack.append((child, iter(sorted(graph[child]))))
                path.append(child)
                on_path.add(child)
    return None


def test_the_cycle_check_finds_a_circle() -> None:
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_no_module_imports_in_a_circle() -> None:
    modules = {_module_name(p) for p in _sources()}
    graph = {_module_name(p): _module_edges(p, modules) for p in _sources()}
    # the edges resolve submodules: evaluation.report reaches sampling through the package
    assert "dpsynth.sampling" in graph["dpsynth.evaluation.report"]
    assert "dpsynth.evaluation.downstream" in graph["dpsynth.evaluation.report"]
    cycle = _find_cycle(graph)
    assert cycle is None, "import circle: " + " → ".join(cycle or [])


@pytest.mark.parametrize("path", _sources(), ids=lambda p: _module_name(p))
def test_every_module_has_a_floor_and_imports_only_below_it(path: Path) -> None:
    importer = _module_name(path)
    floor = _floor(importer)
    assert floor is not None, f"{importer} is on no floor: add it to FLOORS and ARCHITECTURE.md"
    above = sorted(n for n in _imports(path) if (_floor(n) or 0) > floor)
    assert not above, f"{importer} (floor {floor}) imports {above} from a floor above it"


def test_the_root_floor_counts_api_names_as_the_api() -> None:
    assert _floor("dpsynth") == 0 and _floor("dpsynth.__version__") == 0
    assert _floor("dpsynth.train") == _floor("dpsynth.evaluate") == API_FLOOR
    assert _floor("dpsynth.evaluation.report") == _floor("dpsynth.auditing") == 5
    assert {"dpsynth.Ledger", "dpsynth.audit", "dpsynth.Synthesizer"} <= ROOT_API


def test_the_package_root_imports_only_the_errors_and_the_api_on_first_use() -> None:
    """The root's eager imports are foundations; `importlib.import_module` is called once,
    inside the module `__getattr__`, with `dpsynth.api` (the lazy re-export of the API)."""
    tree = ast.parse(ROOT.read_text(encoding="utf-8"))
    eager = {name for name in _imports(ROOT) if name != "dpsynth"}
    assert eager and all(_floor(name) == 0 for name in eager), sorted(eager)
    assert not any(isinstance(node, ast.ClassDef) for node in tree.body)  # no module class
    lazy = [
        (function.name, call.args[0].value if call.args else None)
        for function in tree.body
        if isinstance(function, ast.FunctionDef)
        for call in ast.walk(function)
        if isinstance(call, ast.Call)
        and isinstance(call.func, ast.Attribute)
        and call.func.attr == "import_module"
    ]
    assert lazy == [("__getattr__", "dpsynth.api")]
    assert "sys.modules" not in ROOT.read_text(encoding="utf-8")


# Inside dpsynth.privacy, bottom to top: a sub-package imports only its own and those below;
# `engine` (the public PrivacyEngine) sits on top.
PRIVACY_LAYERS = ("accounting", "mechanisms", "releases", "engine")


def _privacy_layer(module: str) -> int | None:
    parts = module.split(".")
    if len(parts) < 3 or parts[:2] != ["dpsynth", "privacy"]:
        return None
    return PRIVACY_LAYERS.index(parts[2]) if parts[2] in PRIVACY_LAYERS else None


def _privacy_sources() -> list[Path]:
    return [p for p in _sources() if _module_name(p).startswith("dpsynth.privacy")]


def test_the_privacy_layers_are_every_privacy_module() -> None:
    modules = {_module_name(p) for p in _privacy_sources()}
    assert {"dpsynth.privacy.accounting.events", "dpsynth.privacy.releases.frequency"} <= modules
    assert {m for m in modules if _privacy_layer(m) is None} == {"dpsynth.privacy"}
    init = PACKAGE / "privacy" / "__init__.py"
    assert not _imports(init), "dpsynth.privacy's __init__ imports nothing"


@pytest.mark.parametrize("path", _privacy_sources(), ids=lambda p: _module_name(p))
def test_privacy_imports_only_its_own_layer_and_below(path: Path) -> None:
    importer = _module_name(path)
    layer = _privacy_layer(importer)
    if layer is None:
        return
    above = sorted(n for n in _imports(path) if (_privacy_layer(n) or 0) > layer)
    names = " → ".join(reversed(PRIVACY_LAYERS))
    assert not above, f"{importer} imports {above} from a privacy layer above it ({names})"


def test_the_privacy_layer_check_sees_an_upward_import() -> None:
    assert _privacy_layer("dpsynth.privacy.releases.classifier") == 2
    assert _privacy_layer("dpsynth.privacy.accounting.plan_check") == 0
    assert _privacy_layer("dpsynth.privacy") is None and _privacy_layer("dpsynth.errors") is None


MAX_MODULE_LINES = 400  # small modules with one idea each (ARCHITECTURE.md)


def test_no_module_is_over_the_size_limit() -> None:
    sizes = {_module_name(p): len(p.read_text().splitlines()) for p in _sources()}
    over = {name: n for name, n in sizes.items() if n > MAX_MODULE_LINES}
    assert not over, f"modules over {MAX_MODULE_LINES} lines: {over}"


# The training layer takes a run's records through `dpsynth.data.records.Records`: rows in
# memory are one engine among the others, never a twin path asked for by type.
RECORD_TYPES = re.compile(r"isinstance\([^)]*\b(TableData|TableSource)\b")


def test_the_training_layer_never_asks_which_records_it_has() -> None:
    asking = [
        f"{_module_name(p)}:{i}"
        for p in sorted((PACKAGE / "training").glob("*.py"))
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if RECORD_TYPES.search(line)
    ]
    assert not asking, f"branches on TableData/TableSource: {asking}"


def test_the_record_type_check_sees_a_branch() -> None:
    assert RECORD_TYPES.search("    if isinstance(data.records, TableSource):")
    assert RECORD_TYPES.search("if not isinstance(records, (ImageData, TableData)):")
    assert not RECORD_TYPES.search("if records.rows_in_memory:")
