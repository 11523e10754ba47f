"""docs/architecture.md names real files: every path it spells in backticks (``head/sampling.py``,
``train/state/layout.py``, ``tests/test_layers.py``, ``executors/``) exists, so the newcomer's
map cannot keep a file that moved or never was."""

from __future__ import annotations

import re
from pathlib import Path

from marginface.train.state import layout

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "marginface"
DOC = ROOT / "docs" / "architecture.md"

_PATH = re.compile(r"`((?:[\w.-]+/)*[\w.-]+\.py|(?:[\w.-]+/)+)`")


def _spelt_paths(text: str) -> list[str]:
    return sorted(set(_PATH.findall(text)))


RUN_FOLDER_NAMES = {value for value in vars(layout).values() if isinstance(value, str)}
"""Entries of a run folder (``checkpoint/``, ``plots/``...): spelt in the page, not source."""


def _exists(path: str) -> bool:
    if path.rstrip("/") in RUN_FOLDER_NAMES:
        return True
    if "/" not in path.rstrip("/"):  # a bare file or folder name: somewhere in the package
        name = path.rstrip("/")
        return any(p.name == name for p in PACKAGE.rglob(name))
    return any((base / path).exists() for base in (PACKAGE, PACKAGE.parent, ROOT))


def _missing(text: str) -> list[str]:
    return [path for path in _spelt_paths(text) if not _exists(path)]


def test_every_path_in_the_architecture_page_exists():
    assert _missing(DOC.read_text(encoding="utf-8")) == []


def test_the_page_names_the_moved_rooms():
    paths = _spelt_paths(DOC.read_text(encoding="utf-8"))
    assert {"head/sampling.py", "train/state/layout.py", "train/evaluation/evaluate.py"} <= set(
        paths
    )


def test_a_path_that_is_not_there_is_found():
    text = "`head/sampling.py`, `head_state.py`, `train/run_state.py`, `executors/`, `nowhere/`"
    assert _missing(text) == ["head_state.py", "nowhere/", "train/run_state.py"]
    assert _missing("`checkpoint/`, `plots/`") == []  # a run folder's entries
