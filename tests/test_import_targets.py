"""Every import of a ``marginface`` module in the package names one that exists, and every name
imported from it is defined there (or is one of its submodules), read from the AST
(function-level imports included), so a module or a function moved to another file cannot leave
a lazy import behind that only fails when its command runs."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


def _modules(src: Path) -> dict[str, Path]:
    names = {}
    for path in src.rglob("*.py"):
        parts = list(path.relative_to(src).with_suffix("").parts)
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def _defined(path: Path) -> set[str] | None:
    """The names bound at the top of ``path`` (defs, classes, assignments, imports); None when
    it defines ``__getattr__`` (lazy names: not checked)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
    return None if "__getattr__" in names else names


def _unresolved(src: Path) -> list[str]:
    known = _modules(src)
    found = []
    for path in sorted(src.rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        package = parts[:-1]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets, names = [], []
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package[: len(package) - (node.level - 1)]
                    targets = [".".join(base + ([node.module] if node.module else []))]
                else:
                    targets = [node.module or ""]
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            for target in targets:
                if target.split(".")[0] != "marginface":
                    continue
                if target not in known:
                    found.append(f"{path.relative_to(src)}:{node.lineno}: {target}")
                    continue
                defined = _defined(known[target])
                for name in names:
                    missing = defined is not None and name not in defined
                    if missing and f"{target}.{name}" not in known:
                        found.append(f"{path.relative_to(src)}:{node.lineno}: {target}.{name}")
    return found


def test_every_package_import_names_an_existing_module():
    assert _unresolved(SRC) == []


def test_a_stale_lazy_import_is_found(tmp_path: Path):
    package = tmp_path / "marginface" / "train" / "evaluation"
    package.mkdir(parents=True)
    (tmp_path / "marginface" / "__init__.py").write_text("")
    (tmp_path / "marginface" / "data.py").write_text("x = 1\n")
    (package / "moved.py").write_text(
        "from ...data import x\n\ndef f():\n    from ..data import y\n    import marginface.gone\n"
        "    from ...data import resolve_device\n"
    )
    assert _unresolved(tmp_path) == [
        "marginface/train/evaluation/moved.py:4: marginface.train.data",
        "marginface/train/evaluation/moved.py:5: marginface.gone",
        "marginface/train/evaluation/moved.py:6: marginface.data.resolve_device",
    ]
