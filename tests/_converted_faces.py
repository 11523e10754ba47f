"""A tiny converted dataset for the resize and framing tests: random colour images in LFW's
layout (``root/<Name>/<Name>_NNNN.jpg``), converted by ``convert`` to ``train.rec`` and a
``.bin`` of LFW-format pairs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

NAMES = ("Ann_Aa", "Bob_Bb", "Cid_Cc")
PER_NAME = 2


def write_lfw_like(root: Path, side: int = 40) -> tuple[Path, Path]:
    """``(images folder, pairs file)``: PER_NAME random ``side``-pixel images per name and ten
    folds (the verification protocol's) of one genuine and one impostor pair each."""
    images = root / "images"
    rng = np.random.default_rng(1)
    for name in NAMES:
        (images / name).mkdir(parents=True)
        for number in range(1, PER_NAME + 1):
            pixels = rng.integers(0, 256, (side, side, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(images / name / f"{name}_{number:04d}.jpg", quality=95)
    pairs = root / "pairs.txt"
    lines = ["10\t1"]
    for fold in range(10):
        first, second = NAMES[fold % len(NAMES)], NAMES[(fold + 1) % len(NAMES)]
        lines += [f"{first}\t1\t2", f"{first}\t1\t{second}\t2"]
    pairs.write_text("\n".join(lines) + "\n")
    return images, pairs
