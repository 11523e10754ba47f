"""The report of one trained run (``marginface plot``) and the page of an evaluated MagFace
run (``marginface evaluate``): the run read once, evaluated, its pictures drawn and its page
written."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..train.evaluation.evaluate import Evaluation
from ..train.state.layout import (
    ERC_NAME,
    EVALUATION_REPORT_NAME,
    IJB_NAME,
    PLOTS_NAME,
    REPORT_NAME,
)
from .page import write_evaluation_report, write_report

__all__ = ["QUALITY_CAPTION", "RunReport", "write_quality_report", "write_run_report"]

QUALITY_CAPTION = "Error versus reject: pairs of lowest quality (min ‖x‖ of the two) rejected"
"""The caption of ``evaluate``'s error-versus-reject picture (``RUN/erc.png``)."""


@dataclass
class RunReport:
    """What :func:`write_run_report` wrote: the report's path and its pictures ``{caption:
    png_path}``, the run's pictures first, then a verification run's."""

    report: Path
    images: dict[str, Path]


def write_run_report(
    run_dir: str | os.PathLike[str],
    *,
    out: str | os.PathLike[str] | None = None,
    device: str | None = None,
) -> RunReport:
    """Read the run once, evaluate it as is (its stored embeddings when they are fresh), draw
    its pictures into ``out`` and write ``out/report.html``: the metrics of ``evaluate``
    (``marginface ijb``'s numbers kept in ``evaluation.json`` among them), the IJB section
    (tables, ``RUN/ijb/*_roc.png``, the IJB columns over training), the pictures. A run
    judged by verification pairs (faces) gets the face report instead of the raw metric
    table: the verification table, its pictures, the other sections, then the other metrics
    (:mod:`.verification`).

    Args:
        run_dir: the run folder (``train --out``).
        out: the folder of the PNGs and the report (created). Default: ``RUN/plots``.
        device: where the run is evaluated (``"cpu"``, ``"cuda"``...); default: the best one
            (:func:`~marginface.train.resolve_device`).
    """
    from ..train import evaluate_run, load_run, resolve_device
    from ..train.state.results import ijb_results
    from .pictures import draw_run_pictures, report_sections

    run_dir = Path(run_dir)
    run = load_run(run_dir, device=resolve_device(device))  # read once, evaluated as is
    history = run.history  # the checkpoint's own: complete even if history.csv lags
    evaluation = evaluate_run(run, reuse_embeddings=True)  # the run's own when they are fresh
    kept = ijb_results(run_dir)
    evaluation.metrics.update({k: v for k, v in kept.items() if k not in evaluation.metrics})
    out = Path(out) if out is not None else run_dir / PLOTS_NAME
    out.mkdir(parents=True, exist_ok=True)
    pictured = {run.config.loss: (history, evaluation, run.head.cpu())}  # drawn on the CPU
    images = draw_run_pictures(pictured, out)
    rocs = {
        f"{path.name[: -len('_roc.png')].upper()} 1:1 ROC (marginface ijb; FAR on a log axis)": path
        for path in sorted((run_dir / IJB_NAME).glob("*_roc.png"))
    }
    title = f"marginface run: {run_dir.name} ({run.config.loss}, {run.config.dataset})"
    sections = report_sections(pictured, images, rocs)
    if evaluation.pairs:  # judged by verification pairs (faces): the face report
        from .verification import draw_verification_pictures, verification_sections

        steps = _verification_steps(run_dir)
        drawn = draw_verification_pictures(evaluation, history, steps, out)
        first, last = verification_sections(evaluation, drawn)
        page = [*first, *sections, *([last] if last is not None else [])]
        report = write_report(out / REPORT_NAME, title=title, sections=page)
        return RunReport(report, {**images, **drawn})
    report = write_report(
        out / REPORT_NAME,
        title=title,
        rows=[{"metric": k, "value": v} for k, v in evaluation.metrics.items()],
        columns=("metric", "value"),
        sections=sections,
    )
    return RunReport(report, images)


def _verification_steps(run_dir: Path) -> list[dict[str, Any]]:
    """The rows of the run's ``verification.csv`` (every ``verify_every`` steps), or ``[]``."""
    from ..train import read_history
    from ..train.run_log import VERIFICATION_NAME

    path = run_dir / VERIFICATION_NAME
    return read_history(path) if path.is_file() else []


def write_quality_report(run_dir: str | os.PathLike[str], evaluation: Evaluation) -> Path:
    """``RUN/erc.png`` (error versus reject, the feature magnitude as quality:
    ``evaluation.erc``, a MagFace run's) and ``RUN/evaluation.html`` (the metrics and that
    figure); returns the page's path.

    Args:
        run_dir: the run folder; its name is the figure's legend and the page's title.
        evaluation: the run's :class:`~marginface.train.Evaluation`, with ``erc`` set.
    """
    from ..plots import plot_error_versus_reject, save_figure

    if evaluation.erc is None:
        raise ValueError(
            "evaluation.erc is None: only a run whose feature norm is a quality "
            "score (MagFace) has an error-versus-reject curve"
        )
    run_dir = Path(run_dir)
    image = save_figure(
        plot_error_versus_reject({run_dir.name: evaluation.erc}), run_dir / ERC_NAME
    )
    return write_evaluation_report(
        run_dir / EVALUATION_REPORT_NAME,
        title=f"marginface evaluation: {run_dir.name}",
        metrics=evaluation.metrics,
        images={QUALITY_CAPTION: image},
    )
