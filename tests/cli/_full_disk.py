"""A full disk for the CLI tests (issue 39): a small tmpfs (skipped where mounting is not
permitted) that :func:`fill` fills to the last page, and fingerprints of what is on it."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

BALLAST = "ballast"
"""The file :func:`fill` grows until the file system refuses more."""


@contextlib.contextmanager
def mounted_tmpfs(point: Path, size: str = "8m") -> Iterator[Path]:
    """Mount a fresh tmpfs of ``size`` at ``point`` (created); skip the test if not allowed."""
    point.mkdir(parents=True, exist_ok=True)
    try:
        result = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(point)],
            capture_output=True,
            text=True,
            check=False,
        )
    except OSError as error:
        pytest.skip(f"cannot run mount: {error}")
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {result.stderr.strip() or result.returncode}")
    try:
        yield point
    finally:
        subprocess.run(["umount", str(point)], check=False, capture_output=True)


def fill(disk: Path) -> None:
    """Write ``disk/ballast`` until the file system is full."""
    block = b"\0" * 4096
    with open(disk / BALLAST, "wb", buffering=0) as ballast:
        try:
            while True:
                ballast.write(block)
        except OSError as error:
            assert error.errno == errno.ENOSPC, error


def fingerprint(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` (hidden ones included, the ballast left out) -> sha256."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != BALLAST
    }


def one_line(capsys, code: int, *needles: str) -> str:
    """Exit 2, one line on stderr holding every needle, no traceback."""
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    for needle in needles:
        assert needle in err, (needle, err)
    return err


FullDisk = Callable[[str], Path]
