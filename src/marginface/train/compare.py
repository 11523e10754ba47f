"""Train several losses on the same data with the same backbone and budget and evaluate each
(what ``marginface compare`` and ``demo`` run; their pictures and report are drawn and written
by :mod:`marginface.report.comparison`)."""

from __future__ import annotations

import dataclasses
import logging
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._progress import DEFAULT_PROGRESS_SECONDS
from ..registry import get_loss_class
from .build import load_bundle
from .config import TrainConfig
from .evaluation.evaluate import Evaluation, evaluate_run
from .state.results import update_results
from .state.run_folder import OutputExistsError
from .trainer import Trainer

__all__ = ["TABLE_COLUMNS", "Comparison", "RunResults", "compare_losses"]

TABLE_COLUMNS = (
    "loss",
    "accuracy",
    "verification_accuracy",
    "auc",
    "eer",
    "tar@far=1e-03",
    "precision_at_1",
    "map_at_r",
    "epochs",
    "train_seconds",
)

MARKER = ".marginface-compare"

logger = logging.getLogger(__name__)


RunResults = dict[str, tuple[list[dict[str, Any]], Evaluation, Any]]
"""``{loss_name: (history, evaluation, head)}``: what the pictures of several runs are drawn
from (:mod:`marginface.report.pictures`)."""


@dataclass
class Comparison:
    """The result of :func:`compare_losses`: one table row per loss (:data:`TABLE_COLUMNS`
    among its keys) and each loss's run (:data:`RunResults`: its history, evaluation and
    trained head), in the order trained."""

    rows: list[dict[str, Any]]
    runs: RunResults


def _prepare(out_dir: Path, *, overwrite: bool, replace_own: bool) -> None:
    if out_dir.is_dir() and any(out_dir.iterdir()):
        if (overwrite or replace_own) and (out_dir / MARKER).is_file():
            shutil.rmtree(out_dir)
        elif overwrite:
            raise OutputExistsError(
                f"{out_dir} is not empty and was not written by marginface compare/demo; "
                "refusing to delete it"
            )
        else:
            raise OutputExistsError(
                f"output directory {out_dir} already exists; pass --overwrite to replace it"
            )
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / MARKER).write_text("written by marginface compare/demo\n", encoding="utf-8")


def compare_losses(
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
) -> Comparison:
    """Train ``base`` once per loss into ``out_dir/<loss>`` and evaluate each (the report of
    them all: :func:`marginface.report.comparison.compare_and_report`).

    Args:
        losses: registered loss names (validated before anything is trained).
        base: the shared configuration; its ``loss`` is replaced by each name.
        loss_options: per-loss keyword arguments, merged over ``base.loss_options``.
        overwrite: replace an existing ``out_dir`` written by a previous compare/demo (an
            unrelated folder is never deleted); ``replace_own``: the same without asking (the
            demo's default).
        progress, progress_seconds: training progress (see :class:`Trainer`): a tqdm bar on a
            terminal, else a log line every ``progress_seconds`` and per epoch, each naming
            the loss (``[arcface] epoch 3/30 ...``), after an INFO line ``training arcface
            (3 of 4 losses) into OUT/arcface`` (logger ``marginface.train.compare``).
        on_row: called with each loss's table row as soon as it is measured.

    Returns:
        :class:`Comparison`: the table's rows and the runs.
    """
    if not losses:
        raise ValueError("losses must name at least one registered loss")
    for name in losses:
        get_loss_class(name)  # ValueError listing the valid names
    out_dir = Path(out_dir)
    _prepare(out_dir, overwrite=overwrite, replace_own=replace_own)
    bundle = load_bundle(base)
    runs: RunResults = {}
    rows: list[dict[str, Any]] = []
    for number, name in enumerate(losses, start=1):
        options = {**base.loss_options, **(loss_options or {}).get(name, {})}
        config = dataclasses.replace(base, loss=name, loss_options=options)
        run_dir = out_dir / name
        logger.info("training %s (%d of %d losses) into %s", name, number, len(losses), run_dir)
        began = time.perf_counter()
        trainer = Trainer(
            config,
            run_dir,
            bundle=bundle,
            progress=progress,
            progress_seconds=progress_seconds,
            progress_label=name,
        )
        history = trainer.fit()
        seconds = time.perf_counter() - began
        evaluation = evaluate_run(
            run_dir, device=config.device, bundle=bundle, reuse_embeddings=True
        )
        update_results(run_dir, "evaluate", evaluation.metrics)
        row = {"loss": name, **evaluation.metrics, "epochs": len(history)}
        row["train_seconds"] = seconds
        rows.append(row)
        runs[name] = (history, evaluation, trainer.head)
        if on_row is not None:
            on_row(row)
    return Comparison(rows, runs)
