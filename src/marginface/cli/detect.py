"""The ``marginface detect`` command and ``align``'s detector options.

``detect PHOTOS... --out faces.jsonl``: one JSON line per face (file, box, score, landmarks)
from :func:`marginface.data.face_photos.detect_photos`; ``align SRC --out OUT --detector
mtcnn``: :func:`marginface.data.face_photos.align_photos`. Heavy modules are imported inside
the command functions, so ``--help`` stays light.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING

from .arguments import non_negative_int
from .options import _add_progress_option

if TYPE_CHECKING:
    from ..detect.choice import DetectorSpec

__all__ = [
    "add_detect_parser",
    "add_detector_options",
    "detector_from_args",
    "detector_spec",
    "limit_convolution_cache",
    "run_detect",
]

CONVOLUTION_CACHE_CAPACITY = 64
"""Compiled CPU convolutions oneDNN keeps in a detecting process (its default: 1024)."""


def limit_convolution_cache() -> None:
    """Cap oneDNN's cache of compiled CPU convolutions at :data:`CONVOLUTION_CACHE_CAPACITY`
    for this process, unless ``ONEDNN_PRIMITIVE_CACHE_CAPACITY`` is already set.

    oneDNN compiles one primitive per input shape and keeps up to 1024. MTCNN's R-Net and O-Net
    run on as many crops as the last stage passed, a new batch shape almost every chunk of
    photos, so over a photo folder the default cache grows the process with the photos
    (docs/benchmarks.md, "`align`'s memory"). oneDNN reads the variable when it first compiles
    a convolution: call this before the detector runs. The photo commands (``detect``,
    ``align``, ``convert --detector``) call it.
    """
    os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", str(CONVOLUTION_CACHE_CAPACITY))


def add_detector_options(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    *,
    required: bool,
    default_help: str | None = None,
    device: bool = True,
) -> None:
    """The one detector specification every photo command takes (read back by
    :func:`detector_spec`): ``--detector mtcnn|WEIGHTS|FILE.onnx`` (required or not; its help
    ends with ``default_help``), ``--min-face-size``, ``--det-size``, ``--score-threshold``,
    and ``--device`` unless ``device=False`` (a command whose ``--device`` is the model's)."""
    if default_help is None:
        default_help = (
            "" if required else " (default: mtcnn for detect; none for align: read LANDMARKS)"
        )
    parser.add_argument(
        "--detector",
        required=required,
        help="mtcnn (facenet-pytorch 2.6.0's weights: marginface detect --download-weights, "
        "or pip install --no-deps facenet-pytorch==2.6.0), a folder/wheel holding MTCNN's "
        "pnet.pt, rnet.pt, onet.pt, "
        "or insightface's SCRFD/RetinaFace FILE.onnx (det_10g.onnx, ...)" + (default_help or ""),
    )
    parser.add_argument(
        "--min-face-size", type=float, default=20.0, help="MTCNN: smallest face, px (default 20)"
    )
    parser.add_argument(
        "--det-size",
        type=int,
        default=640,
        help="ONNX detector: square input side when the file leaves it open (default 640)",
    )
    parser.add_argument(
        "--score-threshold", type=float, default=0.5, help="ONNX detector: face score (0.5)"
    )
    if device:
        parser.add_argument("--device", default="cpu", help="where MTCNN runs (default cpu)")


def detector_spec(args: argparse.Namespace, *, device: str | None = None) -> DetectorSpec | None:
    """The :class:`~marginface.detect.DetectorSpec` the options of
    :func:`add_detector_options` name (``device``: instead of ``args.device``), or None
    without ``--detector``."""
    from ..detect.choice import DetectorSpec

    if args.detector is None:
        return None
    return DetectorSpec(
        args.detector,
        min_face_size=args.min_face_size,
        input_size=(args.det_size, args.det_size),
        score_threshold=args.score_threshold,
        device=args.device if device is None else device,
    )


def detector_from_args(args: argparse.Namespace) -> object:
    """The detector the options name (:func:`marginface.detect.load_detector` of
    :func:`detector_spec`), with the process's convolution cache limited
    (:func:`limit_convolution_cache`)."""
    from ..detect import load_detector

    limit_convolution_cache()
    return load_detector(detector_spec(args))


def add_detect_parser(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Register ``marginface detect PHOTOS... --out FILE.jsonl [--detector mtcnn]`` and
    ``marginface detect --download-weights``."""
    parser = sub.add_parser(
        "detect",
        parents=[common],
        help="find faces and five landmarks in photos -> one JSON line per face",
        description="Detect the faces of each photo (files or folders) with MTCNN; write one "
        'JSON line per face: {"file", "box": [x1, y1, x2, y2], "score", "landmarks": '
        "[[x, y] x 5]} (eyes, nose tip, mouth corners, pixels), which `marginface align SRC "
        "FACES.jsonl OUT` cuts without detecting again. Photos with no face or that cannot "
        "be read are listed in --report. --download-weights fetches MTCNN's weights "
        "(facenet-pytorch 2.6.0's, checksum checked) into the model cache.",
    )
    parser.add_argument("photos", type=Path, nargs="*", help="photo files or folders")
    parser.add_argument("--out", type=Path, help="the JSON-lines file written (required)")
    parser.add_argument(
        "--report",
        type=Path,
        help="TSV of photos with no face / unreadable (default: OUT.report.tsv beside OUT)",
    )
    parser.add_argument(
        "--workers",
        type=non_negative_int,
        default=0,
        help="threads decoding (0: one per CPU, <= 8)",
    )
    parser.add_argument(
        "--download-weights",
        action="store_true",
        help="fetch MTCNN's three weight files (2 MB, SHA-256 checked) into marginface's model "
        "cache ($MARGINFACE_CACHE/models), then detect PHOTOS if given",
    )
    add_detector_options(parser, required=False)
    _add_progress_option(parser)
    parser.set_defaults(func="marginface.cli.detect:run_detect", detector="mtcnn")


def _download_weights(args: argparse.Namespace) -> None:
    from ..models.download import fetch_mtcnn_weights
    from .output import _echo

    folder = fetch_mtcnn_weights(progress=not getattr(args, "quiet", False))
    _echo(args, f"MTCNN's weights (facenet-pytorch 2.6.0's, SHA-256 checked) in {folder}")


def run_detect(args: argparse.Namespace) -> int:
    """Detect, write the JSON lines and the report atomically; print a summary. No face in any
    photo is an error (no empty JSON-lines file is written; the report says why)."""
    from ..data.face_photos import detect_photos, list_photos
    from ..data.face_records_writer import write_face_records
    from ..detect.needs import check_photo_needs
    from .output import _echo

    if args.download_weights:
        _download_weights(args)
        if not args.photos:
            return 0
    if not args.photos or args.out is None:
        raise ValueError(
            "expected detect PHOTOS... --out FACES.jsonl (or detect --download-weights)"
        )
    out = Path(args.out)
    if out.is_dir():
        raise ValueError(f"--out {out} is a folder; give the JSON-lines file to write")
    onnx = str(args.detector).lower().endswith(".onnx")
    check_photo_needs("detect", args.detector, opencv=onnx)  # SCRFD resizes with OpenCV
    photos = []
    for source in args.photos:
        listed = list_photos(source)
        if source.is_dir():
            listed = [(path, path.as_posix()) for path, _ in listed]
        photos += listed
    results = detect_photos(photos, detector_from_args(args), workers=args.workers)
    from .._progress import counting

    with counting("detecting", unit="photos") as progress:
        written = write_face_records(
            results, out, total=len(photos), report=args.report, progress=progress
        )
    summary = f"{written.faces} face(s) in {written.photos} photo(s) written to {out}"
    if written.problems:
        summary += (
            f"; {written.problems} photo(s) with no face or unreadable listed in {written.report}"
        )
    _echo(args, summary)
    return 0
