"""The report of a verification (face) run: what face people read first.

A run judged by verification pairs (insightface's ``.bin`` sets, or the test pairs of an
open-set dataset such as LFW) gets, instead of the raw list of metric keys:

* the verification table as papers print it, per set and in percent: accuracy ± standard
  deviation over the folds, VAL@FAR=1e-3 (insightface's rule), TAR@FAR from the ROC, AUC, EER
  and marginface's finer midpoint-search accuracy (:func:`verification_table`); a sentence where
  insightface's 0.01 grid was too coarse (:func:`~marginface.evaluation.grid_notes`);
* each set's accuracy over training (``history.csv``, ``verification.csv``), the genuine and
  impostor score histograms with the threshold, and for embeddings wider than 3-D a 2-D PCA
  projection coloured by identity (:func:`draw_verification_pictures`);
* the remaining measured metrics, rows without a value left out (:func:`other_metrics`).

Closed-set runs (digits, MNIST) keep their report (:mod:`marginface.report.pictures`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..evaluation import grid_notes
from ..train.evaluation.evaluate import Evaluation
from .page import Image, Section, Table, Text

__all__ = [
    "COUNT_METRICS",
    "TABLE_INTRO",
    "draw_verification_pictures",
    "other_metrics",
    "verification_sections",
    "verification_table",
]

TABLE_INTRO = (
    "Per set, in percent. Accuracy: mean ± standard deviation over the 10 folds, each fold "
    "judged at the threshold best on the other nine (a .bin set: insightface's rule, flip "
    "test and squared-L2 thresholds on a 0.01 grid; test pairs: marginface's midpoint "
    "search). VAL@FAR=1e-3: insightface's interpolated rule, ± std over the folds. TAR@FAR: "
    "from the ROC of all pairs (the best threshold whose FAR does not exceed the target; '-' "
    "where too few impostor pairs measure it). Midpoint accuracy: marginface's finer "
    "threshold search on the same pairs and folds."
)

_ROC_FARS = ("1e-02", "1e-03", "1e-04")


def _number(value: object) -> float:
    """A metric as a float; NaN when missing or not a number."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return math.nan
    return float(value)


def _percent(metrics: Mapping[str, object], key: str, std_key: str | None = None) -> str:
    """``"99.52 ± 0.35"`` (``key`` ± ``std_key`` as percentages), ``"99.52"`` without a
    standard deviation, ``"-"`` when ``key`` has no value."""
    mean = _number(metrics.get(key))
    if not math.isfinite(mean):
        return "-"
    std = _number(metrics.get(std_key)) if std_key else math.nan
    if math.isfinite(std):
        return f"{100 * mean:.2f} ± {100 * std:.2f}"
    return f"{100 * mean:.2f}"


def _set_keys(metrics: Mapping[str, object], name: str) -> dict[str, tuple[str, str | None]]:
    """The table's columns for set ``name``: ``{column: (key, std key or None)}``."""
    if name == "test pairs":
        columns: dict[str, tuple[str, str | None]] = {
            "accuracy (%)": ("verification_accuracy", "verification_accuracy_std"),
        }
        prefix = ""
    else:
        prefix = f"{name}_"
        columns = {
            "accuracy (%)": (f"{prefix}accuracy", f"{prefix}accuracy_std"),
            "VAL@FAR=1e-3 (%)": (f"{prefix}val@far=1e-03", f"{prefix}val_std"),
        }
    for far in _ROC_FARS:
        columns[f"TAR@FAR={far.replace('-0', '-')} (%)"] = (f"{prefix}tar@far={far}", None)
    columns["AUC (%)"] = (f"{prefix}auc", None)
    columns["EER (%)"] = (f"{prefix}eer", None)
    if name != "test pairs":
        columns["midpoint accuracy (%)"] = (
            f"{prefix}accuracy_midpoint",
            f"{prefix}accuracy_midpoint_std",
        )
    return columns


