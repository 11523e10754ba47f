"""The ``marginface align`` and ``marginface ijb`` commands: arguments and what they run.

``cli/parser.py`` registers them (``add_align_arguments``/``run_align``, ``add_ijb_arguments``/
``run_ijb``); the work is :func:`marginface.data.align.align_folder` (a landmarks file) or
:func:`marginface.data.face_photos.align_photos` (``--detector``, options in ``cli/detect.py``) and
:func:`marginface.train.evaluation.ijb_evaluation.ijb_results` (the function behind a training
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


def _file_identity(path: Path) -> str:
    """A backbone file's identity for the feature cache (path, size, modification time)."""
    return f"{path.resolve()}:{path.stat().st_size}:{path.stat().st_mtime_ns}"


def _checkpoint_identity(run_dir: Path) -> str:
    """The run's checkpoint files (name, size, modification time): a retrained or resumed run
    does not reuse features cached for its earlier weights."""
    parts = [
        f"{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}"
        for p in sorted(run_dir.glob("checkpoint*"))
    ]
    return f"{run_dir.resolve()}|" + "|".join(parts)


def _ablation_suffix(args: argparse.Namespace) -> str:
    parts = [
        flag
        for flag, off in (
            ("noflip", args.no_flip),
            ("nonorm", args.no_norm_score),
            ("nodet", args.no_detector_score),
        )
        if off
    ]
    return "-" + "-".join(parts) if parts else ""


def _check_ijb_input(model: object, onnx: Path | None) -> None:
    """IJB's images are aligned to 112×112 (insightface's crops, which ``ijb`` makes); an ONNX
    graph of another fixed input side cannot embed them (``ijb`` has no size option)."""
    inner = getattr(model, "model", model)  # ReversedChannels (--bgr) wraps the graph
    sides = getattr(inner, "input_size", None)
    if onnx is None or sides is None:
        return
    if any(side is not None and side != 112 for side in sides):
        height, width = (side if side is not None else "N" for side in sides)
        raise ValueError(
            f"{onnx} takes {height}x{width} images; ijb embeds IJB's faces aligned to 112x112 "
            "(insightface's crops), so it needs a model of 112x112 input"
        )


def run_ijb(args: argparse.Namespace, *, echo: Callable[[str], None]) -> int:
    """Embed (or read the cached features), evaluate 1:1 and 1:N, write the metrics (JSON,
    and into the run's ``evaluation.json``), the ROC picture and an HTML report of both; print
    the table."""
    import json
    import math

    from .._atomic import atomic_write_text
    from .._progress import progress_callback
    from ..data.ijb import read_ijb_layout
    from ..report import format_table
    from ..train import resolve_device
    from ..train.evaluation.ijb_evaluation import ijb_results
    from ..train.state.layout import IJB_NAME, REPORT_NAME
    from ..train.state.results import update_results

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
    layout = read_ijb_layout(args.data_dir, args.target)
    out = args.out or Path(args.run_dir) / IJB_NAME
    device = resolve_device(args.device)
    name = args.target.lower()
    if source is not None:
        from ..models.pretrained import load_described_backbone

        model, description = load_described_backbone(  # a marginface file says what it is
            args.backbone,
            onnx=args.onnx,
            model=args.model,
            embedding_dim=args.embedding_dim,
            image_size=None if args.onnx is not None else 112,
            bgr=args.bgr or None,
            device=device,
        )
        _check_ijb_input(model, args.onnx)
        label, cache_key = str(source), _file_identity(Path(source))
    else:
        from ..inference.source import open_model

        model, description = open_model(args.run_dir, device=device)  # the checkpoint read once
        label, cache_key = str(args.run_dir), _checkpoint_identity(Path(args.run_dir))

    result = ijb_results(
        model,
        layout,
        device=device,
        batch_size=args.batch_size,
        workers=args.workers,
        cache=out / f"{name}_features.npz",
        cache_key=cache_key,
        progress=progress_callback(f"{args.target} images (flipped too)", unit="images"),
        flip=not args.no_flip,
        norm_score=not args.no_norm_score,
        detector_score=not args.no_detector_score,
        label=label,
        gallery_rule=args.gallery_rule,
        alignment=args.alignment,
        mean=description.mean,  # the crops enter the model as its description says
        std=description.std,
    )
    prefix = f"{name}{_ablation_suffix(args)}_"
    if args.gallery_rule != "open-set":
        prefix = f"{prefix[:-1]}-igallery_"
    metrics = result.as_dict(prefix)
    clean = {k: (None if not math.isfinite(v) else v) for k, v in metrics.items()}
    path = atomic_write_text(
        out / f"{prefix}metrics.json", json.dumps(clean, indent=2, sort_keys=True) + "\n"
    )
    written = [path, *_write_reusable(out, prefix, result, layout)]
    if source is None:  # a run: its evaluation.json holds the IJB numbers too
        written.append(update_results(args.run_dir, "ijb", clean))
    from ..plots import plot_roc, save_figure

    v = result.verification
    picture = save_figure(
        plot_roc({f"{args.target} 1:1": (v.fpr, v.tpr)}), out / f"{prefix}roc.png"
    )
    from ..report import write_evaluation_report

    report = write_evaluation_report(
        out / f"{prefix}{REPORT_NAME}",
        title=f"marginface {args.target}: {Path(label).name}",
        metrics=metrics,
        images={f"{args.target} 1:1 ROC (FAR on a log axis)": picture},
    )
    print(format_table(_percent_rows(metrics)))
    echo(f"written to {', '.join(str(w) for w in [*written, picture])} and {report}")
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


def _write_reusable(out: Path, prefix: str, result, layout) -> list[Path]:
    """What people reuse (insightface's script saves the first): ``PREFIXpairs.npz`` (the
    1:1 pair scores, labels and templates, to overlay several models' ROCs) and
    ``PREFIXtemplates.npz`` (each template's id and normalised feature)."""
    import io

    import numpy as np

    from .._atomic import atomic_write_bytes

    def npz(**arrays) -> bytes:
        buffer = io.BytesIO()
        np.savez(buffer, **arrays)
        return buffer.getvalue()

    pairs = atomic_write_bytes(
        out / f"{prefix}pairs.npz",
        npz(
            scores=np.asarray(result.scores),
            labels=np.asarray(layout.pair_label),
            first=np.asarray(layout.pair_first),
            second=np.asarray(layout.pair_second),
        ),
    )
    written = [pairs]
    if result.template_features is not None:
        written.append(
            atomic_write_bytes(
                out / f"{prefix}templates.npz",
                npz(ids=result.template_ids, features=result.template_features),
            )
        )
    return written
