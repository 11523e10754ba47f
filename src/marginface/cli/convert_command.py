"""``marginface convert``: parse its arguments (:mod:`.convert_options`), call
:func:`marginface.data.convert.convert_folder`, :func:`~marginface.data.convert.convert_pairs` or
:func:`marginface.data.recordio.rebuild_index`, print one line. The library never sees the
argparse Namespace; ``--detector`` and its options arrive as one
:class:`~marginface.detect.DetectorSpec` (:func:`.detect.detector_spec`)."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable

from .detect import detector_spec

__all__ = ["run_convert"]

logger = logging.getLogger("marginface.convert")


def _reindex(args: argparse.Namespace, say: Callable[[str], None]) -> int:
    """``convert --reindex REC``: :func:`~marginface.data.recordio.rebuild_index` of REC (a
    ``.rec``, or a folder's ``train.rec``)."""
    from ..data.recordio import rebuild_index

    if args.src is not None or args.out is not None or args.pairs is not None:
        raise ValueError("--reindex REC rebuilds REC's .idx: leave SRC, OUT and --pairs out")
    rec = args.reindex / "train.rec" if args.reindex.is_dir() else args.reindex
    if rec.suffix != ".rec" or not rec.is_file():
        raise ValueError(f"--reindex {str(args.reindex)!r}: no .rec file there")
    count = rebuild_index(rec)
    say(f"{rec.with_suffix('.idx')}: {count} records indexed from {rec}")
    return 0


def run_convert(args: argparse.Namespace, *, echo: Callable[[str], None] | None = None) -> int:
    """Run ``marginface convert`` (arguments of
    :func:`marginface.cli.convert_options.add_convert_arguments`).

    Args:
        args: the parsed arguments.
        echo: called with a one-line summary (default: logged at INFO).

    Returns:
        0. Errors are raised (``ValueError``/``TypeError``/``OSError``) for the CLI to report.
    """
    from ..data.convert import convert_folder, convert_pairs

    say = echo or logger.info
    if getattr(args, "reindex", None) is not None:
        return _reindex(args, say)
    if args.src is None or args.out is None:
        raise ValueError("convert needs SRC and OUT (or --reindex REC to rebuild a .idx)")
    crop = getattr(args, "crop", None)
    crop = None if crop == 0 else crop
    workers = getattr(args, "workers", None)
    if args.pairs is not None:
        if args.out.is_dir():
            raise ValueError(f"OUT {str(args.out)!r} is a folder; with --pairs it is a .bin file")
        pairs = convert_pairs(
            args.pairs,
            args.src,
            args.out,
            image_size=args.image_size,
            crop=150 if getattr(args, "crop", None) is None else crop,
            quality=args.quality,
            workers=workers,
            **_detection(args),
        )
        say(
            f"{pairs.out}: {pairs.num_pairs} pairs ({pairs.num_same} same), "
            f"{pairs.image_size}x{pairs.image_size}, "
            f"{'crop ' + str(pairs.crop) if pairs.crop else 'no crop'}"
            + (f"; images with no face (centre crop kept): {pairs.report}" if pairs.report else "")
        )
        return 0
    folder = convert_folder(
        args.src,
        args.out,
        image_size=args.image_size,
        quality=args.quality,
        crop=crop,
        workers=workers,
        **_detection(args),
    )
    say(
        f"{folder.out}: {folder.num_images} images of {folder.num_classes} identities, "
        f"{folder.image_size}x{folder.image_size}, "
        f"{'crop ' + str(folder.crop) if folder.crop else 'no crop'} "
        "(train.rec, train.idx, property, train.convert.json)"
        + (f"; photos left out or with several faces: {folder.report}" if folder.report else "")
    )
    return 0


def _detection(args: argparse.Namespace) -> dict[str, object]:
    """``convert``'s detector options as keyword arguments (none without ``--detector``)."""
    if getattr(args, "detector", None) is None:
        return {}
    if getattr(args, "crop", None) and args.pairs is None:
        raise ValueError(
            "--crop and --detector exclude each other for a folder (the crop is the face)"
        )
    return {"detector": detector_spec(args), "faces": args.faces, "alignment": args.alignment}
