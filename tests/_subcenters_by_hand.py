"""Sub-center dominance and angles computed by hand (plain Python/NumPy loops), the reference
the sub-center clean-up tests compare the library and the CLI against."""

from __future__ import annotations

import math

import numpy as np


def dominant_and_angles(
    x: np.ndarray, labels: np.ndarray, weight: np.ndarray, k: int
) -> tuple[list[int], list[float]]:
    """Each class's dominant sub-center (the one most of its samples are closest to) and each
    sample's angle in degrees to its class's dominant sub-center.

    ``x``: ``[N, D]`` embeddings, ``labels``: ``[N]``, ``weight``: ``[C·K, D]`` (float64 each).
    """

    def cos(a, b):
        return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))

    counts = np.zeros((weight.shape[0] // k, k), dtype=int)
    for xi, y in zip(x, labels, strict=True):
        own = [cos(xi, weight[y * k + j]) for j in range(k)]
        counts[y, own.index(max(own))] += 1
    dominant = [list(row).index(max(row)) for row in counts]
    angles = [
        math.degrees(math.acos(max(-1.0, min(1.0, cos(xi, weight[y * k + dominant[y]])))))
        for xi, y in zip(x, labels, strict=True)
    ]
    return dominant, angles
