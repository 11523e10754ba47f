"""Embeddings on the unit circle (2-D) and on the unit sphere (3-D), coloured by class."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

from ..evaluation import l2_normalize
from ..evaluation.arrays import ArrayLike, as_embeddings, as_int_vector
from ._figure import class_colors, new_figure

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["plot_embedding_grid", "plot_embeddings"]

MAX_LEGEND_CLASSES = 20
"""Above this many classes the legend is left out (the colours still separate classes)."""


def _check(embeddings: ArrayLike, labels: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    x = as_embeddings("embeddings", embeddings)
    if x.shape[1] not in (2, 3):
        raise ValueError(
            f"embeddings must have 2 or 3 columns to plot on the circle or sphere, "
            f"got shape {x.shape}"
        )
    y = as_int_vector("labels", labels, length=x.shape[0])
    return l2_normalize(x), y


def _draw(
    ax: Axes,
    unit: np.ndarray,
    labels: np.ndarray,
    colors: dict[int, tuple[float, float, float, float]],
    title: str | None,
    point_size: float,
) -> None:
    """Reference circle/sphere, then one scatter per class (so the legend names classes)."""
    if unit.shape[1] == 2:
        angle = np.linspace(0.0, 2.0 * np.pi, 361)
        ax.plot(np.cos(angle), np.sin(angle), color="0.75", linewidth=1.0, zorder=0)
        for c in np.unique(labels):
            points = unit[labels == c]  # (n_c, 2)
            ax.scatter(points[:, 0], points[:, 1], s=point_size, color=colors[int(c)], label=str(c))
        ax.set_xlim(-1.15, 1.15)
        ax.set_ylim(-1.15, 1.15)
        ax.set_aspect("equal")
    else:
        u, v = np.mgrid[0.0 : 2.0 * np.pi : 37j, 0.0 : np.pi : 19j]
        ax.plot_wireframe(
            np.cos(u) * np.sin(v),
            np.sin(u) * np.sin(v),
            np.cos(v),
            color="0.6",
            linewidth=0.4,
            alpha=0.35,
        )
        for c in np.unique(labels):
            points = unit[labels == c]  # (n_c, 3)
            ax.scatter(
                points[:, 0],
                points[:, 1],
                points[:, 2],
                s=point_size,
                color=colors[int(c)],
                label=str(c),
                depthshade=True,
            )
        for setter in (ax.set_xlim, ax.set_ylim, ax.set_zlim):
            setter(-1.0, 1.0)
        ax.set_zticks([-1.0, 0.0, 1.0])
        ax.set_box_aspect((1.0, 1.0, 1.0), zoom=0.88)
        ax.set_zlabel("z", labelpad=-2)
    ax.set_xticks([-1.0, 0.0, 1.0])
    ax.set_yticks([-1.0, 0.0, 1.0])
    ax.tick_params(labelsize="small")
    ax.set_xlabel("x")
    ax.set_ylabel("y")
    if title:
        ax.set_title(title)


def _point_size(count: int) -> float:
    """Marker area in points²: large for a few points, small for ten thousand."""
    return float(np.clip(600.0 / np.sqrt(max(count, 1)), 2.0, 30.0))


def plot_embeddings(
    embeddings: ArrayLike,
    labels: ArrayLike,
    title: str | None = None,
    ax: Axes | None = None,
) -> Figure:
    """Scatter L2-normalized embeddings, coloured by class: on the unit circle (``D = 2``) or
    over a light wireframe unit sphere (``D = 3``), with equal aspect.

    Args:
        embeddings: ``[N, 2]`` or ``[N, 3]`` (tensor or array); rows are normalized to length 1
            before plotting (a zero row stays at the origin).
        labels: ``int[N]`` classes; colours come from :func:`~._figure.class_colors`.
        title: the axes title, or None.
        ax: draw into this axes (a ``projection="3d"`` one for ``D = 3``); None (default) makes
            a new 6×6-inch figure.

    Returns:
        The figure holding the axes.
    """
    unit, y = _check(embeddings, labels)
    if ax is None:
        figure = new_figure(7.0, 6.0)
        ax = figure.add_subplot(projection="3d" if unit.shape[1] == 3 else None)
    elif (unit.shape[1] == 3) != (getattr(ax, "name", "") == "3d"):
        kind = "a 3-D (projection='3d')" if unit.shape[1] == 3 else "a 2-D"
        raise ValueError(f"ax must be {kind} axes for {unit.shape[1]}-D embeddings, got {ax!r}")
    classes = np.unique(y)
    _draw(ax, unit, y, class_colors(classes), title, _point_size(unit.shape[0]))
    if len(classes) <= MAX_LEGEND_CLASSES:
        ax.legend(
            title="class",
            loc="center left",
            bbox_to_anchor=(1.0, 0.5),
            fontsize="small",
            markerscale=2.0,
        )
    return ax.figure


def plot_embedding_grid(panels: Mapping[str, tuple[ArrayLike, ArrayLike]]) -> Figure:
    """Several embeddings side by side (at most 4 per row), one panel per title, with the same
    colour for the same class in every panel and one legend for the figure.

    Args:
        panels: ``{title: (embeddings[N, 2 or 3], labels[N])}``, e.g. one entry per loss.

    Returns:
        The figure.
    """
    if not isinstance(panels, Mapping) or not panels:
        raise ValueError(
            f"panels must be a non-empty dict of title -> (embeddings, labels), got {panels!r}"
        )
    checked = {}
    for name, value in panels.items():
        if not isinstance(value, tuple | list) or len(value) != 2:
            raise TypeError(f"panels[{name!r}] must be an (embeddings, labels) pair")
        checked[str(name)] = _check(*value)
    classes = np.unique(np.concatenate([y for _, y in checked.values()]))
    colors = class_colors(classes)
    columns = min(4, len(checked))
    rows = -(-len(checked) // columns)
    figure = new_figure(4.5 * columns, 4.5 * rows + 0.6)
    for i, (name, (unit, y)) in enumerate(checked.items()):
        projection = "3d" if unit.shape[1] == 3 else None
        ax = figure.add_subplot(rows, columns, i + 1, projection=projection)
        _draw(ax, unit, y, colors, name, _point_size(unit.shape[0]))
    if len(classes) <= MAX_LEGEND_CLASSES:
        handles, names = figure.axes[0].get_legend_handles_labels()
        for other in figure.axes[1:]:  # classes missing from the first panel
            for handle, name in zip(*other.get_legend_handles_labels(), strict=True):
                if name not in names:
                    handles.append(handle)
                    names.append(name)
        order = np.argsort([int(n) for n in names], kind="stable")
        figure.legend(
            [handles[i] for i in order],
            [names[i] for i in order],
            title="class",
            loc="outside lower center",
            ncols=min(len(names), 10),
            markerscale=2.0,
        )
    return figure
