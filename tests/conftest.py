"""Shared test fixtures and helpers."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

import marginface

SHARED_DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data"


def shared_path(*parts: str) -> Path:
    """A file under ``../shared/data``: the test is skipped when it is absent, except under
    ``CI=true``, where a missing offline dataset is a failure (CI always has shared/)."""
    path = SHARED_DATA.resolve().joinpath(*parts)
    if not path.exists():
        message = f"offline dataset file {path} is absent"
        if os.environ.get("CI", "").strip().lower() in ("true", "1", "yes"):
            pytest.fail(f"{message} (CI=true: the offline data must be present)")
        pytest.skip(message)
    return path


@pytest.fixture(scope="session")
def shared_file():
    """``shared_file("lfw", "pairs.txt")``: a file under ``../shared/data``
    (:func:`shared_path`: skipped when absent, failed under ``CI=true``)."""
    return shared_path


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
