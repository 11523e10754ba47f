"""Interactive 3-D embeddings on the unit sphere, as a plotly figure specification.

The figure is a plain ``dict`` in plotly's JSON schema (``{"data": [...], "layout": {...}}``):
building it needs neither plotly nor a browser, and :mod:`marginface.report` renders it with
the plotly.js bundle inlined once per page. ``plotly.graph_objects.Figure(spec)`` accepts it
(the tests validate every spec that way).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._validation import check_int
from ..evaluation import l2_normalize
from ..evaluation.angles import target_and_nearest_angles
from ..evaluation.arrays import ArrayLike, as_embeddings, as_int_vector
from ._figure import class_colors

__all__ = ["DEFAULT_MAX_POINTS", "sphere_figure"]

DEFAULT_MAX_POINTS = 4000
"""Samples drawn per figure at most (a seeded random subset above it keeps the page light:
about 40 bytes of JSON per sample)."""

_DIGITS = 4  # decimals kept for coordinates on the unit sphere (0.1 mrad): ample for a screen


def _rgb(color: tuple[float, ...]) -> str:
    red, green, blue = (round(255 * c) for c in color[:3])
    return f"rgb({red},{green},{blue})"


def _class_mean_angles(unit: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Angle (radians) of each unit row to the mean direction of its class's rows."""
    angles = np.zeros(len(labels))
    for c in np.unique(labels):
        rows = labels == c
        mean = unit[rows].sum(axis=0)
        norm = np.linalg.norm(mean)
        if norm > 0:
            angles[rows] = np.arccos(np.clip(unit[rows] @ (mean / norm), -1.0, 1.0))
    return angles


def _sphere_trace() -> dict[str, Any]:
    """A faint unit sphere (15° grid) for depth; it takes no hover and no legend entry."""
    u, v = np.mgrid[0.0 : 2.0 * np.pi : 25j, 0.0 : np.pi : 13j]
    coords = [np.round(a, 3).tolist() for a in (np.cos(u) * np.sin(v), np.sin(u) * np.sin(v))]
    return {
        "type": "surface",
        "x": coords[0],
        "y": coords[1],
        "z": np.round(np.cos(v), 3).tolist(),
        "opacity": 0.12,
        "colorscale": [[0, "rgb(170,170,170)"], [1, "rgb(170,170,170)"]],
        "showscale": False,
        "hoverinfo": "skip",
        "showlegend": False,
        "name": "unit sphere",
    }


