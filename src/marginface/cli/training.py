"""``marginface train``, ``outliers``, ``compare`` and ``demo``."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .options import (
    _config_from_args,
    _explicit_values,
    _named_option_errors,
    _resumed_config,
    option_name,
)
from .output import _echo, _epoch_printer, _final, _verification_printer, progress_mode

logger = logging.getLogger(__name__)

DEMO_LOSSES = ("normface", "cosface", "arcface", "curricularface")


# ------------------------------------------------------------------ commands
def cmd_train(args: argparse.Namespace) -> int:
    if args.init_from is not None and args.drop_non_dominant is not None:
        raise ValueError("--init-from and --drop-non-dominant both choose the starting weights")
    if args.resume_if_exists:
        _resume_or_start(args)
    if args.drop_non_dominant is not None:
        return _train_with_dominant_centers(args)
    if args.drop_outliers is not None:
        raise ValueError("--drop-outliers goes with --drop-non-dominant RUN")
    if args.init_from is not None:
        return _train_from_backbone(args)
    if args.resume and args.out is not None:
        out = args.out
    else:
        config = _config_from_args(args)
        out = args.out or Path("runs") / f"{config.dataset}-{config.loss}"
    if args.resume:
        config, saved = _resumed_config(args, out)
        return _fit(args, config, out, resume=saved)
    return _fit(args, config, out)


def _resume_or_start(args: argparse.Namespace) -> None:
    """``--resume-if-exists``: the same command line starts a run and continues it after a
    restart (torchrun ``--max-restarts``, a requeued job). When ``--out`` holds a checkpoint the
    command becomes ``--resume`` (``--init-from`` is then ignored: the run's own weights are
    newer); otherwise it starts afresh, replacing a run folder that holds no checkpoint yet (a
    run killed in its first epoch) and refusing any other non-empty folder."""
    from ..train.state.run_state import has_saved_run

    if args.out is None:
        raise ValueError("--resume-if-exists needs --out RUN (the folder to continue)")
    if args.drop_non_dominant is not None:
        raise ValueError("--resume-if-exists does not go with --drop-non-dominant")
    if has_saved_run(args.out):
        args.resume, args.init_from = True, None
    else:
        args.overwrite = True  # prepare_run_dir never deletes a folder that is not a run


def _fit(
    args: argparse.Namespace,
    config: Any,
    out: Path,
    *,
    resume: Any = False,
    initial_state: dict[str, Any] | None = None,
) -> int:
    """Train ``config`` into ``out`` with the command line's progress, printers and
    ``--overwrite``; say where the run is. ``resume``: the saved run to continue
    (:class:`~marginface.train.state.run_state.SavedRun`), or False."""
    from ..train import Trainer
    from ..train.config import describe_recipe
    from ..train.state.checkpoint_writer import CheckpointPolicy
    from ..train.state.preemption import TrainingPreemptedError

    trainer = Trainer(
        config,
        out,
        progress=progress_mode(args),
        progress_seconds=args.progress_seconds,
        # which defaults the dataset chose, the colour it trains on and how to override them,
        # once the run starts
        start_message=lambda meta: describe_recipe(
            config, spell=option_name, in_channels=meta.get("in_channels")
        ),
        callbacks=[_epoch_printer(args)],
        initial_state=initial_state,
        checkpointing=CheckpointPolicy(
            every_steps=args.checkpoint_every,
            every_minutes=args.checkpoint_every_minutes,
            keep=args.keep,
            asynchronous=args.async_checkpoint,
            stop_on_signals=True,
        ),
    )
    trainer.step_callbacks.append(_verification_printer(args))
    try:
        trainer.fit(resume=resume, overwrite=args.overwrite)
    except TrainingPreemptedError as stopped:  # one line per process; the scheduler may requeue
        if trainer.is_main:
            print(f"marginface train: {stopped}", file=sys.stderr)
        return args.preempted_exit_code
    if trainer.is_main:
        _final(args, f"run written to {out} (config.toml, history.csv, checkpoint)")
    return 0


def _train_from_backbone(args: argparse.Namespace) -> int:
    """``train --init-from NAME|FILE``: a new run whose backbone starts from a pretrained
    model's weights (a name of ``marginface models``) or a file's (a state_dict). A model with
    a description (every pretrained name, a file marginface wrote) takes the finetune recipe:
    its architecture, input size and pixel normalisation, a small learning rate, early stages
    frozen, centers at the class means (train/config.py, RECIPES); a file without one takes the
    dataset's recipe and needs --model. The optimizer and schedule start afresh."""
    from ..train.finetune import pretrained_state

    if args.resume:
        raise ValueError("--init-from starts a new run from its weights; it cannot --resume")
    config = _config_from_args(args)  # config.init_from: the recipe, the model's input
    out = args.out or Path("runs") / f"{config.dataset}-{config.loss}"
    # read now (an unreadable file, a pretrained file not on this machine: named before
    # anything is built); loaded into the model the run builds for its data, which names the
    # file if it does not fit (train/build.py, load_initial_state)
    state = pretrained_state(config.init_from, config.model)
    initial_state = {"model": state, "source": str(config.init_from)}
    result = _fit(args, config, out, initial_state=initial_state)
    _echo(args, f"backbone {config.model} was initialized from {config.init_from}")
    return result


