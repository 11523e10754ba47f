"""Shared test fixtures and helpers."""

from __future__ import annotations

import pytest
import torch

import marginface

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
