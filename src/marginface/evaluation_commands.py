"""The ``marginface align`` and ``marginface ijb`` commands: arguments and what they run.

``cli.py`` registers them (``add_align_arguments``/``run_align``, ``add_ijb_arguments``/
``run_ijb``); the work is :func:`marginface.data.align.align_folder` and
:func:`marginface.evaluation.ijb.evaluate_ijb`.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

__all__ = ["add_align_arguments", "run_align"]


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def add_align_arguments(parser: argparse.ArgumentParser) -> None:
    """``SRC LANDMARKS OUT [--size S] [--workers N]``."""
    parser.add_argument("src", type=Path, help="image folder (e.g. SRC/<identity>/<image>)")
    parser.add_argument(
        "landmarks",
        type=Path,
        help="five landmarks per image: insightface's *_name_5pts_score.txt layout "
        "('name x1 y1 ... x5 y5 score', paths relative to SRC) or the same columns as a CSV",
    )
    parser.add_argument("out", type=Path, help="output folder (same relative paths)")
    parser.add_argument(
        "--size", type=int, default=112, help="crop side, a multiple of 112 or 128 (default 112)"
    )
    parser.add_argument(
        "--workers", type=_positive_int, default=0, help="threads (default 0: one per CPU, <= 8)"
    )


def run_align(args: argparse.Namespace, *, echo: Callable[[str], None]) -> int:
    """Align the folder; print what was written."""
    from .data.align import align_folder

    result = align_folder(
        args.src, args.landmarks, args.out, image_size=args.size, workers=args.workers
    )
    echo(
        f"{result.written} aligned {args.size}x{args.size} crop(s) written to {result.out}"
        + (f"; {result.unlisted} image(s) without landmarks skipped" if result.unlisted else "")
    )
    return 0
