"""Figures without pyplot: an Agg canvas per figure, no global backend switch.

``matplotlib.use("Agg")`` at import time would silently change the backend of a user's notebook
or GUI session; instead every figure here is a :class:`matplotlib.figure.Figure` attached to its
own :class:`~matplotlib.backends.backend_agg.FigureCanvasAgg`, chosen when the plotting function
runs. Such a figure renders and saves anywhere, and shows in Jupyter when it is the cell's value.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["class_colors", "new_figure"]


def new_figure(width: float, height: float) -> Figure:
    """A blank ``width × height`` inch figure on an Agg canvas (constrained layout)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def class_colors(classes: np.ndarray) -> dict[int, tuple[float, float, float, float]]:
    """One RGBA colour per class, stable across panels: ``tab10`` for up to 10 classes,
    ``tab20`` up to 20, else evenly spaced along ``turbo``.

    Args:
        classes: ``int[K]``, the distinct labels (sorted).
    """
    from matplotlib import colormaps

    count = len(classes)
    if count <= 10:
        colors = [colormaps["tab10"](i) for i in range(count)]
    elif count <= 20:
        colors = [colormaps["tab20"](i) for i in range(count)]
    else:
        colors = [colormaps["turbo"](x) for x in np.linspace(0.05, 0.95, count)]
    return {int(c): tuple(color) for c, color in zip(classes, colors, strict=True)}
