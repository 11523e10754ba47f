"""``marginface convert``'s arguments, apart from :mod:`marginface.data.convert` (which imports
NumPy and the data package) so that ``marginface convert --help`` answers without them."""

from __future__ import annotations

import argparse
from pathlib import Path

from .detect import add_detector_options

__all__ = ["add_convert_arguments"]


def add_convert_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``marginface convert``'s arguments: ``SRC OUT [--pairs FILE] [--image-size N]
    [--quality Q] [--crop N] [--workers N] [--detector ... (add_detector_options)]``, or
    ``--reindex REC``; :func:`marginface.cli.convert_command.run_convert` runs them."""
    parser.description = (
        "Without --pairs: SRC/<identity>/<image> -> OUT/train.rec, train.idx, property "
        "(insightface's training-set layout). With --pairs: the pairs of an LFW-format pairs "
        "file, images from SRC (the lfw-deepfunneled folder or archive) -> the verification "
        "set OUT (a .bin)."
    )
    parser.add_argument(
        "src", type=Path, nargs="?", metavar="SRC", help="image folder (or LFW archive)"
    )
    parser.add_argument(
        "out", type=Path, nargs="?", metavar="OUT", help="dataset folder (or .bin file)"
    )
    parser.add_argument(
        "--reindex",
        type=Path,
        metavar="REC",
        help="rebuild a missing or damaged .idx from its .rec (REC: the .rec file, or a "
        "folder holding train.rec); no SRC or OUT",
    )
    parser.add_argument(
        "--pairs", type=Path, metavar="FILE", help="LFW-format pairs file: write a .bin"
    )
    parser.add_argument("--image-size", type=int, default=112, metavar="N", help="side in pixels")
    parser.add_argument("--quality", type=int, default=95, metavar="Q", help="JPEG quality")
    parser.add_argument(
        "--crop",
        type=int,
        metavar="N",
        help="centred square crop in source pixels before resizing, for a training folder as "
        "for --pairs; recorded in OUT's .convert.json, and train warns when the training set "
        "and a .bin were cropped differently: convert both with the same --crop (default: "
        "150 with --pairs, the face region of LFW deep-funneled images; none otherwise; "
        "0: none)",
    )
    parser.add_argument(
        "--workers", type=int, metavar="N", help="decoding threads (default: all cores)"
    )
    add_detector_options(
        parser,
        required=False,
        default_help=": detect and align each photo's face first (docs/detection.md), so the "
        "training set and the pairs are aligned the same way; photos without a face are listed "
        "in OUT.report.tsv (default: none, centre crops)",
    )
    parser.add_argument(
        "--faces",
        choices=("subject", "largest", "central", "all"),
        default="subject",
        help="with --detector: which face (subject: whole, large and central; all: every "
        "face, folders only) (default: subject)",
    )
    parser.add_argument(
        "--alignment",
        choices=("float64", "insightface"),
        default="float64",
        help="with --detector: the similarity's arithmetic (docs/evaluation.md) (float64)",
    )
