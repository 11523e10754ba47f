"""The pictures of trained runs (PNGs) and the sections of the comparison report.

``runs`` below is ``{loss_name: (history, evaluation, loss_module)}``, as
:func:`~marginface.train.compare_losses` and ``marginface plot`` collect them. To add a figure
to the report, draw it in :func:`draw_run_pictures` (a PNG, also written by ``marginface
plot``) or add a block or a section in :func:`report_sections` (e.g. an interactive
:class:`~marginface.report.PlotlyFigure`).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from ..report import Image, PlotlyFigure, Section
from .evaluate import Evaluation

__all__ = ["ANGLES_CAPTION", "class_centers", "draw_run_pictures", "report_sections"]

RunPictures = dict[str, tuple[list[dict[str, Any]], Evaluation, Any]]

ANGLES_CAPTION = (
    "Angle distributions on the test set: θ_y to the sample's own class center and θ to the "
    "nearest other center"
)


def class_centers(evaluation: Evaluation, loss: Any) -> tuple[np.ndarray, int] | None:
    """The loss's class centers ``float32[C·K, D]`` and ``K`` (sub-centers per class) when the
    test classes are the training classes; None for open-set data (new identities, whose
    ``accuracy`` is NaN: no center belongs to them)."""
    if math.isnan(evaluation.metrics.get("accuracy", math.nan)):
        return None
    weight = getattr(loss, "weight", None)
    if weight is None:
        return None
    return weight.detach().float().cpu().numpy(), int(getattr(loss, "sub_centers", 1))


def draw_run_pictures(runs: RunPictures, out_dir: Path) -> dict[str, Path]:
    """Draw the runs' pictures into ``out_dir`` and return ``{caption: png_path}``: the test
    embeddings (2-D and 3-D runs), the angle distributions (closed-set runs), margin curves,
    ROC, error versus reject (MagFace runs: the feature magnitude as quality), training curves
    and the margins' state over training.

    Args:
        runs: ``{loss_name: (history, evaluation, loss_module)}``.
        out_dir: the folder for the PNGs (created).
    """
    from ..evaluation import target_and_nearest_angles
    from ..plots import (
        plot_angle_distributions,
        plot_embedding_grid,
        plot_error_versus_reject,
        plot_margin_curves,
        plot_roc,
        plot_state_curve,
        plot_training_curves,
        save_figure,
    )

    out_dir = Path(out_dir)
    images: dict[str, Path] = {}
    dims = {evaluation.embeddings.shape[1] for _, evaluation, _ in runs.values()}
    if dims <= {2, 3}:
        panels = {name: (ev.embeddings, ev.labels) for name, (_, ev, _) in runs.items()}
        images["Test embeddings"] = save_figure(
            plot_embedding_grid(panels), out_dir / "embeddings.png"
        )
    angles = {}
    for name, (_, evaluation, loss) in runs.items():
        centers = class_centers(evaluation, loss)
        if centers is not None and centers[0].shape[0] // centers[1] >= 2:
            angles[name] = target_and_nearest_angles(
                evaluation.embeddings, evaluation.labels, centers[0], sub_centers=centers[1]
            )
    if angles:
        images[ANGLES_CAPTION] = save_figure(
            plot_angle_distributions(angles), out_dir / "angles.png"
        )
    margins = {name: loss.margin for name, (_, _, loss) in runs.items()}
    images["Margin curves (target logit / s against θ)"] = save_figure(
        plot_margin_curves(margins), out_dir / "margin_curves.png"
    )
    curves = {name: (ev.fpr, ev.tpr) for name, (_, ev, _) in runs.items() if len(ev.fpr)}
    if curves:
        images["ROC of test pairs"] = save_figure(plot_roc(curves), out_dir / "roc.png")
    quality = {name: ev.erc for name, (_, ev, _) in runs.items() if ev.erc is not None}
    if quality:  # MagFace runs: the feature magnitude as a quality score
        images["Error versus reject (feature magnitude as quality)"] = save_figure(
            plot_error_versus_reject(quality), out_dir / "erc.png"
        )
    for name, (history, _, loss) in runs.items():
        images[f"Training curves: {name}"] = save_figure(
            plot_training_curves(history), out_dir / f"training_{name}.png"
        )
        for key, buffer in loss.margin.named_buffers():
            if buffer.numel() == 1 and key in history[0]:
                images[f"{name}: {key} over training"] = save_figure(
                    plot_state_curve(history, key), out_dir / f"state_{name}_{key}.png"
                )
    return images


def report_sections(runs: RunPictures, images: dict[str, Path]) -> list[Section]:
    """The report's sections after its metrics: the interactive 3-D embeddings (one figure per
    3-D run, with the learned class centers for closed-set runs), then the PNG ``images`` of
    :func:`draw_run_pictures`.

    Args:
        runs: ``{loss_name: (history, evaluation, loss_module)}``.
        images: ``{caption: png_path}``, in the order to show.
    """
    from ..plots import sphere_figure

    figures = []
    for name, (_, evaluation, loss) in runs.items():
        if evaluation.embeddings.shape[1] != 3:
            continue
        centers = class_centers(evaluation, loss)
        figure = sphere_figure(
            evaluation.embeddings,
            evaluation.labels,
            None if centers is None else centers[0],
            sub_centers=1 if centers is None else centers[1],
            title=name,
        )
        figures.append(PlotlyFigure(f"{name}: test embeddings on the unit sphere", figure))
    sections = []
    if figures:
        sections.append(
            Section(
                "Embeddings on the sphere (interactive)",
                figures,
                intro="Drag to rotate, scroll or pinch to zoom, click a class in the legend "
                "to hide it; hover over a sample for its class and its angles to its class "
                "center and to the nearest other center. Diamonds: the learned class centers.",
            )
        )
    if images:
        sections.append(
            Section("Pictures", [Image(caption, path) for caption, path in images.items()])
        )
    return sections
