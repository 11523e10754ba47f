"""A tiny trained run shared by the inference tests: digits (8x8 grey), seed-cnn, D = 3."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def digits_run(tmp_path_factory):
    from marginface.config import TrainConfig
    from marginface.train import train

    folder = tmp_path_factory.mktemp("inference") / "run"
    config = TrainConfig(limit=96, epochs=1, batch_size=32, threads=1, device="cpu")
    train(config, folder)
    return folder
