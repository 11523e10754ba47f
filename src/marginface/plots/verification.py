"""The pictures of a verification (face) run: each set's accuracy over training, genuine and
impostor score histograms with the decision threshold, and a 2-D PCA projection of embeddings
wider than 3-D, coloured by identity."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from ..evaluation import l2_normalize
from ..evaluation.arrays import (
    ArrayLike,
    as_bool_vector,
    as_embeddings,
    as_float_vector,
    as_int_vector,
)
from ._figure import class_colors, new_figure
from .training import history_column

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "TEST_PAIRS",
    "plot_pca_projection",
    "plot_score_histograms",
    "plot_verification_curves",
    "verification_set_names",
]

TEST_PAIRS = "test pairs"
"""The name the report gives the test set's own pairs (the columns ``verification_accuracy``
and ``verification_accuracy_std``)."""

_PREFIXES = {TEST_PAIRS: "verification"}


def verification_set_names(keys: Iterable[str]) -> list[str]:
    """The verification sets among metric or log columns, in order of first appearance: each
    ``<set>`` with both ``<set>_accuracy`` and ``<set>_accuracy_std`` (``lfw``, ``cfp_fp``...);
    the test pairs' ``verification_accuracy`` is named :data:`TEST_PAIRS`."""
    keys = list(keys)
    present = set(keys)
    names = []
    for key in keys:
        if key.endswith("_accuracy") and f"{key}_std" in present:
            prefix = key[: -len("_accuracy")]
            names.append(TEST_PAIRS if prefix == "verification" else prefix)
    return list(dict.fromkeys(names))


def _column(name: str) -> str:
    """``<set>_accuracy``'s prefix for a set name (:data:`TEST_PAIRS`: ``verification``)."""
    return _PREFIXES.get(name, name)


def plot_verification_curves(
    history: Sequence[Mapping[str, object]],
    steps: Sequence[Mapping[str, object]] = (),
) -> Figure:
    """Each verification set's accuracy (in %) over training, with ± one standard deviation
    of its folds as a band.

    Args:
        history: the per-epoch rows (``history.csv``): ``epoch``, ``<set>_accuracy`` and
            ``<set>_accuracy_std`` (fractions; strings are converted, empty cells skipped).
        steps: the rows of ``verification.csv`` (``step``, the same columns), drawn in a
            second panel against the optimizer step when given.

    Returns:
        The figure: one panel (per epoch), two with ``steps``.

    Raises:
        ValueError: no verification set column in ``history`` or ``steps``.
    """
    names = verification_set_names(k for row in [*history, *steps] for k in row)
    if not names:
        raise ValueError(
            "no verification accuracy in the log (columns <set>_accuracy and "
            "<set>_accuracy_std, e.g. lfw_accuracy)"
        )
    panels = [(history, "epoch", "per epoch")] if history else []
    if steps:
        panels.append((steps, "step", f"every {_interval(steps)} steps"))
    figure = new_figure(6.6 * len(panels), 4.0)  # two panels: wider than WIDE_ASPECT, a row
    axes = figure.subplots(1, len(panels), squeeze=False)[0]
    for ax, (rows, x_key, title) in zip(axes, panels, strict=True):
        for name in names:
            prefix = _column(name)
            x, mean = _series(rows, x_key, f"{prefix}_accuracy")
            if not mean.size:
                continue
            _, std = _series(rows, x_key, f"{prefix}_accuracy_std")
            (line,) = ax.plot(x, 100 * mean, marker=".", label=name)
            if std.shape == mean.shape:
                ax.fill_between(
                    x, 100 * (mean - std), 100 * (mean + std), color=line.get_color(), alpha=0.2
                )
        ax.set_xlabel(x_key)
        ax.set_ylabel("accuracy (%)")
        ax.set_title(f"Verification accuracy, {title}")
        ax.grid(True, alpha=0.3)
        if ax.lines:
            ax.legend(fontsize="small")
    return figure


def _interval(steps: Sequence[Mapping[str, object]]) -> str:
    """The step interval of ``verification.csv``'s rows, as text (``"N"`` or ``"N"`` of the
    first two rows)."""
    values = [float(row["step"]) for row in steps[:2] if row.get("step") not in (None, "")]
    if len(values) == 2:
        return f"{values[1] - values[0]:g}"
    return f"{values[0]:g}" if values else "N"


def _series(
    rows: Sequence[Mapping[str, object]], x_key: str, key: str
) -> tuple[np.ndarray, np.ndarray]:
    """``(x, values)`` of one column, rows without a value skipped; ``x`` from ``x_key``."""
    keyed = [{**row, "epoch": row.get(x_key)} for row in rows]  # history_column reads "epoch"
    return history_column(keyed, key)


