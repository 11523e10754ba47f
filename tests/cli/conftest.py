"""A tiny trained run for the CLI tests of the inference commands (tests/inference/_digits.py)."""

from __future__ import annotations

import pytest

from tests.inference._digits import train_digits_run


@pytest.fixture(scope="session")
def digits_run(tmp_path_factory):
    return train_digits_run(tmp_path_factory.mktemp("cli-inference") / "run")
