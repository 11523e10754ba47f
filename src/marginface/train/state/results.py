"""A run's results file, ``RUN/evaluation.json``: read it, and write it through one function.

Two commands write it: ``marginface evaluate`` (and ``compare``, which evaluates each run it
trains) and ``marginface ijb`` (its IJB-B/C numbers, keys starting ``ijbb``/``ijbc``). Each owns
a *section* of the flat JSON object: :func:`update_results` replaces or merges that section and
keeps the other one, so neither command loses the other's numbers. Non-finite floats are
written as ``null`` and read back as NaN by :func:`ijb_results`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from ..._atomic import atomic_write_text
from .layout import EVALUATION_NAME

__all__ = [
    "IJB_PREFIXES",
    "RESULT_SECTIONS",
    "ijb_results",
    "read_results",
    "update_results",
    "write_results_file",
]

IJB_PREFIXES = ("ijbb", "ijbc")
"""The keys ``marginface ijb`` writes start with one of these."""

RESULT_SECTIONS = ("evaluate", "ijb")
"""The sections of ``evaluation.json``: ``evaluate``'s metrics and ``ijb``'s numbers."""


def _json_ready(values: Mapping[str, Any]) -> dict[str, Any]:
    return {
        k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in values.items()
    }


def write_results_file(path: str | Path, values: Mapping[str, Any]) -> Path:
    """Write ``values`` to ``path`` as one sorted, indented JSON object, non-finite floats as
    ``null``, atomically (a reader sees the old file or the new one). Returns ``path``."""
    return atomic_write_text(
        Path(path), json.dumps(_json_ready(values), indent=2, sort_keys=True) + "\n"
    )


def read_results(run_dir: str | Path) -> dict[str, Any]:
    """``RUN/evaluation.json`` as a dict (``null`` kept as ``None``), or ``{}`` when the file is
    missing, unreadable, or not a JSON object."""
    path = Path(run_dir) / EVALUATION_NAME
    if not path.is_file():
        return {}
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return saved if isinstance(saved, dict) else {}


def ijb_results(run_dir: str | Path) -> dict[str, float]:
    """The IJB-B/C numbers ``marginface ijb`` wrote into ``RUN/evaluation.json`` (keys starting
    with :data:`IJB_PREFIXES`, numbers or ``null`` read back as NaN), or ``{}``."""
    return {
        k: (math.nan if v is None else v)
        for k, v in read_results(run_dir).items()
        if k.startswith(IJB_PREFIXES) and (v is None or isinstance(v, (int, float)))
    }


def update_results(
    run_dir: str | Path,
    section: Literal["evaluate", "ijb"],
    values: Mapping[str, Any],
) -> Path:
    """Write ``values`` into ``RUN/evaluation.json`` as ``section``'s results, atomically.

    ``section="evaluate"``: the file becomes ``values`` plus the IJB numbers already there
    (:func:`ijb_results`) that ``values`` does not name; every other key is replaced.
    ``section="ijb"``: ``values`` (keys starting with :data:`IJB_PREFIXES`) are merged into the
    file; every other key is kept. Non-finite floats are written as ``null``.

    Args:
        run_dir: the run folder (it must exist).
        section: ``"evaluate"`` or ``"ijb"``.
        values: metric name -> value (float, int, or ``None``).

    Returns:
        The path written, ``RUN/evaluation.json``.

    Raises:
        ValueError: ``section`` is not one of :data:`RESULT_SECTIONS`; an ``"ijb"`` key that
            does not start with ``ijbb``/``ijbc``; ``run_dir`` is not a folder.
    """
    if section not in RESULT_SECTIONS:
        raise ValueError(f"section must be one of {RESULT_SECTIONS}, got {section!r}")
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ValueError(f"run_dir {run_dir} is not a folder")
    if section == "ijb":
        foreign = [k for k in values if not k.startswith(IJB_PREFIXES)]
        if foreign:
            raise ValueError(f"values of section 'ijb' must start with ijbb/ijbc, got {foreign}")
        merged = {**read_results(run_dir), **values}
    else:
        kept = ijb_results(run_dir)
        merged = {**{k: v for k, v in kept.items() if k not in values}, **values}
    return write_results_file(run_dir / EVALUATION_NAME, merged)
