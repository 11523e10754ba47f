"""Shared test fixtures and helpers."""

from __future__ import annotations

import os
import sys

import pytest
import torch

# Triton's CPU interpreter for tests/executors/test_triton.py on machines without CUDA: it is
# read when triton is imported, and some test modules import it indirectly at collection
# (torch._inductor), so it is set here, in the conftest pytest loads first, whatever the order
# of the files asked for (tests/executors/conftest.py explains the conditions).
if "triton" not in sys.modules and not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import marginface

from ._ijb_folder import ijb_folder  # noqa: F401 (the IJB tests' session fixture)
from ._shared_data import SHARED_DATA, require_shared_file  # noqa: F401 (SHARED_DATA re-exported)


@pytest.fixture(scope="session")
def shared_file():
    """``shared_file("lfw", "pairs.txt")``: a file under ``../shared/data``; skips when absent,
    fails when absent under ``CI=true`` (:func:`tests._shared_data.require_shared_file`)."""
    return require_shared_file


# Constructor options that make every registered loss usable in a small generic test:
# SphereFace's original variant needs nothing extra; AdaCos needs nothing; ElasticFace is seeded.
LOSS_OPTIONS: dict[str, dict] = {
    "elasticface": {"seed": 0},
}


def make_loss(name: str, num_classes: int = 7, embedding_dim: int = 5, **kwargs):
    """Build a registered loss with the test defaults above."""
    options = {**LOSS_OPTIONS.get(name, {}), **kwargs}
    return marginface.create_loss(
        name, num_classes=num_classes, embedding_dim=embedding_dim, **options
    )


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def _flushes_denormals() -> bool:
    """Whether this thread flushes subnormal floats to zero (``torch.set_flush_denormal``)."""
    return bool((torch.full((1,), 1e-39, dtype=torch.float32) * 1.0).item() == 0.0)


@pytest.fixture(autouse=True)
def _keep_the_floating_point_mode():
    """Put back the thread's denormal mode after each test: a test that builds a trainer's
    objects without ``fit`` (``Trainer._setup`` flushes denormals, ``fit`` restores them) must
    not leave it to the next test in the same worker (hypothesis refuses to draw subnormals
    then)."""
    before = _flushes_denormals()
    yield
    torch.set_flush_denormal(before)
