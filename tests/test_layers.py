"""The architecture's one rule, checked on the source: the library core never imports the
pipeline (docs/architecture.md, "Layers").

The core (margins, executors, the head, the named losses and their registry, the functional
API, evaluation metrics, sub-centers) is usable on its own; the pipeline (trainer, data,
backbones, plots, report, CLI, config, conversion, export) is built on top of it. An import in
the other direction, even one inside a function, is a failure naming the file, the line and the
module.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "marginface"

CORE = (
    "margins",
    "executors",
    "head",
    "class_parameters",
    "weight_regularizers",
    "losses",
    "functional",
    "evaluation",
    "registry",
    "_registry",
    "subcenters",
)
PIPELINE = (
    "train",
    "data",
    "plots",
    "report",
    "cli",
    "export",
    "models",
    "inference",
    "detect",
)


def _module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, root: Path = PACKAGE) -> list[tuple[int, str]]:
    """``(line, absolute module)`` of every import in ``path`` (a file of the package at
    ``root``), relative ones resolved, including the names imported from a package (``from ..
    import train`` gives ``marginface.train``)."""
    module = _module_name(path, root)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            found.append((node.lineno, target))
            found += [(node.lineno, f"{target}.{alias.name}") for alias in node.names]
    return found


def _layer_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "marginface" or len(parts) < 2:
        return None
    if parts[1] in CORE:
        return "core"
    if parts[1] in PIPELINE:
        return "pipeline"
    return None


def _core_files() -> list[Path]:
    files = []
    for name in CORE:
        folder, single = PACKAGE / name, PACKAGE / f"{name}.py"
        files += sorted(folder.rglob("*.py")) if folder.is_dir() else [single]
    return files


def test_every_named_module_exists():
    for name in (*CORE, *PIPELINE):
        assert (PACKAGE / name).is_dir() or (PACKAGE / f"{name}.py").is_file(), name


def test_every_top_level_module_has_a_layer():
    """A new top-level module must be placed in one of the two lists (or be a private helper)."""
    for path in PACKAGE.iterdir():
        name = path.stem if path.suffix == ".py" else path.name
        if (name.startswith("_") and name != "_registry") or name in ("keras", "py", "__pycache__"):
            continue  # _validation, _atomic: shared helpers; keras: a frontend over the core
        if path.suffix == ".py" or path.is_dir():
            assert name in CORE or name in PIPELINE, f"{path.name}: add it to CORE or PIPELINE"


def _violations(path: Path, root: Path = PACKAGE) -> list[str]:
    return [module for _, module in _imports(path, root) if _layer_of(module) == "pipeline"]


@pytest.mark.parametrize("path", _core_files(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_core_does_not_import_the_pipeline(path: Path):
    assert not _violations(path), f"{path.relative_to(PACKAGE)} imports {_violations(path)}"


def test_the_checker_sees_relative_and_lazy_imports(tmp_path: Path):
    """The rule cannot pass vacuously: a planted violation is found."""
    root = tmp_path / "marginface"
    (root / "margins").mkdir(parents=True)
    planted = root / "margins" / "planted.py"
    planted.write_text(
        "from ..evaluation import l2_normalize\n"
        "def f():\n"
        "    from .. import train\n"
        "    import marginface.plots.roc\n"
        "    from ..data.registry import load_dataset\n",
        encoding="utf-8",
    )
    assert _violations(planted, root) == [
        "marginface.train",
        "marginface.plots.roc",
        "marginface.data.registry",
        "marginface.data.registry.load_dataset",
    ]
