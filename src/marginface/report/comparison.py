"""The comparison report (what ``marginface compare`` and ``demo`` write): several losses
trained on the same data with the same budget (:func:`marginface.train.compare_losses`), their
pictures drawn and one HTML page, ``OUT/report.html``: the table of every loss's metrics, the
notes (the command and the configuration), then :func:`~.pictures.report_sections`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._progress import DEFAULT_PROGRESS_SECONDS
from ..train.compare import TABLE_COLUMNS, Comparison, compare_losses
from ..train.config import TrainConfig
from ..train.state.layout import REPORT_NAME
from .page import write_report
from .pictures import draw_run_pictures, report_sections

__all__ = ["ComparisonReport", "compare_and_report", "write_comparison_report"]


@dataclass
class ComparisonReport:
    """What :func:`compare_and_report` wrote: one table row per loss (the keys of
    :data:`~marginface.train.compare.TABLE_COLUMNS` among them), the report's path and the
    pictures ``{caption: png_path}`` in the order shown."""

    rows: list[dict[str, Any]]
    report: Path
    images: dict[str, Path]


def write_comparison_report(
    comparison: Comparison,
    out_dir: str | Path,
    *,
    title: str = "marginface comparison",
    notes: Sequence[str] = (),
) -> ComparisonReport:
    """Draw the runs' pictures into ``out_dir`` and write ``out_dir/report.html``.

    Args:
        comparison: :func:`~marginface.train.compare_losses`' rows and runs.
        out_dir: the folder of the PNGs and the report (created).
        title: the page's title. Default: ``"marginface comparison"``.
        notes: paragraphs of plain text under the table (e.g. the command).
    """
    out_dir = Path(out_dir)
    images = draw_run_pictures(comparison.runs, out_dir)
    report = write_report(
        out_dir / REPORT_NAME,
        title=title,
        rows=comparison.rows,
        columns=TABLE_COLUMNS,
        notes=notes,
        sections=report_sections(comparison.runs, images),
    )
    return ComparisonReport(comparison.rows, report, images)


def compare_and_report(
    losses: Sequence[str],
    base: TrainConfig,
    out_dir: str | Path,
    *,
    loss_options: dict[str, dict[str, Any]] | None = None,
    overwrite: bool = False,
    replace_own: bool = False,
    progress: bool | str = False,
    progress_seconds: float = DEFAULT_PROGRESS_SECONDS,
    on_row: Callable[[dict[str, Any]], None] | None = None,
    title: str = "marginface comparison",
    notes: Sequence[str] = (),
) -> ComparisonReport:
    """Train ``base`` once per loss into
    ``out_dir/<loss>`` and evaluate each (:func:`~marginface.train.compare_losses`, whose
    arguments these are), then draw the pictures and write ``out_dir/report.html``
    (:func:`write_comparison_report`, ``title`` and ``notes``)."""
    comparison = compare_losses(
        losses,
        base,
        out_dir,
        loss_options=loss_options,
        overwrite=overwrite,
        replace_own=replace_own,
        progress=progress,
        progress_seconds=progress_seconds,
        on_row=on_row,
    )
    return write_comparison_report(comparison, out_dir, title=title, notes=notes)
