"""Writing a figure to a PNG file atomically."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from .._atomic import atomic_write
from .._validation import check_int

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["save_figure"]


def save_figure(figure: Figure, path: str | os.PathLike[str], *, dpi: int = 120) -> Path:
    """Save ``figure`` as a PNG at ``path``, atomically.

    The image is rendered into a temporary file in the destination directory and moved over
    ``path`` with :func:`os.replace` only once complete: on any error nothing is left behind and
    a file already at ``path`` is untouched. Missing parent directories are created.

    Args:
        figure: a :class:`matplotlib.figure.Figure`.
        path: the destination; must end in ``.png``.
        dpi: resolution in dots per inch. Default: 120.

    Returns:
        The absolute path written.
    """
    from matplotlib.figure import Figure

    if not isinstance(figure, Figure):
        raise TypeError(f"figure must be a matplotlib Figure, got {type(figure).__name__}")
    if not isinstance(path, str | os.PathLike):
        raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__}")
    target = Path(path).expanduser().absolute()
    if target.suffix.lower() != ".png":
        raise ValueError(f"path must end in .png (PNG is the only format written), got {path!r}")
    dpi = check_int("dpi", dpi, minimum=1)
    with atomic_write(target) as stream:
        figure.savefig(stream, format="png", dpi=dpi)
    return target
