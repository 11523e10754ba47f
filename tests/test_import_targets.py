"""Every import of a ``marginface`` module in the package names one that exists, read from the
AST (function-level imports included), so a module moved to another folder cannot leave a lazy
import behind that only fails when its command runs."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


def _modules(src: Path) -> set[str]:
    names = set()
    for path in src.rglob("*.py"):
        parts = list(path.relative_to(src).with_suffix("").parts)
        names.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def _unresolved(src: Path) -> list[str]:
    known = _modules(src)
    found = []
    for path in sorted(src.rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        package = parts[:-1]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets = []
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package[: len(package) - (node.level - 1)]
                    targets = [".".join(base + ([node.module] if node.module else []))]
                else:
                    targets = [node.module or ""]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            for target in targets:
                if target.split(".")[0] == "marginface" and target not in known:
                    found.append(f"{path.relative_to(src)}:{node.lineno}: {target}")
    return found


def test_every_package_import_names_an_existing_module():
    assert _unresolved(SRC) == []


def test_a_stale_lazy_import_is_found(tmp_path: Path):
    package = tmp_path / "marginface" / "train" / "evaluation"
    package.mkdir(parents=True)
    (tmp_path / "marginface" / "__init__.py").write_text("")
    (tmp_path / "marginface" / "data.py").write_text("")
    (package / "moved.py").write_text(
        "from ...data import x\n\ndef f():\n    from ..data import y\n    import marginface.gone\n"
    )
    assert _unresolved(tmp_path) == [
        "marginface/train/evaluation/moved.py:4: marginface.train.data",
        "marginface/train/evaluation/moved.py:5: marginface.gone",
    ]
