"""Shared by the inference and CLI tests: a tiny trained run (digits, 8x8 grey, seed-cnn,
D = 3) and folders of scikit-learn's digit images as identities (``<digit>/<n>.png``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def train_digits_run(folder: Path) -> Path:
    """Train the default configuration (digits, curricularface) for one epoch on 96 images."""
    from marginface.train import train
    from marginface.train.config import TrainConfig

    config = TrainConfig(limit=96, epochs=1, batch_size=32, threads=1, device="cpu")
    train(config, folder)
    return folder


def digit_images() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits as ``uint8[N, 8, 8]`` (0..16 scaled to 0..255) and labels."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    pixels = np.round(digits.images * (255.0 / 16.0)).astype(np.uint8)
    return pixels, digits.target


def write_identities(folder: Path, classes, per_class: int, *, offset: int = 0) -> Path:
    """``folder/<digit>/<n>.png``: ``per_class`` images of each digit of ``classes``, from
    the ``offset``-th image of that digit on."""
    from PIL import Image

    pixels, labels = digit_images()
    for digit in classes:
        chosen = np.flatnonzero(labels == digit)[offset : offset + per_class]
        (folder / str(digit)).mkdir(parents=True, exist_ok=True)
        for n, index in enumerate(chosen):
            Image.fromarray(pixels[index]).save(folder / str(digit) / f"{offset + n}.png")
    return folder