def sphere_figure(
    embeddings: ArrayLike,
    labels: ArrayLike,
    centers: ArrayLike | None = None,
    *,
    sub_centers: int = 1,
    title: str | None = None,
    class_names: list[str] | tuple[str, ...] | None = None,
    max_points: int = DEFAULT_MAX_POINTS,
    seed: int = 0,
) -> dict[str, Any]:
    r"""A rotatable, zoomable 3-D scatter of L2-normalized embeddings on the unit sphere.

    One ``scatter3d`` trace per class (the legend toggles classes; colours are those of
    :func:`~marginface.plots.plot_embeddings`), the learned class centers as outlined diamonds
    labelled with their class, and a faint unit sphere. Hovering over a sample shows its class
    and its angle to its class center :math:`\theta_y` (degrees), and to the nearest other
    center (see :func:`~marginface.evaluation.target_and_nearest_angles`). Without ``centers``
    (open-set data, whose test classes have none) the hover gives the angle to the mean
    direction of the sample's class instead, and no centers are drawn.

    Args:
        embeddings: ``[N, 3]`` (tensor or array); rows are normalized before drawing.
        labels: ``int[N]`` classes (in ``[0, C)`` when ``centers`` are given).
        centers: ``[C·K, 3]`` class centers, class-major (a loss's ``.weight``), or None.
        sub_centers: ``K >= 1`` centers per class (all drawn; the angle is to the nearest).
            Default: 1.
        title: the figure title, or None.
        class_names: a name per class for the legend and hover (default: the label number).
        max_points: draw at most this many samples, a random subset seeded by ``seed`` (the
            title says so). Default: :data:`DEFAULT_MAX_POINTS`.
        seed: the subset's seed. Default: 0.

    Returns:
        ``{"data": [...], "layout": {...}}``, plain JSON-serializable Python values.
    """
    x = as_embeddings("embeddings", embeddings)
    if x.shape[1] != 3:
        raise ValueError(f"embeddings must have 3 columns to draw on the sphere, got {x.shape}")
    y = as_int_vector("labels", labels, length=x.shape[0])
    limit = check_int("max_points", max_points, minimum=1)
    unit = l2_normalize(x)  # (N, 3)
    if centers is not None:
        theta_y, theta_other = target_and_nearest_angles(x, y, centers, sub_centers=sub_centers)
        center_rows = l2_normalize(as_embeddings("centers", centers))  # (C·K, 3)
        angle_text = "θ to its center: %{customdata[0]:.1f}°<br>nearest other center: "
        angle_text += "%{customdata[1]:.1f}°"
        angles = np.stack([theta_y, theta_other], axis=1)  # (N, 2)
    else:
        angle_text = "θ to its class's mean direction: %{customdata[0]:.1f}°"
        angles = _class_mean_angles(unit, y)[:, None]  # (N, 1)
    angles = np.round(np.degrees(angles), 2)
    shown = np.arange(len(y))
    if len(y) > limit:
        shown = np.sort(np.random.default_rng(seed).choice(len(y), size=limit, replace=False))
    classes = np.unique(y)
    if centers is not None:
        classes = np.union1d(classes, np.arange(center_rows.shape[0] // sub_centers))
    colors = class_colors(classes)

    def name(c: int) -> str:
        if class_names is not None and 0 <= c < len(class_names):
            return str(class_names[c])
        return str(c)

    data: list[dict[str, Any]] = [_sphere_trace()]
    for c in np.unique(y[shown]):
        rows = shown[y[shown] == c]
        points = np.round(unit[rows], _DIGITS)
        data.append(
            {
                "type": "scatter3d",
                "mode": "markers",
                "name": f"class {name(int(c))}",
                "legendgroup": f"class {int(c)}",
                "x": points[:, 0].tolist(),
                "y": points[:, 1].tolist(),
                "z": points[:, 2].tolist(),
                "customdata": angles[rows].tolist(),
                "marker": {"size": 3, "color": _rgb(colors[int(c)]), "opacity": 0.85},
                "hovertemplate": f"class {name(int(c))}<br>{angle_text}<extra></extra>",
            }
        )
    if centers is not None:
        owner = np.arange(center_rows.shape[0]) // sub_centers  # (C·K,) class of each row
        points = np.round(center_rows, _DIGITS)
        data.append(
            {
                "type": "scatter3d",
                "mode": "markers+text",
                "name": "class centers",
                "x": points[:, 0].tolist(),
                "y": points[:, 1].tolist(),
                "z": points[:, 2].tolist(),
                "text": [name(int(c)) for c in owner],
                "textposition": "top center",
                "marker": {
                    "size": 7,
                    "symbol": "diamond",
                    "color": [_rgb(colors[int(c)]) for c in owner],
                    "line": {"color": "black", "width": 1.5},
                },
                "hovertemplate": "center of class %{text}<extra></extra>",
            }
        )
    heading = title or ""
    if len(shown) < len(y):
        heading += f" ({len(shown)} of {len(y)} samples shown)"
    axis = {"range": [-1.1, 1.1], "tickvals": [-1, 0, 1], "zeroline": False}
    layout = {
        "title": {"text": heading.strip(), "x": 0.02, "xanchor": "left"},
        "autosize": True,
        "margin": {"l": 0, "r": 0, "t": 40, "b": 0},
        "legend": {"itemsizing": "constant", "font": {"size": 11}},
        "scene": {
            "aspectmode": "cube",
            "xaxis": {**axis, "title": {"text": "x"}},
            "yaxis": {**axis, "title": {"text": "y"}},
            "zaxis": {**axis, "title": {"text": "z"}},
            "camera": {"eye": {"x": 1.4, "y": 1.4, "z": 0.9}},
        },
    }
    return {"data": data, "layout": layout}
