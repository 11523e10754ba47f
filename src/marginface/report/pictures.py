"""The pictures of trained runs (PNGs) and the sections of the comparison report.

``runs`` below is ``{loss_name: (history, evaluation, loss_module)}``, as
:func:`~marginface.train.compare_losses` and ``marginface plot`` collect them. To add a figure
to the report, draw it in :func:`draw_run_pictures` (a PNG, also written by ``marginface
plot``) or add a block or a section in :func:`report_sections` (e.g. an interactive
:class:`~marginface.report.page.PlotlyFigure`).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from ..evaluation.ijb import IJB_FAR_TARGETS
from ..train.evaluation.evaluate import Evaluation
from ..train.state.layout import ERC_NAME
from .page import Image, PlotlyFigure, Section, Table

__all__ = [
    "ANGLES_CAPTION",
    "class_centers",
    "draw_run_pictures",
    "ijb_curve_caption",
    "ijb_section",
    "report_sections",
]

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
    ROC, error versus reject (a feature norm that is a quality score, MagFace), training curves
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
        plot_ijb_history,
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
        images[_roc_caption(runs)] = save_figure(plot_roc(curves), out_dir / "roc.png")
    quality = {name: ev.erc for name, (_, ev, _) in runs.items() if ev.erc is not None}
    if quality:  # a margin whose feature norm is a quality score (MagFace)
        images["Error versus reject (feature magnitude as quality)"] = save_figure(
            plot_error_versus_reject(quality), out_dir / ERC_NAME
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
        for prefix in _history_ijb_prefixes(history):
            images[ijb_curve_caption(name, prefix)] = save_figure(
                plot_ijb_history(history, prefix), out_dir / f"{prefix}{name}.png"
            )
    return images


def _roc_caption(runs: RunPictures) -> str:
    """``"ROC of test pairs"``, or, when every run is judged by ``.bin`` sets (whose first set
    the curve is), ``"ROC of <set>'s pairs (the first verification set)"``."""
    firsts = {next(iter(ev.pairs), "test pairs") for _, ev, _ in runs.values()}
    if len(firsts) == 1 and firsts != {"test pairs"}:
        return f"ROC of {firsts.pop()}'s pairs (the first verification set)"
    return "ROC of test pairs"


def ijb_curve_caption(name: str, prefix: str) -> str:
    """The caption of run ``name``'s IJB-over-training picture (``prefix``: ``ijbc_``...)."""
    return f"{prefix.rstrip('_').upper()} over training: {name}"


def _history_ijb_prefixes(history: list[dict[str, Any]]) -> list[str]:
    """The IJB prefixes with at least one value in the log (``train --ijb-dir``)."""
    from ..plots import ijb_prefixes

    keys = [k for row in history for k, v in row.items() if _is_number(v)]
    return ijb_prefixes(keys)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


_ONE_TO_ONE = tuple(f"tar@far={far:.0e}" for far in IJB_FAR_TARGETS)
_ONE_TO_N = ("rank1", "rank5", "rank10", "tpir@fpir=1e-02", "tpir@fpir=1e-01")


def _ijb_results(runs: RunPictures) -> list[tuple[str, str, str, dict[str, float]]]:
    """``(run, prefix, source, {key without prefix: value})`` of every IJB result: the keys
    ``marginface ijb`` merged into the run's metrics (``evaluation.json``), else the last
    epoch of the log with IJB values."""
    from ..plots import ijb_prefixes

    found = []
    for name, (history, evaluation, _) in runs.items():
        metrics = evaluation.metrics
        measured = ijb_prefixes(metrics)
        for prefix in measured:
            values = {k[len(prefix) :]: v for k, v in metrics.items() if k.startswith(prefix)}
            found.append((name, prefix, "marginface ijb", values))
        for prefix in _history_ijb_prefixes(history):
            if prefix in measured:
                continue
            row = next(  # the last epoch evaluated on IJB
                r
                for r in reversed(history)
                if any(k.startswith(f"{prefix}tar@far=") and _is_number(v) for k, v in r.items())
            )
            values = {k[len(prefix) :]: v for k, v in row.items() if k.startswith(prefix)}
            found.append((name, prefix, f"history, epoch {int(row['epoch'])}", values))
    return found


