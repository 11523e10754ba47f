"""Extended Yale Face Database B, cropped: 38 subjects under 64 illuminations, closed set.

Source: A. Georghiades, P. Belhumeur, D. Kriegman, "From Few to Many: Illumination Cone Models
for Face Recognition under Variable Lighting and Pose", PAMI 2001; K.-C. Lee, J. Ho,
D. Kriegman, "Acquiring Linear Subspaces for Face Recognition under Variable Lighting",
PAMI 2005 (the cropped set). Terms: published by the Yale / UCSD vision groups for research;
cite the papers above. Sizes: ``CroppedYale.tar.gz`` holds ``CroppedYale/yaleBxx/*.pgm`` for
38 subjects (yaleB01..yaleB39, no yaleB14): 2,414 usable 192×168 (H×W) grey images. The files
the publisher marks ``*.pgm.bad`` (18 corrupt captures) and the ``*_Ambient.pgm`` images (no
directed light, some 640×480) are skipped.

No download (no mirror with a published checksum): put ``CroppedYale.tar.gz`` (or the extracted
``CroppedYale/`` folder) in ``<data_dir>/yaleb/``.

Split: ``split="closed"`` (default) holds out ``test_fraction`` (default 0.3) of each subject's
images; ``split="open"`` holds out subjects (see :mod:`.splits`). ``image_size=None`` keeps
192×168; an int centre-crops to 168×168 and resizes.
"""

from __future__ import annotations

import os
import re

from .base import DatasetBundle
from .download import RemoteFile
from .orl import load_face_tar

__all__ = ["YALEB_ARCHIVE", "load_yaleb"]

YALEB_ARCHIVE = RemoteFile(name="CroppedYale.tar.gz", aliases=("CroppedYale.tar", "CroppedYale"))
# yaleBxx/yaleBxx_P00A+000E+00.pgm: illumination images only (not *_Ambient.pgm, not *.pgm.bad)
_YALEB_MEMBER = re.compile(r"(?:^|/)(yaleB\d\d)/\1_P00A[+-]\d{3}E[+-]\d\d\.pgm$")


def load_yaleb(
    *,
    data_dir: str | os.PathLike[str] | None = None,
    download: bool = False,
    image_size: int | None = None,
    seed: int = 0,
    limit: int | None = None,
    split: str = "closed",
    test_fraction: float = 0.3,
    num_pairs: int = 3000,
) -> DatasetBundle:
    """Extended Yale B, cropped (see the module docstring); options as :func:`.orl.load_orl`.

    Returns:
        A :class:`DatasetBundle` of ``float32[N, 1, H, W]``, class names ``"yaleB01"``...
    """
    return load_face_tar(
        "yaleb",
        YALEB_ARCHIVE,
        _YALEB_MEMBER,
        data_dir=data_dir,
        download=download,
        image_size=image_size,
        seed=seed,
        limit=limit,
        split=split,
        test_fraction=test_fraction,
        num_pairs=num_pairs,
    )
