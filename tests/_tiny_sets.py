"""Tiny synthetic inputs shared by the CLI and model tests: an insightface ``.bin`` verification
set of noise "people", and a folder of noise faces, ``FOLDER/<identity>/0.png``."""

from __future__ import annotations

import io
import pickle
from pathlib import Path

import numpy as np
from PIL import Image


def write_tiny_bin(folder: Path, side: int, *, pairs: int = 20, seed: int = 0) -> Path:
    """``folder/tiny.bin``: ``pairs`` pairs over 4 noise images of ``side`` px (PNG), every
    other pair genuine (insightface's ``(images, same)`` pickle)."""
    rng = np.random.default_rng(seed)
    people = rng.integers(0, 256, (4, side, side, 3), dtype=np.uint8)
    images, same = [], []
    for p in range(pairs):
        a, b = p % 4, (p % 4 if p % 2 == 0 else (p + 1) % 4)
        for who in (a, b):
            buffer = io.BytesIO()
            Image.fromarray(people[who]).save(buffer, format="PNG")
            images.append(buffer.getvalue())
        same.append(a == b)
    path = folder / "tiny.bin"
    with open(path, "wb") as stream:
        pickle.dump((images, same), stream, protocol=2)
    return path


def write_noise_faces(
    folder: Path, side: int, identities: tuple[str, ...] = ("ann", "bob"), *, seed: int = 0
) -> Path:
    """``folder/<identity>/0.png``, one noise image of ``side`` px per identity."""
    rng = np.random.default_rng(seed)
    for person in identities:
        (folder / person).mkdir(parents=True)
        pixels = rng.integers(0, 256, (side, side, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(folder / person / "0.png")
    return folder