def plot_score_histograms(
    sets: Mapping[str, tuple[ArrayLike, ArrayLike, Mapping[str, float]]], *, bins: int = 60
) -> Figure:
    """Genuine and impostor pair scores of each set, with the decision thresholds.

    Args:
        sets: ``{name: (scores[P], same[P], {rule: threshold})}``: cosine similarities of the
            pairs (in [-1, 1]), True for genuine pairs, and each rule's cosine threshold (a
            pair is "same" above it), e.g. ``{"insightface grid": 0.31, "midpoint": 0.29}``.
        bins: histogram bins over the scores' range. Default: 60.

    Returns:
        The figure: one panel per set (up to three per row), each with the two histograms
        (density, so that sets of unequal counts compare) and one vertical line per
        threshold (its value in the legend).
    """
    if not isinstance(sets, Mapping) or not sets:
        raise ValueError(
            f"sets must be a non-empty dict of name -> (scores, same, thresholds), got {sets!r}"
        )
    columns = min(3, len(sets))
    rows = math.ceil(len(sets) / columns)
    figure = new_figure(5.0 * columns, 3.8 * rows)
    axes = figure.subplots(rows, columns, squeeze=False).reshape(-1)
    for ax, (name, value) in zip(axes, sets.items(), strict=False):
        triple = isinstance(value, tuple | list) and len(value) == 3
        if not triple or not isinstance(value[2], Mapping):
            raise TypeError(f"sets[{name!r}] must be a (scores, same, {{rule: threshold}}) triple")
        scores = as_float_vector(f"sets[{name!r}] scores", value[0])
        same = as_bool_vector(f"sets[{name!r}] same", value[1], length=scores.shape[0])
        low, high = float(scores.min()), float(scores.max())
        edges = np.linspace(low, high if high > low else low + 1e-6, bins + 1)
        for mask, label, color in ((same, "genuine", "tab:green"), (~same, "impostor", "tab:red")):
            if mask.any():
                ax.hist(
                    scores[mask], bins=edges, density=True, alpha=0.55, color=color,
                    label=f"{label} ({int(mask.sum())})",
                )  # fmt: skip
        for (rule, threshold), style in zip(value[2].items(), ("--", ":", "-."), strict=False):
            ax.axvline(
                float(threshold), color="black", linestyle=style,
                label=f"{rule} threshold {float(threshold):.4f}",
            )  # fmt: skip
        ax.set_title(name)
        ax.set_xlabel("cosine similarity")
        ax.set_ylabel("density")
        ax.legend(fontsize="small")
    for ax in axes[len(sets) :]:
        ax.set_visible(False)
    return figure


def plot_pca_projection(
    embeddings: ArrayLike,
    labels: ArrayLike,
    *,
    title: str = "",
    max_identities: int = 20,
    legend_title: str = "identity",
    join: bool = False,
) -> Figure:
    """The L2-normalized embeddings projected on their first two principal components
    (scikit-learn's ``PCA``), the ``max_identities`` identities with the most samples each in
    its colour, the others grey.

    Args:
        embeddings: ``float[N, D]`` (any ``D >= 2``; meant for ``D > 3``, where the sphere
            cannot be drawn).
        labels: ``int[N]`` identities; a negative label is "no identity" (grey).
        title: the panel's title.
        max_identities: identities coloured (those with at least two samples). Default: 20.
        legend_title: what a label is, for the legend. Default: ``"identity"``.
        join: join the samples of each coloured identity by a line in its colour (for
            identities that are pairs: a ``.bin`` set's genuine pairs). Default: False.

    Returns:
        The figure; the axes name each component's share of the variance.
    """
    from sklearn.decomposition import PCA

    x = as_embeddings("embeddings", embeddings, min_rows=2)
    if x.shape[1] < 2:
        raise ValueError(f"embeddings must have at least 2 columns, got shape {x.shape}")
    y = as_int_vector("labels", labels, length=x.shape[0])
    if isinstance(max_identities, bool) or not isinstance(max_identities, int):
        raise TypeError(f"max_identities must be an int, got {max_identities!r}")
    if max_identities < 1:
        raise ValueError(f"max_identities must be >= 1, got {max_identities}")
    pca = PCA(n_components=2, svd_solver="full")
    points = pca.fit_transform(l2_normalize(x))  # (N, 2)
    ids, counts = np.unique(y[y >= 0], return_counts=True)
    order = np.lexsort((ids, -counts))  # most samples first, then the smaller label
    shown = np.sort(ids[order][counts[order] >= 2][:max_identities])
    figure = new_figure(6.5, 5.5)
    ax = figure.add_subplot()
    rest = ~np.isin(y, shown)
    if rest.any():
        ax.scatter(*points[rest].T, s=6, color="0.8", label="others")
    colors = class_colors(shown)
    for identity in shown:
        members = points[y == identity]  # (n, 2)
        color = colors[int(identity)]
        if join:
            ax.plot(*members.T, color=color, linewidth=1.0)
        ax.scatter(*members.T, s=18, color=color, label=str(identity))
    share = 100 * pca.explained_variance_ratio_
    ax.set_xlabel(f"PC 1 ({share[0]:.1f}% of the variance)")
    ax.set_ylabel(f"PC 2 ({share[1]:.1f}% of the variance)")
    ax.set_title(title or f"PCA of the {x.shape[1]}-D embeddings")
    ax.grid(True, alpha=0.3)
    if 0 < len(shown) <= 20:
        ax.legend(fontsize="x-small", ncols=2, markerscale=0.8, title=legend_title)
    return figure
