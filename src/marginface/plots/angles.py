"""Histograms of the angle to the target center and to the nearest other center."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

from .._validation import check_int
from ..evaluation.arrays import ArrayLike, as_float_vector
from ._figure import new_figure

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["plot_angle_distributions"]

TARGET_COLOR = "tab:blue"
OTHER_COLOR = "tab:orange"


def _angles(name: str, value: object, length: int | None = None) -> np.ndarray:
    angles = as_float_vector(name, value, length=length)
    if angles.min() < 0 or angles.max() > np.pi + 1e-9:
        raise ValueError(
            f"{name} must hold angles in radians in [0, π], got values in "
            f"[{angles.min():.4g}, {angles.max():.4g}]"
        )
    return angles


def plot_angle_distributions(
    panels: Mapping[str, tuple[ArrayLike, ArrayLike]], *, bins: int = 45
) -> Figure:
    r"""Per panel, the histograms of :math:`\theta_y` (angle to the sample's own class center)
    and of :math:`\theta_\text{other}` (angle to the nearest other center), in degrees.

    What a margin does, seen directly: the two distributions separate, and the larger the
    margin the wider the gap between them. A sample is classified correctly exactly when
    :math:`\theta_y < \theta_\text{other}`; that share is printed in each panel's title.
    Compute the angles with :func:`~marginface.evaluation.target_and_nearest_angles`.

    Args:
        panels: ``{title: (theta_target[N], theta_nearest_other[N])}`` in radians, in
            ``[0, π]``, e.g. one entry per loss.
        bins: histogram bins over ``[0°, 180°]``. Default: 45 (4° each).

    Returns:
        The figure: one axes per panel (at most 4 per row), two histograms each, the same
        x axis and bins everywhere.
    """
    if not isinstance(panels, Mapping) or not panels:
        raise ValueError(
            f"panels must be a non-empty dict of title -> (theta_target, theta_other), "
            f"got {panels!r}"
        )
    count = check_int("bins", bins, minimum=1)
    checked = {}
    for name, value in panels.items():
        if not isinstance(value, tuple | list) or len(value) != 2:
            raise TypeError(f"panels[{name!r}] must be a (theta_target, theta_other) pair")
        target = _angles(f"panels[{name!r}] theta_target", value[0])
        other = _angles(f"panels[{name!r}] theta_other", value[1], length=target.shape[0])
        checked[str(name)] = (np.degrees(target), np.degrees(other))
    edges = np.linspace(0.0, 180.0, count + 1)
    columns = min(4, len(checked))
    rows = -(-len(checked) // columns)
    figure = new_figure(4.2 * columns, 3.4 * rows + 0.5)
    axes = figure.subplots(rows, columns, squeeze=False, sharex=True)
    for ax in axes.flat[len(checked) :]:
        ax.set_visible(False)
    for ax, (name, (target, other)) in zip(axes.flat, checked.items(), strict=False):
        ax.hist(target, bins=edges, color=TARGET_COLOR, alpha=0.6, label="θ_y (own center)")
        ax.hist(other, bins=edges, color=OTHER_COLOR, alpha=0.6, label="θ nearest other center")
        for values, color in ((target, TARGET_COLOR), (other, OTHER_COLOR)):
            ax.axvline(float(np.median(values)), color=color, linestyle="--", linewidth=1.0)
        correct = float(np.mean(target < other))
        ax.set_title(f"{name}  (θ_y < θ_other: {correct:.1%})", fontsize="medium")
        ax.set_xlim(0.0, 180.0)
        ax.set_xticks([0, 45, 90, 135, 180])
        ax.set_xlabel("angle (degrees)")
        ax.set_ylabel("test samples")
        ax.grid(True, alpha=0.3)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    figure.legend(
        handles,
        [*labels],
        loc="outside lower center",
        ncols=2,
        title="dashed: medians",
        fontsize="small",
    )
    return figure