def ijb_section(
    runs: RunPictures,
    images: dict[str, Path],
    rocs: dict[str, Path] | None = None,
) -> Section | None:
    """The report's IJB-B / IJB-C section, or None when no run has IJB results: a 1:1 table
    (TAR at FAR 1e-6 ... 1e-1, insightface's rule), a 1:N table (rank-1/5/10 and TPIR at
    FPIR 0.01 and 0.1 per gallery, where measured), the ROC pictures ``rocs`` (``{caption:
    png}``, e.g. the ones ``marginface ijb`` drew) and each run's IJB-over-training picture
    (:func:`ijb_curve_caption` in ``images``).

    Args:
        runs: ``{loss_name: (history, evaluation, loss_module)}``; IJB results are the
            ``ijbc_...`` keys of ``evaluation.metrics`` (``marginface ijb``), else the last
            epoch of ``history`` with IJB columns (``train --ijb-dir``).
        images: :func:`draw_run_pictures`' pictures.
        rocs: ROC pictures to show in the section.
    """
    results = _ijb_results(runs)
    pictures = [
        Image(caption, path)
        for caption, path in images.items()
        if any(caption == ijb_curve_caption(n, p) for n, p, _, _ in results)
    ]
    pictures += [Image(caption, path) for caption, path in (rocs or {}).items()]
    if not results and not pictures:
        return None
    one_to_one = [
        {"run": name, "set": prefix.rstrip("_"), "from": source}
        | {key: values.get(key) for key in _ONE_TO_ONE}
        for name, prefix, source, values in results
    ]
    one_to_n = []
    for name, prefix, _, values in results:
        galleries = dict.fromkeys(
            k.split("_", 1)[0] for k in values if k.endswith(("_rank1", "_tpir@fpir=1e-01"))
        )
        for gallery in galleries:
            row: dict[str, Any] = {"run": name, "set": prefix.rstrip("_"), "gallery": gallery}
            row |= {key: values.get(f"{gallery}_{key}") for key in _ONE_TO_N}
            one_to_n.append(row)
    blocks: list[Any] = []
    if one_to_one:
        blocks.append(Table(one_to_one, ("run", "set", "from", *_ONE_TO_ONE)))
    if one_to_n:
        blocks.append(Table(one_to_n, ("run", "set", "gallery", *_ONE_TO_N)))
    return Section(
        "IJB-B / IJB-C",
        [*blocks, *pictures],
        intro="1:1 TAR at FAR by insightface's rule (the ROC point of FPR nearest the "
        "target); 1:N rank-k and TPIR at FPIR per gallery (G1, G2: open-set; G1+G2: "
        "insightface's rule); docs/evaluation.md. '-': not measured.",
    )


def report_sections(
    runs: RunPictures, images: dict[str, Path], ijb_rocs: dict[str, Path] | None = None
) -> list[Section]:
    """The report's sections after its metrics: the interactive 3-D embeddings (one figure per
    3-D run, with the learned class centers for closed-set runs), the IJB results when a run
    has them (:func:`ijb_section`, with its pictures), then the other PNG ``images`` of
    :func:`draw_run_pictures`.

    Args:
        runs: ``{loss_name: (history, evaluation, loss_module)}``.
        images: ``{caption: png_path}``, in the order to show.
        ijb_rocs: IJB ROC pictures ``{caption: png_path}`` for the IJB section.
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
    ijb = ijb_section(runs, images, ijb_rocs)
    if ijb is not None:
        sections.append(ijb)
        shown = {block.caption for block in ijb.blocks if isinstance(block, Image)}
        images = {caption: path for caption, path in images.items() if caption not in shown}
    if images:
        sections.append(
            Section("Pictures", [Image(caption, path) for caption, path in images.items()])
        )
    return sections
