"""A tiny trained run shared by the inference tests (tests/inference/_digits.py)."""

from __future__ import annotations

import pytest

from ._digits import train_digits_run


@pytest.fixture(scope="session")
def digits_run(tmp_path_factory):
    return train_digits_run(tmp_path_factory.mktemp("inference") / "run")
