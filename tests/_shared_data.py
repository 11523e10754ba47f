"""The tests' offline data folder, ``../shared/data``, and what a missing file means there.

Locally a missing file skips the test that needs it (a checkout without the shared data still
runs the rest). Under continuous integration (environment variable ``CI`` set to ``true``, as
GitHub Actions and GitLab CI do; ``1`` and ``yes`` are accepted too) the same test **fails**,
with a message naming the missing path: a CI machine without the data must not report green
while skipping every data test.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import pytest

__all__ = ["CI_TRUE_VALUES", "SHARED_DATA", "require_shared_file", "running_under_ci"]

SHARED_DATA = (Path(__file__).resolve().parents[1] / ".." / "shared" / "data").resolve()
"""``../shared/data`` relative to the repository root."""

CI_TRUE_VALUES = ("true", "1", "yes")
"""Values of ``CI`` (case-insensitive) that mean "running under CI"."""


def running_under_ci(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``environ`` (default ``os.environ``) has ``CI`` set to one of
    :data:`CI_TRUE_VALUES`."""
    value = (os.environ if environ is None else environ).get("CI", "")
    return value.strip().lower() in CI_TRUE_VALUES


def require_shared_file(
    *parts: str, root: Path = SHARED_DATA, environ: Mapping[str, str] | None = None
) -> Path:
    """``root / parts...`` if it exists; else skip the calling test, or fail it under CI.

    Args:
        parts: path components below ``root``, e.g. ``("mnist", "t10k-labels-idx1-ubyte.gz")``.
        root: the data folder. Default: :data:`SHARED_DATA`.
        environ: the environment to read ``CI`` from. Default: ``os.environ``.

    Raises:
        pytest.skip.Exception: the file is absent and not under CI.
        pytest.fail.Exception: the file is absent under CI; the message names the path.
    """
    path = root.joinpath(*parts)
    if path.exists():
        return path
    if running_under_ci(environ):
        pytest.fail(
            f"offline dataset file {path} is absent and CI is set: the data tests need the "
            f"shared data folder {root} (skipping them would hide that they never ran)",
            pytrace=False,
        )
    pytest.skip(f"offline dataset file {path} is absent")