def _train_with_dominant_centers(args: argparse.Namespace) -> int:
    """``train --drop-non-dominant RUN``: a new run from RUN's checkpoint with one center per
    class (each class's dominant sub-center), the command line's options applied."""
    from ..train.cleaning import continue_with_dominant_centers

    if args.resume:
        raise ValueError("--drop-non-dominant starts a new run from RUN; it cannot --resume")
    source = Path(args.drop_non_dominant)
    overrides = _explicit_values(args)
    device = overrides.get("device", "auto")
    config, state, dominant = _named_option_errors(
        lambda: continue_with_dominant_centers(
            source, overrides, device=device, drop_outliers=args.drop_outliers
        )
    )
    out = args.out or source.with_name(source.name + "-dominant")
    moved = sum(1 for k in dominant.tolist() if k != 0)
    _echo(
        args,
        f"kept the dominant sub-center of each of {dominant.numel()} classes ({moved} not "
        f"sub-center 0); training with one center per class into {out}"
        + (
            f", leaving out {len(config.exclude)} training samples (exclude)"
            if config.exclude
            else ""
        ),
    )
    return _fit(args, config, out, initial_state=state)


def cmd_outliers(args: argparse.Namespace) -> int:
    from ..train.cleaning import run_outliers, write_outliers_csv
    from ..train.state.layout import OUTLIERS_NAME

    if args.workers is not None and args.workers < 0:
        raise ValueError(f"--workers must be >= 0, got {args.workers}")
    outliers, labels, names = run_outliers(
        args.run_dir, threshold_degrees=args.threshold, device=args.device, workers=args.workers
    )
    out = args.out or Path(args.run_dir) / OUTLIERS_NAME
    path = write_outliers_csv(out, outliers, labels, names)
    flagged, total = outliers.indices.numel(), labels.numel()
    print(
        f"{flagged} of {total} training samples ({100.0 * flagged / total:.2f}%) are farther "
        f"than {outliers.threshold_degrees:g} degrees from their class's dominant sub-center"
    )
    _final(args, f"written to {path}")
    return 0


def _run_compare(
    args: argparse.Namespace, losses: Sequence[str], config, out: Path, *, title: str, demo: bool
) -> int:
    from ..report import format_table
    from ..report.comparison import compare_and_report
    from ..train import TABLE_COLUMNS

    started = time.perf_counter()
    rows_seen: list[dict[str, Any]] = []

    def on_row(row: dict[str, Any]) -> None:
        rows_seen.append(row)
        _echo(
            args, f"{row['loss']}: accuracy {row['accuracy']:.4f}  ({row['train_seconds']:.1f} s)"
        )

    command = "marginface " + " ".join(sys.argv[1:]) if sys.argv[1:] else "marginface"
    result = compare_and_report(
        losses,
        config,
        out,
        overwrite=args.overwrite,
        replace_own=demo,
        progress=progress_mode(args),
        progress_seconds=args.progress_seconds,
        on_row=on_row,
        title=title,
        notes=[f"command: {command}", "configuration: " + repr(config)],
    )
    print(format_table(result.rows, TABLE_COLUMNS))
    _final(args, f"report: {result.report}  ({time.perf_counter() - started:.1f} s in all)")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    config = _config_from_args(args)
    losses = [name.strip() for name in args.losses.split(",") if name.strip()]
    out = args.out or Path("runs") / f"compare-{config.dataset}"
    return _run_compare(
        args, losses, config, out, title=f"Loss comparison on {config.dataset}", demo=False
    )


def demo_config():
    """The demo's recipe on digits (3-D embedding): BatchNorm seed CNN, light dropout, Adam
    with a cosine schedule, the pipeline's per-loss defaults (scale 30 for each of the four
    losses, :data:`~marginface.train.config.PIPELINE_SCALE`); one thread (faster than two on 8×8
    images). Sized to train the four losses in a few minutes on 2 CPU cores (its time is in
    docs/benchmarks.md)."""
    from ..train.config import TrainConfig

    return TrainConfig(
        dataset="digits",
        model="seed-cnn-bn",
        model_options={"dropout": 0.1},
        embedding_dim=3,
        epochs=30,
        batch_size=64,
        lr=3e-3,
        schedule="cosine",
        threads=1,
        device="cpu",
    )


def cmd_demo(args: argparse.Namespace) -> int:
    config = demo_config()
    if args.epochs is not None:
        config.epochs = args.epochs
    return _run_compare(
        args,
        DEMO_LOSSES,
        config,
        args.out,
        title="marginface demo: digits, 3-D embeddings",
        demo=True,
    )
