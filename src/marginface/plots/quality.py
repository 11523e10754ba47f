"""The error-versus-reject curve of a quality score (MagFace's feature magnitude)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

from ..evaluation.quality import ErrorVersusReject
from ._figure import new_figure

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["plot_error_versus_reject"]


def plot_error_versus_reject(curves: Mapping[str, ErrorVersusReject]) -> Figure:
    """Verification error (%) against the fraction of lowest-quality pairs rejected, one line
    per entry, at each curve's fixed threshold (:func:`~marginface.evaluation.quality.
    error_versus_reject`). A useful quality score makes the line fall.

    Args:
        curves: ``{label: ErrorVersusReject}``, e.g. ``{"magface": evaluation.erc}``.

    Returns:
        The figure: one line per curve, the fraction rejected on x (0 to 1), error in % on y.
    """
    if not isinstance(curves, Mapping) or not curves:
        raise ValueError(
            f"curves must be a non-empty dict of label -> ErrorVersusReject, got {curves!r}"
        )
    figure = new_figure(6.5, 4.5)
    ax = figure.add_subplot()
    for name, curve in curves.items():
        if not isinstance(curve, ErrorVersusReject):
            raise TypeError(
                f"curves[{name!r}] must be an ErrorVersusReject, got {type(curve).__name__}"
            )
        error = 100.0 * (1.0 - np.asarray(curve.accuracy, dtype=np.float64))
        ax.plot(curve.fractions, error, marker="o", markersize=3, linewidth=1.6, label=name)
    ax.set_xlim(0.0, 1.0)
    ax.set_ylim(bottom=0.0)
    ax.set_xlabel("fraction of pairs rejected (lowest quality = min of the two magnitudes)")
    ax.set_ylabel("verification error (%) at a fixed threshold")
    ax.set_title("Error versus reject (feature magnitude as quality)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small", loc="upper right")
    return figure