def _set_names(metrics: Mapping[str, object]) -> list[str]:
    """The verification sets of ``marginface evaluate``'s metrics: each ``.bin`` set (keys
    ``<set>_accuracy_midpoint``), then ``"test pairs"`` (``verification_accuracy``)."""
    names = [k[: -len("_accuracy_midpoint")] for k in metrics if k.endswith("_accuracy_midpoint")]
    if math.isfinite(_number(metrics.get("verification_accuracy"))):
        names.append("test pairs")
    return names


def verification_table(
    metrics: Mapping[str, object], pair_counts: Mapping[str, int] | None = None
) -> tuple[list[dict[str, str]], list[str], set[str]]:
    """The verification table as papers print it.

    Args:
        metrics: ``marginface evaluate``'s metrics (``evaluation.json``): a ``.bin`` set's
            ``<set>_accuracy``, ``<set>_accuracy_std``, ``<set>_val@far=1e-03``,
            ``<set>_val_std``, ``<set>_tar@far=1e-0k``, ``<set>_auc``, ``<set>_eer``,
            ``<set>_accuracy_midpoint`` (fractions); the test pairs' ``verification_accuracy``
            ...
        pair_counts: ``{set: P}``, shown in a ``pairs`` column when given.

    Returns:
        ``(rows, columns, keys)``: one row per set (cells are text: ``"99.52 ± 0.35"``,
        ``"-"`` where not measured; a set with no value at all is left out), the columns
        that have a value in some row (``set`` first), and the metric keys shown.
    """
    counts = pair_counts or {}
    rows: list[dict[str, str]] = []
    shown: set[str] = set()
    for name in _set_names(metrics):
        keys = _set_keys(metrics, name)
        cells = {column: _percent(metrics, key, std) for column, (key, std) in keys.items()}
        if all(cell == "-" for cell in cells.values()):
            continue
        for key, std in keys.values():
            shown.update(k for k in (key, std) if k is not None)
        row = {"set": name}
        if name in counts:
            row["pairs"] = str(counts[name])
        rows.append(row | cells)
    columns = list(dict.fromkeys(k for row in rows for k in row))
    columns = [c for c in columns if any(row.get(c, "-") != "-" for row in rows)]
    return rows, columns, shown


COUNT_METRICS = ("pairs", "num_queries", "probes_mated", "probes_non_mated", "gallery")
"""Metric names that count things (test pairs, retrieval queries, IJB probes and gallery
templates), alone or after a set's prefix (``ijbc_G1_probes_mated``): stored as floats in
``evaluation.json``, shown as integers."""


def _is_count(key: str) -> bool:
    return any(key == name or key.endswith(f"_{name}") for name in COUNT_METRICS)


def other_metrics(metrics: Mapping[str, object], shown: set[str]) -> list[dict[str, object]]:
    """``metric``/``value`` rows of every metric not in ``shown`` that has a finite value
    (no ``accuracy -`` row for open-set data); the coarse-grid flags are left to the notes.
    Counts (:data:`COUNT_METRICS`) with a whole value are ``int`` (shown ``300``, not
    ``300.0000``); rates stay floats."""
    rows: list[dict[str, object]] = []
    for key, value in metrics.items():
        number = _number(value)
        if key in shown or key.endswith("_grid_too_coarse_folds") or not math.isfinite(number):
            continue
        if _is_count(key) and number.is_integer():
            value = int(number)
        rows.append({"metric": key, "value": value})
    return rows


def _projection_labels(evaluation: Evaluation) -> tuple[np.ndarray, str, bool] | None:
    """Identities for the PCA picture, what they are, and whether they are pairs: the test
    set's labels, or for a ``.bin`` set (no identities) each genuine pair as one identity;
    None when neither."""
    labels = np.asarray(evaluation.labels)
    if labels.size and np.unique(labels).size >= 2:
        return labels, "coloured by identity (the 20 with the most images; others grey)", False
    for name, scored in evaluation.pairs.items():
        if scored.index is None:
            continue
        by_pair = np.full(evaluation.embeddings.shape[0], -1, dtype=np.int64)
        genuine = np.flatnonzero(scored.same)
        for pair in genuine:
            by_pair[scored.index[pair]] = pair
        return (
            by_pair,
            f"{name}: a .bin set has no identity labels, so each genuine pair is coloured as "
            "one identity and joined by a line (20 pairs; the other images grey)",
            True,
        )
    return None


