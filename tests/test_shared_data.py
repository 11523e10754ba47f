"""A missing offline data file skips its test locally and fails it under ``CI=true``."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ._shared_data import SHARED_DATA, require_shared_file, running_under_ci

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("value", "expected"),
    [("true", True), ("TRUE", True), ("1", True), ("yes", True), ("false", False), ("", False)],
)
def test_running_under_ci_reads_the_ci_variable(value, expected):
    assert running_under_ci({"CI": value}) is expected
    assert running_under_ci({}) is False


def test_present_file_is_returned_in_both_modes(tmp_path):
    (tmp_path / "mnist").mkdir()
    (tmp_path / "mnist" / "labels.gz").write_bytes(b"x")
    for environ in ({}, {"CI": "true"}):
        path = require_shared_file("mnist", "labels.gz", root=tmp_path, environ=environ)
        assert path == tmp_path / "mnist" / "labels.gz"


def test_missing_file_skips_locally_and_fails_under_ci(tmp_path):
    missing = tmp_path / "mnist" / "labels.gz"
    with pytest.raises(pytest.skip.Exception, match="absent"):
        require_shared_file("mnist", "labels.gz", root=tmp_path, environ={})
    with pytest.raises(pytest.fail.Exception) as failure:
        require_shared_file("mnist", "labels.gz", root=tmp_path, environ={"CI": "true"})
    assert str(missing) in str(failure.value) and "CI" in str(failure.value)


def test_data_fixture_uses_the_ci_aware_helper():
    spec = importlib.util.spec_from_file_location(
        "data_conftest_under_test", REPO / "tests" / "data" / "conftest.py"
    )
    data_conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(data_conftest)
    assert data_conftest.shared_file.__wrapped__() is require_shared_file
    assert data_conftest.SHARED_DATA == SHARED_DATA == (REPO / ".." / "shared" / "data").resolve()


def _run_pytest(tmp_path: Path, ci: str | None) -> subprocess.CompletedProcess[str]:
    test = tmp_path / "test_needs_data.py"
    test.write_text(
        textwrap.dedent(
            f"""
            from pathlib import Path
            from tests._shared_data import require_shared_file

            def test_needs_data():
                require_shared_file("mnist", "gone.gz", root=Path({str(tmp_path)!r}))
            """
        )
    )
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    if ci is not None:
        env["CI"] = ci
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rsf", str(test)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )


def test_a_whole_pytest_run_fails_under_ci_and_skips_without(tmp_path):
    local = _run_pytest(tmp_path, None)
    assert local.returncode == 0, local.stdout + local.stderr
    assert "1 skipped" in local.stdout
    ci = _run_pytest(tmp_path, "true")
    assert ci.returncode == 1, ci.stdout + ci.stderr
    assert "1 failed" in ci.stdout and str(tmp_path / "mnist" / "gone.gz") in ci.stdout
