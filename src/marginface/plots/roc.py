"""ROC curves of verification runs, FAR on a log axis."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

from ..evaluation.arrays import ArrayLike, as_float_vector
from ..evaluation.verification import roc_auc
from ._figure import new_figure

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["plot_roc"]


def plot_roc(curves: Mapping[str, tuple[ArrayLike, ArrayLike]], *, log_far: bool = True) -> Figure:
    """TAR (true accept rate) against FAR (false accept rate), one line per entry, with its AUC
    in the legend.

    Args:
        curves: ``{label: (fpr[T], tpr[T])}``, e.g. ``VerificationMetrics.fpr``/``.tpr``;
            ``fpr`` non-decreasing in [0, 1].
        log_far: FAR on a log axis (default: where TAR@FAR 1e-3 is read); points with
            FAR = 0 are then not drawn. False: linear axes with the chance diagonal.

    Returns:
        The figure: one line per curve (plus the chance diagonal when ``log_far`` is False).
    """
    if not isinstance(curves, Mapping) or not curves:
        raise ValueError(f"curves must be a non-empty dict of label -> (fpr, tpr), got {curves!r}")
    figure = new_figure(6.5, 5.0)
    ax = figure.add_subplot()
    smallest = 1.0
    for name, value in curves.items():
        if not isinstance(value, tuple | list) or len(value) != 2:
            raise TypeError(f"curves[{name!r}] must be an (fpr, tpr) pair")
        fpr = as_float_vector(f"curves[{name!r}] fpr", value[0])
        tpr = as_float_vector(f"curves[{name!r}] tpr", value[1], length=fpr.shape[0])
        if fpr.min() < 0 or fpr.max() > 1 or tpr.min() < 0 or tpr.max() > 1:
            raise ValueError(f"curves[{name!r}] must hold rates in [0, 1]")
        if np.any(np.diff(fpr) < 0):
            raise ValueError(f"curves[{name!r}] fpr must be non-decreasing")
        label = f"{name} (AUC = {roc_auc(fpr, tpr):.4f})"
        if log_far:
            shown = fpr > 0
            if shown.any():
                smallest = min(smallest, float(fpr[shown].min()))
            ax.plot(fpr[shown], tpr[shown], linewidth=1.6, label=label)
        else:
            ax.plot(fpr, tpr, linewidth=1.6, label=label)
    if log_far:
        ax.set_xscale("log")
        ax.set_xlim(min(smallest, 1e-1), 1.0)
    else:
        ax.plot([0, 1], [0, 1], color="0.6", linestyle=":", label="chance")
        ax.set_xlim(0.0, 1.0)
        ax.set_aspect("equal")
    ax.set_ylim(0.0, 1.01)
    ax.set_xlabel("false accept rate (FAR)")
    ax.set_ylabel("true accept rate (TAR)")
    ax.set_title("ROC")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="small", loc="lower right")
    return figure
