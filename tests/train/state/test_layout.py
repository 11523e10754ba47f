"""train/state/layout.py: the run folder's names are written in one place.

The guard reads the package's source (nothing is imported but the layout): a file name of the
run folder spelt as a string literal anywhere else in ``src/marginface`` is a failure naming the
file and line, so the next name added to a run goes into the layout too.
"""

from __future__ import annotations

import ast
import fnmatch
from pathlib import Path

from marginface.train.state import layout

PACKAGE = Path(__file__).resolve().parents[3] / "src" / "marginface"
LAYOUT = PACKAGE / "train" / "state" / "layout.py"


def _file_names() -> dict[str, str]:
    """The layout's names that are file names (with a dot: ``config.toml``, ``.metadata``...);
    bare folder names such as ``plots`` are also ordinary words and options, and a suffix
    (``KEPT_SUFFIX``, ``.pt``) names no file, so neither is checked."""
    return {
        value: name
        for name, value in vars(layout).items()
        if name.isupper()
        and not name.endswith("_SUFFIX")
        and isinstance(value, str)
        and "." in value
        and "*" not in value
    }


def _literals(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
        and id(node) not in docstrings
    ]  # fmt: skip


def _spelt_elsewhere(root: Path) -> list[str]:
    names = _file_names()
    found = []
    for path in sorted(root.rglob("*.py")):
        if path == LAYOUT:
            continue
        for line, text in _literals(path):
            if text in names:
                found.append(f"{path.relative_to(root.parent)}:{line}: {text!r} ({names[text]})")
    return found


def test_no_run_file_name_is_spelt_outside_the_layout():
    assert _spelt_elsewhere(PACKAGE) == []


def test_the_guard_finds_a_planted_name(tmp_path: Path):
    planted = tmp_path / "marginface" / "somewhere.py"
    planted.parent.mkdir()
    planted.write_text('"""history.csv in a docstring is prose."""\nPATH = "history.csv"\n')
    assert _spelt_elsewhere(tmp_path / "marginface") == [
        "marginface/somewhere.py:2: 'history.csv' (HISTORY_NAME)"
    ]


def test_the_guard_checks_the_file_names():
    names = _file_names()
    assert {"config.toml", "history.csv", "checkpoint.pt", "marginface.json"} <= set(names)
    assert "plots" not in names and ".pt" not in names  # a bare word, a suffix: not checked


def test_position_labels_sort_in_training_order():
    labels = [layout.position_label(e, s) for e, s in [(0, 7), (1, 0), (1, 12), (10, 3)]]
    assert labels == sorted(labels)
    assert layout.position_label(2, 13) == "epoch-0002-step-0000013"
    assert layout.position_label(2, 13).startswith(layout.POSITION_PREFIX)


def test_staging_folders_match_their_pattern():
    assert fnmatch.fnmatch(layout.staging_name(3), layout.STAGING_PATTERN)
    assert not fnmatch.fnmatch(layout.SHARDED_CHECKPOINT_NAME, layout.STAGING_PATTERN)
    assert not fnmatch.fnmatch(layout.REPLACED_SHARDED_NAME, layout.STAGING_PATTERN)


def test_every_name_is_listed_in_the_module_docstring():
    """The docstring is the picture of a run folder: each constant appears in it."""
    constants = [name for name in layout.__all__ if name.isupper()]
    missing = [name for name in constants if name not in (layout.__doc__ or "")]
    assert missing == []
