"""The ``marginface align`` and ``marginface ijb`` commands: arguments and what they run.

``cli/parser.py`` registers them (``add_align_arguments``/``run_align``, ``add_ijb_arguments``/
``run_ijb``); the work is :func:`marginface.data.align.align_folder` (a landmarks file) or
:func:`marginface.data.face_photos.align_photos` (``--detector``, options in ``cli/detect.py``) and
:func:`marginface.report.ijb_files.evaluate_ijb_to_files` (over
:func:`~marginface.train.evaluation.ijb_evaluation.ijb_results`, the function behind a training
run's IJB columns too).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .arguments import non_negative_int
from .options import add_backbone_source_arguments

__all__ = [
    "add_align_arguments",
    "add_faces_option",
    "add_ijb_arguments",
    "run_align",
    "run_ijb",
]


def _add_alignment_option(parser: argparse.ArgumentParser, *, default: str) -> None:
    parser.add_argument(
        "--alignment",
        choices=("insightface", "float64"),
        default=default,
        help="the similarity's arithmetic: insightface (its float32 template and estimate: "
        "eval_ijbc.py's crops to the grey level) or float64 (within one grey level of it) "
        f"(default {default})",
    )


def add_align_arguments(parser: argparse.ArgumentParser) -> None:
    """``SRC LANDMARKS OUT`` (landmarks from your detector), ``SRC FACES.jsonl OUT`` (or
    ``--faces-from``: ``marginface detect``'s output) or ``SRC --out OUT --detector mtcnn``
    (detected here); ``[--faces subject|largest|central|all] [--size S] [--workers N]
    [--overwrite]``."""
    from .detect import add_detector_options

    parser.add_argument("src", type=Path, help="image folder (e.g. SRC/<identity>/<image>)")
    parser.add_argument(
        "paths",
        type=Path,
        nargs="*",
        metavar="[LANDMARKS] OUT",
        help="without --detector: the faces already found, either `marginface detect`'s "
        "JSON lines (FACES.jsonl) or five landmarks per image in insightface's "
        "*_name_5pts_score.txt layout ('name x1 y1 ... x5 y5 score', paths relative to SRC) "
        "or the same columns as a CSV; then the output folder (same relative paths; or --out)",
    )
    parser.add_argument("--out", type=Path, help="output folder (instead of the positional OUT)")
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the contents of an OUT that holds files (default: refused); the new "
        "crops replace the old ones only once all are written",
    )
    parser.add_argument(
        "--size",
        type=int,
        default=None,
        help="crop side, a multiple of 112 or 128 for ArcFace crops (default 112, or "
        "--for-model's input side)",
    )
    parser.add_argument(
        "--for-model",
        metavar="MODEL",
        default=None,
        help="cut the faces the way MODEL takes them (its description's face_crop and input "
        "size): a pretrained model's name (dlib-resnet-v1: dlib chips of 150 px), a run folder "
        "or a weights file (default: ArcFace-template crops)",
    )
    parser.add_argument(
        "--workers", type=non_negative_int, default=0, help="threads (default 0: one per CPU, <= 8)"
    )
    _add_alignment_option(parser, default="float64")
    detection = parser.add_argument_group(
        "the faces: detected here (--detector) or read from detect's output (--faces-from)"
    )
    add_detector_options(detection, required=False)
    add_faces_option(detection, all_faces=True)
    detection.add_argument(
        "--faces-from",
        type=Path,
        metavar="FACES.jsonl",
        help="`marginface detect`'s output: cut the faces it found (no detection here; "
        "--faces chooses among a photo's faces) (default: none; a .jsonl LANDMARKS is read "
        "alike)",
    )
    detection.add_argument(
        "--report",
        type=Path,
        help="TSV of the photos with no face, several faces or unreadable "
        "(default: OUT.report.tsv beside OUT)",
    )


FACES_HELP = (
    "which face of a photo with several: subject (the one a person would pick: whole, large "
    "and central; measured on LFW, docs/detection.md), largest (box area), central (box "
    "centre nearest the photo's)"
)


def add_faces_option(parser: argparse.ArgumentParser | Any, *, all_faces: bool) -> None:
    """``--faces subject|largest|central[|all]`` (default subject)."""
    choices = ("subject", "largest", "central") + (("all",) if all_faces else ())
    parser.add_argument(
        "--faces",
        choices=choices,
        default="subject",
        help=FACES_HELP + (", or all (OUT/STEM_K.EXT)" if all_faces else "") + " (default subject)",
    )


def _align_paths(args: argparse.Namespace) -> tuple[Path | None, Path]:
    """``(landmarks or faces file, out)`` from the positionals, ``--out`` and ``--faces-from``;
    ValueError when they do not fit the mode (``--detector`` takes no landmarks file)."""
    paths = list(args.paths)
    if args.out is not None:
        paths.append(args.out)
    if args.faces_from is not None:
        if args.detector:
            raise ValueError("--faces-from gives the faces already found: leave --detector out")
        paths.insert(0, args.faces_from)
    wanted = 1 if args.detector else 2
    if len(paths) != wanted:
        usage = (
            "align SRC --out OUT --detector mtcnn"
            if args.detector
            else "align SRC LANDMARKS OUT, align SRC FACES.jsonl OUT (marginface detect's), or "
            "--detector mtcnn to find the faces here"
        )
        raise ValueError(f"expected {usage}, got {len(paths)} path(s) after SRC")
    return (None, paths[0]) if args.detector else (paths[0], paths[1])


def _crop_for(args: argparse.Namespace) -> tuple[str, int]:
    """``(crop kind, side)``: ``--for-model``'s description (its ``face_crop``, ArcFace when it
    records none, and input side) unless ``--size`` is given; else ArcFace crops of ``--size``
    (112)."""
    if args.for_model is None:
        return "arcface", args.size or 112
    from ..inference.source import describe_model

    description = describe_model(args.for_model)
    if description is None:
        raise ValueError(
            f"--for-model {args.for_model} carries no description: say the crop with --size "
            "(ArcFace-template crops)"
        )
    return description.face_crop or "arcface", args.size or description.side


def _nothing_written(result: Any) -> ValueError:
    listed = f"; listed in {result.report}" if result.report.is_file() else ""
    return ValueError(
        f"no crop written from {result.photos} photo(s): {len(result.no_face)} with no face, "
        f"{len(result.unreadable)} unreadable"
        + (f", {len(result.unlisted)} without a face in the faces file" if result.unlisted else "")
        + f"{listed}; {result.out} left as it was"
    )


def run_align(args: argparse.Namespace, *, echo: Callable[[str], None]) -> int:
    """Align the folder (on its landmarks file, on ``detect``'s faces or on the faces detected
    here); print what was written and what the report lists. What is missing (OpenCV, MTCNN's
    weights, ONNX Runtime) is said before any work; a run that writes no crop is an error and
    leaves OUT as it was."""
    from ..data.face_records import is_face_records
    from ..detect.needs import check_photo_needs

    landmarks, out = _align_paths(args)
    check_photo_needs("align", args.detector or None)
    faces_from = landmarks if landmarks is not None and is_face_records(landmarks) else None
    crop, args.size = _crop_for(args)
    if landmarks is not None and faces_from is None and crop != "arcface":
        raise ValueError(
            f"--for-model {args.for_model} takes {crop} crops, which a landmarks file does not "
            "give here: detect the faces with --detector mtcnn (or marginface detect) instead"
        )
    if landmarks is None or faces_from is not None:
        from .._progress import counting
        from ..data.face_photos import align_photos
        from .detect import detector_from_args

        detector = detector_from_args(args) if faces_from is None else None
        with counting("aligning", unit="photos") as progress:
            result = align_photos(
                args.src,
                out,
                detector=detector,
                faces=args.faces,
                image_size=args.size,
                workers=args.workers,
                report=args.report,
                progress=progress,
                alignment=args.alignment,
                crop=crop,
                faces_from=faces_from,
                overwrite=args.overwrite,
            )
        if not result.written:
            raise _nothing_written(result)
        listed = (
            len(result.no_face)
            + len(result.several_faces)
            + len(result.unreadable)
            + len(result.unlisted)
        )
        unlisted = f", {len(result.unlisted)} not in {faces_from}" if result.unlisted else ""
        echo(
            f"{result.written} aligned {args.size}x{args.size} {crop} crop(s) from "
            f"{result.photos} "
            f"photo(s) written to {result.out}"
            + (
                f"; {len(result.no_face)} with no face, {len(result.several_faces)} with "
                f"several (kept: {args.faces}), {len(result.unreadable)} unreadable{unlisted}: "
                f"listed in {result.report}"
                if listed
                else ""
            )
        )
        return 0
    return _align_landmarks(args, landmarks, out, echo)


def _align_landmarks(
    args: argparse.Namespace, landmarks: Path, out: Path, echo: Callable[[str], None]
) -> int:
    """``align SRC LANDMARKS OUT``: staged beside OUT, published only when complete."""
    from ..data.align import align_folder, check_output_folder
    from ..data.face_photos import staged_output

    check_output_folder(args.src, out)
    with staged_output(out, args.overwrite) as stage:
        result = align_folder(
            args.src,
            landmarks,
            stage.path,
            image_size=args.size,
            workers=args.workers,
            alignment=args.alignment,
        )
        if not result.written:
            raise ValueError(f"no crop written from {landmarks}; {out} left as it was")
    echo(
        f"{result.written} aligned {args.size}x{args.size} crop(s) written to {out}"
        + (f"; {result.unlisted} image(s) without landmarks skipped" if result.unlisted else "")
    )
    return 0


def add_ijb_arguments(parser: argparse.ArgumentParser) -> None:
    """``(RUN | --backbone FILE --model NAME | --onnx FILE) --data-dir DIR [--target IJBC]
    [--batch-size B] [--workers N] [--no-flip] [--no-norm-score] [--no-detector-score]
    [--device D] [--out DIR]``."""
    parser.add_argument(
        "run_dir", type=Path, nargs="?", help="the trained run to evaluate (or --backbone/--onnx)"
    )
    pretrained = parser.add_argument_group(
        "a pretrained backbone, no run folder (docs/backbones.md); --out is then required"
    )
    add_backbone_source_arguments(pretrained)
    parser.add_argument(
        "--data-dir", type=Path, required=True, help="the IJB folder (loose_crop/, meta/)"
    )
    parser.add_argument("--target", choices=("IJBC", "IJBB"), default="IJBC")
    parser.add_argument("--batch-size", type=int, default=128, help="images per batch")
    parser.add_argument(
        "--workers", type=non_negative_int, default=0, help="processes reading and aligning images"
    )
    parser.add_argument(
        "--no-flip", action="store_true", help="ablation: no flip test (embeddings alone)"
    )
    parser.add_argument(
        "--no-norm-score",
        action="store_true",
        help="ablation: normalize each image's feature before pooling",
    )
    parser.add_argument(
        "--no-detector-score",
        action="store_true",
        help="ablation: do not weight images by their detector score",
    )
    parser.add_argument("--device", default="auto")
    parser.add_argument(
        "--gallery-rule",
        choices=("open-set", "insightface-per-gallery"),
        default="open-set",
        help="G1/G2 TPIR@FPIR rule",
    )
    parser.add_argument(
        "--out", type=Path, help="folder for the features, metrics and ROC (default RUN/ijb)"
    )
    _add_alignment_option(parser, default="insightface")


def run_ijb(args: argparse.Namespace, *, echo: Callable[[str], None]) -> int:
    """Check the arguments, evaluate and write
    (:func:`~marginface.report.ijb_files.evaluate_ijb_to_files`), print the table."""
    from ..report import format_table
    from ..report.ijb_files import evaluate_ijb_to_files

    if args.batch_size < 1:
        raise ValueError(f"--batch-size must be >= 1, got {args.batch_size}")
    source = args.backbone if args.backbone is not None else args.onnx
    if source is None and args.run_dir is None:
        raise ValueError("ijb needs RUN, or --backbone FILE --model NAME, or --onnx FILE")
    if source is not None and args.run_dir is not None:
        raise ValueError("--backbone/--onnx evaluate a file, not RUN: leave RUN out")
    if source is None and args.model is not None:
        raise ValueError("--model goes with --backbone")
    if source is not None and args.out is None:
        raise ValueError("--backbone/--onnx need --out DIR (there is no run folder to write to)")
    files = evaluate_ijb_to_files(
        args.data_dir,
        args.target,
        run_dir=args.run_dir,
        backbone=args.backbone,
        onnx=args.onnx,
        model=args.model,
        embedding_dim=args.embedding_dim,
        bgr=args.bgr,
        out=args.out,
        device=args.device,
        batch_size=args.batch_size,
        workers=args.workers,
        flip=not args.no_flip,
        norm_score=not args.no_norm_score,
        detector_score=not args.no_detector_score,
        gallery_rule=args.gallery_rule,
        alignment=args.alignment,
    )
    print(format_table(_percent_rows(files.metrics)))
    echo(f"written to {', '.join(str(w) for w in files.written)} and {files.report}")
    return 0


_RATE_WORDS = ("tar@far", "rank", "tpir@fpir", "auc", "eer")


def _percent_rows(metrics: dict[str, float]) -> list[dict[str, object]]:
    """The table as papers print it: rates (TAR, rank-k, TPIR, AUC, EER) in percent, counts
    as they are; the JSON keeps fractions."""
    rows: list[dict[str, object]] = []
    for key, value in metrics.items():
        rate = any(word in key for word in _RATE_WORDS)
        shown = round(100.0 * value, 2) if rate and value == value else value
        rows.append({"metric": key + (" (%)" if rate else ""), "value": shown})
    return rows
