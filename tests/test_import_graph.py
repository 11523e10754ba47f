"""The package's shape: no import cycle inside ``src/marginface`` and no source file over
:data:`MAX_LINES` lines (docs/architecture, issue 24). Read from the AST, nothing is imported."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "marginface"
MAX_LINES = 600

KNOWN_LONG_FILES: tuple[str, ...] = ()
"""Files allowed over MAX_LINES (none: every file of the package is held to the limit)."""


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(path): path for path in sorted((SRC / PACKAGE).rglob("*.py"))}


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules that ``name`` imports at any level of its source (function-level
    imports included: a cycle through them is still a cycle of the design)."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            targets = [module] + [f"{module}.{alias.name}" for alias in node.names]
        for target in targets:
            while target and target not in known:  # the deepest module named
                target = target.rpartition(".")[0]
            if target and target != name and target.startswith(PACKAGE):
                found.add(target)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {name: _imports(name, path, known) for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each sorted; a
    package's ``__init__`` importing its own submodules is not a cycle unless they import the
    package back."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return components


def _without_parent_packages(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Drop edges from a module to a package that contains it (``from . import x`` inside the
    package is how Python loads siblings; the package's ``__init__`` re-exporting its
    submodules is not a dependency of theirs on it)."""
    return {
        name: {other for other in targets if not name.startswith(other + ".")}
        for name, targets in graph.items()
    }


def test_the_finder_sees_a_cycle() -> None:
    """The checker itself: a two-module cycle and a three-module one are found."""
    graph = {"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"e"}, "e": {"c"}, "f": {"a"}}
    assert _cycles(graph) == [["a", "b"], ["c", "d", "e"]]


def test_the_import_reader_resolves_relative_imports() -> None:
    graph = _graph()
    assert "marginface.executors.chunk_loop" in graph["marginface.executors.chunked_function"]
    assert "marginface.margins.base" in graph["marginface.executors.chunk_plan"]


def test_no_import_cycle_in_the_package() -> None:
    cycles = _cycles(_without_parent_packages(_graph()))
    assert cycles == [], f"import cycles: {cycles}"


@pytest.mark.parametrize("name", sorted(_modules()))
def test_no_source_file_over_the_line_limit(name: str) -> None:
    path = _modules()[name]
    relative = path.relative_to(SRC).as_posix()
    lines = len(path.read_text(encoding="utf-8").splitlines())
    if relative in KNOWN_LONG_FILES:
        pytest.skip(f"{relative}: {lines} lines, a known exception while its redesign lands")
    assert lines <= MAX_LINES, f"{relative} has {lines} lines (limit {MAX_LINES})"


def _imported_modules(name: str, path: Path) -> list[tuple[int, str]]:
    """``(line, module)`` of every ``from MODULE import ...`` of the package in ``name``'s
    source (relative ones resolved), function-level imports included."""
    is_package = path.name == "__init__.py"
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.ImportFrom) or not node.module:
            continue
        if node.level:
            base = name.split(".") if is_package else name.split(".")[:-1]
            module = ".".join([*base[: len(base) - (node.level - 1)], node.module])
        else:
            module = node.module
        if module.split(".")[0] == PACKAGE:
            found.append((node.lineno, module))
    return found


def test_every_import_of_the_package_names_a_module_that_exists() -> None:
    """A module moved by a refactor leaves no import behind, function-level (lazy) ones
    included: those fail only when their function runs (``FaceModel(RUN)`` once imported
    ``marginface.train.run_state`` after it had moved to ``train/state/``)."""
    modules = _modules()
    missing = [
        f"{path.relative_to(SRC).as_posix()}:{line}: {module}"
        for name, path in modules.items()
        for line, module in _imported_modules(name, path)
        if module not in modules
    ]
    assert missing == [], "imports of modules that do not exist:\n" + "\n".join(missing)


ONE_WAY: tuple[tuple[str, str], ...] = (
    ("marginface.train", "marginface.report"),
    ("marginface.inference", "marginface.report"),
    ("marginface.data", "marginface.report"),
    ("marginface.evaluation", "marginface.report"),
)
"""``(lower, upper)`` packages: no module of ``lower`` imports ``upper`` (function-level imports
included). ``report/`` assembles pages from runs and results; what makes them never reaches up
to it (docs/architecture.md, "pictures and report")."""


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _upward(graph: dict[str, set[str]], lower: str, upper: str) -> list[str]:
    """``"module -> target"`` for each import of ``upper`` by a module of ``lower``."""
    return sorted(
        f"{name} -> {target}"
        for name, targets in graph.items()
        if _within(name, lower)
        for target in targets
        if _within(target, upper)
    )


@pytest.mark.parametrize(("lower", "upper"), ONE_WAY)
def test_lower_packages_never_import_the_ones_above(lower: str, upper: str) -> None:
    upward = _upward(_graph(), lower, upper)
    assert upward == [], f"{lower} imports {upper}:\n" + "\n".join(upward)


def test_the_one_way_rule_sees_an_upward_import() -> None:
    graph = {"marginface.train.x": {"marginface.report.page"}, "marginface.report": set()}
    assert _upward(graph, "marginface.train", "marginface.report") == [
        "marginface.train.x -> marginface.report.page"
    ]
    assert _upward(graph, "marginface.trainer", "marginface.report") == []