def draw_verification_pictures(
    evaluation: Evaluation,
    history: Sequence[Mapping[str, object]],
    steps: Sequence[Mapping[str, object]],
    out_dir: Path,
) -> dict[str, Path]:
    """Draw a verification run's pictures into ``out_dir``; returns ``{caption: png}``.

    * ``verification_curves.png``: each set's accuracy over the epochs (``history``) and
      every ``verify_every`` steps (``steps``, ``verification.csv``'s rows), when logged;
    * ``scores.png``: the genuine and impostor cosine histograms of each set with its
      threshold (:attr:`Evaluation.pairs`);
    * ``pca.png``: for embeddings wider than 3-D, the 2-D PCA projection of the test
      embeddings (a ``.bin`` run: its first set's flip-averaged embeddings).
    """
    from ..plots import (
        plot_pca_projection,
        plot_score_histograms,
        plot_verification_curves,
        save_figure,
        verification_set_names,
    )

    out_dir = Path(out_dir)
    images: dict[str, Path] = {}
    logged = verification_set_names(k for row in [*history, *steps] for k in row)
    if logged:
        caption = "Verification accuracy over training (± one standard deviation of the folds)"
        figure = plot_verification_curves(history, steps)
        images[caption] = save_figure(figure, out_dir / "verification_curves.png")
    if evaluation.pairs:
        sets = {n: (p.scores, p.same, p.thresholds) for n, p in evaluation.pairs.items()}
        caption = (
            "Genuine and impostor pair scores (cosine similarity) with the thresholds, each the "
            "mean of the folds' (insightface grid: its squared-L2 threshold t as the cosine "
            "1 - t/2; midpoint: marginface's finer search)"
        )
        images[caption] = save_figure(plot_score_histograms(sets), out_dir / "scores.png")
    if evaluation.embeddings.ndim == 2 and evaluation.embeddings.shape[1] > 3:
        found = _projection_labels(evaluation)
        if found is not None:
            labels, what, pairs = found
            dim = evaluation.embeddings.shape[1]
            caption = f"Test embeddings ({dim}-D) on their first two principal components, {what}"
            figure = plot_pca_projection(
                evaluation.embeddings,
                labels,
                legend_title="genuine pair" if pairs else "identity",
                join=pairs,
            )
            images[caption] = save_figure(figure, out_dir / "pca.png")
    return images


def verification_sections(
    evaluation: Evaluation,
    images: Mapping[str, Path],
) -> tuple[list[Section], Section | None]:
    """The report's verification sections: ``(first, last)``.

    ``first``: "Verification" (the table of :func:`verification_table`, the coarse-grid
    notes) and "Verification pictures" (``images`` of :func:`draw_verification_pictures`);
    ``last``: "Other metrics" (:func:`other_metrics`), or None when there are none.
    """
    metrics: dict[str, Any] = evaluation.metrics
    counts = {name: int(p.scores.shape[0]) for name, p in evaluation.pairs.items()}
    rows, columns, shown = verification_table(metrics, counts)
    blocks: list[Any] = [Table(rows, columns)] if rows else []
    blocks += [Text(note, preformatted=False, note=True) for note in grid_notes(metrics)]
    first = [Section("Verification", blocks, intro=TABLE_INTRO)]
    if images:
        first.append(
            Section("Verification pictures", [Image(caption, p) for caption, p in images.items()])
        )
    rest = other_metrics(metrics, shown)
    last = Section("Other metrics", [Table(rest, ("metric", "value"))]) if rest else None
    return first, last
