"""The commands that use a trained model: ``embed``, ``verify``, ``gallery build/add/remove``
and ``search`` (docs/inference.md).

Each takes the model as ``evaluate`` takes its run: a run folder, a weights file or an ONNX
file (positional ``MODEL``); a file marginface wrote needs no other option, a foreign one
(insightface's ``backbone.pth``) takes ``--arch``, ``--embedding-dim``, ``--image-size`` and
``--bgr``. Heavy modules are imported inside the command functions.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from .arguments import non_negative_int, positive_int
from .options import _add_progress_option
from .output import _echo

__all__ = [
    "add_embed_parser",
    "add_gallery_parser",
    "add_search_parser",
    "add_verify_parser",
]

_SHOWN_SKIPPED = 5

MODEL_HELP = (
    "a run folder, a weights file, an ONNX file, or a pretrained model's name "
    "(dlib-resnet-v1...; `marginface models` lists them)"
)


def _add_model_options(parser: argparse.ArgumentParser) -> None:
    """How the model runs, and what a foreign file without description needs."""
    parser.add_argument("--device", default="cpu", help="where the model runs (default cpu)")
    parser.add_argument("--batch-size", type=positive_int, default=64, help="images per batch")
    flip = parser.add_mutually_exclusive_group()
    flip.add_argument(
        "--flip",
        dest="flip",
        action="store_true",
        default=None,
        help="flip test (default: as the model was evaluated)",
    )
    flip.add_argument(
        "--no-flip",
        dest="flip",
        action="store_false",
        default=None,
        help="no flip test (default: as evaluated)",
    )
    photos = parser.add_argument_group("raw photos instead of aligned crops")
    from .detect import add_detector_options
    from .faces import add_faces_option

    add_detector_options(
        photos,
        required=False,
        default_help=": detect the face of every image that is not of the model's input size "
        "and cut it as the model's description says (default: none, aligned crops only)",
        device=False,  # --device is the model's, and the detector's
    )

    add_faces_option(photos, all_faces=False)
    foreign = parser.add_argument_group("a weights file without marginface's description")
    foreign.add_argument(
        "--arch", help="its architecture: r18 ... r200, mbf, vit_t (default: the description's)"
    )
    foreign.add_argument("--embedding-dim", type=positive_int, help="D (default 512)")
    foreign.add_argument("--image-size", type=positive_int, help="input side (default 112)")
    foreign.add_argument(
        "--bgr", action="store_true", default=None, help="it expects BGR (default: RGB)"
    )


def _face_model(args: argparse.Namespace, source: Any) -> Any:
    from ..inference import FaceModel
    from ..train.distributed import resolve_device

    detector = None
    if args.detector is not None:
        from ..detect.needs import check_photo_needs

        check_photo_needs(f"{args.command} --detector", args.detector, model=source)
        from ..detect import load_detector
        from .detect import detector_spec, limit_convolution_cache

        limit_convolution_cache()
        detector = load_detector(detector_spec(args, device=str(resolve_device(args.device))))
    try:
        return FaceModel(
            source,
            device=resolve_device(args.device),
            batch_size=args.batch_size,
            flip=args.flip,
            detector=detector,
            faces=args.faces,
            model=args.arch,
            embedding_dim=args.embedding_dim,
            image_size=args.image_size,
            bgr=args.bgr,
        )
    except ValueError as error:
        if "carries no marginface description" not in str(error):
            raise
        raise ValueError(
            f"{source} carries no marginface description: pass --arch NAME, and "
            "--embedding-dim and --image-size unless they are insightface's 512 and 112 "
            "(--bgr for a BGR model)"
        ) from None


def _report_skipped(skipped: list[tuple[str, str]]) -> None:
    """Unreadable or misshapen images: counted, the first few listed, on stderr."""
    if not skipped:
        return
    print(f"skipped {len(skipped)} image(s) that could not be used:", file=sys.stderr)
    for path, reason in skipped[:_SHOWN_SKIPPED]:
        print(f"  {path}: {reason}", file=sys.stderr)
    if len(skipped) > _SHOWN_SKIPPED:
        print(f"  ... and {len(skipped) - _SHOWN_SKIPPED} more", file=sys.stderr)


# ------------------------------------------------------------------------------ embed
def add_embed_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    """``marginface embed MODEL FOLDER --out FILE``."""
    embed = sub.add_parser(
        parents=[common],
        name="embed",
        help="embed every image of a folder (aligned crops) into .npz/.parquet, resumably",
        description="One row per image of FOLDER (recursively): its path, its identity "
        "(FOLDER/<identity>/<image>) and its unit embedding. A second run skips the images "
        "already in --out; the file is rewritten atomically as it goes. Unreadable images "
        "and images that are not aligned crops of the model's input size are listed, "
        "skipped and counted.",
    )
    embed.add_argument("model", type=Path, help=MODEL_HELP)
    embed.add_argument("folder", type=Path, help="the images (aligned crops)")
    embed.add_argument(
        "--out", type=Path, required=True, help="embeddings.npz or .parquet (required, no default)"
    )
    embed.add_argument(
        "--workers",
        type=non_negative_int,
        default=0,
        help="threads decoding images (default 0: one per CPU, <= 8)",
    )
    _add_model_options(embed)
    _add_progress_option(embed)
    embed.set_defaults(func="marginface.cli.inference:cmd_embed")


def cmd_embed(args: argparse.Namespace) -> int:
    from ..inference.folder import embed_folder

    model = _face_model(args, args.model)
    from .._progress import counting

    with counting("embedding", unit="images") as progress:
        result = embed_folder(model, args.folder, args.out, workers=args.workers, progress=progress)
    _report_skipped(result.skipped)
    if result.total == 0:  # every image refused: no empty file, and the status says so
        raise ValueError(
            f"none of the {len(result.skipped)} image(s) of {args.folder} could be embedded "
            f"(listed above); nothing written to {result.out}"
        )
    _echo(
        args,
        f"{result.embedded} image(s) embedded, {result.already} already in {result.out}, "
        f"{len(result.skipped)} skipped; {result.total} row(s) of D = {model.embedding_dim}",
    )
    return 0


# ------------------------------------------------------------------------------ verify
def add_verify_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    """``marginface verify MODEL A B``."""
    verify = sub.add_parser(
        parents=[common],
        name="verify",
        help="are two aligned face crops the same person? one line",
        description="The cosine of the two images' embeddings and the decision at the model's "
        "calibrated threshold (FaceModel.calibrate; or --threshold).",
    )
    verify.add_argument("model", type=Path, help=MODEL_HELP)
    verify.add_argument("first", type=Path, help="an aligned crop")
    verify.add_argument("second", type=Path, help="another aligned crop")
    verify.add_argument(
        "--threshold", type=float, help="a cosine threshold (default: the calibrated one)"
    )
    _add_model_options(verify)
    verify.set_defaults(func="marginface.cli.inference:cmd_verify")


def cmd_verify(args: argparse.Namespace) -> int:
    """One line: the two names, the answer and, for each photo whose face was detected
    (``--detector``), the box it was cut from (``Verification.faces``)."""
    model = _face_model(args, args.model)
    answer = model.verify(str(args.first), str(args.second), threshold=args.threshold)
    detected = [
        _face_words(name, face)
        for name, face in zip((args.first, args.second), answer.faces, strict=True)
        if face is not None
    ]
    print(f"{args.first} {args.second}: {answer}" + "".join(f"; {d}" for d in detected))
    return 0


def _face_words(name: Path, face: Any) -> str:
    """``face in NAME: box x1,y1,x2,y2 (score S)``, pixels of the photo to one decimal."""
    box = ",".join(f"{v:.1f}" for v in face.box)
    return f"face in {name}: box {box} (score {face.score:.3f})"


# ------------------------------------------------------------------------------ gallery
def add_gallery_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    """``marginface gallery build|add|remove``."""
    gallery = sub.add_parser(
        parents=[common],
        name="gallery",
        help="identity templates for 1:N search: build, add, remove",
        description="A gallery folder of identity templates (the mean of each identity's "
        "unit embeddings, renormalised), versioned and written atomically.",
    )
    actions = gallery.add_subparsers(dest="action", metavar="ACTION", required=True)
    build = actions.add_parser(
        parents=[common], name="build", help="a gallery from FOLDER/<identity>/<image>"
    )
    build.add_argument("model", type=Path, help=MODEL_HELP)
    build.add_argument("folder", type=Path, help="FOLDER/<identity>/<image> (aligned crops)")
    build.add_argument("--out", type=Path, required=True, help="the gallery folder")
    build.add_argument(
        "--index",
        choices=("auto", "exact", "hnsw", "ivf"),
        default="auto",
        help="auto: exact inner product, HNSW past --approximate-above",
    )
    build.add_argument(
        "--approximate-above",
        type=positive_int,
        default=100_000,
        help="templates past which auto is approximate (default 100000)",
    )
    build.add_argument("--workers", type=non_negative_int, default=0, help="decoding threads")
    build.add_argument("--overwrite", action="store_true", help="replace a gallery at --out")
    _add_model_options(build)
    _add_progress_option(build)
    build.set_defaults(func="marginface.cli.inference:cmd_gallery_build")

    add = actions.add_parser(
        parents=[common], name="add", help="add identities (or images of known ones) from a folder"
    )
    add.add_argument("gallery", type=Path)
    add.add_argument("folder", type=Path, help="FOLDER/<identity>/<image>")
    add.add_argument(
        "--with",
        dest="using",
        type=Path,
        metavar="MODEL",
        help="the model (default: the one the gallery was built with)",
    )
    add.add_argument("--workers", type=non_negative_int, default=0, help="decoding threads")
    _add_model_options(add)
    _add_progress_option(add)
    add.set_defaults(func="marginface.cli.inference:cmd_gallery_add")

    remove = actions.add_parser(parents=[common], name="remove", help="remove identities")
    remove.add_argument("gallery", type=Path)
    remove.add_argument("names", nargs="+", help="identity names")
    remove.set_defaults(func="marginface.cli.inference:cmd_gallery_remove")


def _check_outside(gallery: Path, folder: Path, option: str) -> None:
    """A gallery folder must not be, or be inside, the image folder: its files would mix
    with the photos (and be listed among them on the next run)."""
    from .._validation import is_same_or_inside

    if is_same_or_inside(gallery, folder):
        raise ValueError(
            f"{option} {gallery} is, or is inside, the image folder {folder}: choose a gallery "
            "folder outside it"
        )


def _embed_identities(args: argparse.Namespace, model: Any, folder: Path):
    """The unit embeddings of ``folder``'s identities, their names, an example each, and each
    row's image path and detected face (None without a detector) for the gallery."""
    from ..inference.embed_paths import embed_paths
    from ..inference.folder import list_images

    images = [(p, i) for p, i in list_images(folder) if i]
    if not images:
        raise ValueError(f"{folder} has no FOLDER/<identity>/<image> images: nothing to add")
    identity_of = dict(images)
    from .._progress import counting

    with counting("embedding", unit="images") as progress:
        embedded = embed_paths(
            model, folder, [p for p, _ in images], workers=args.workers, progress=progress
        )
    _report_skipped(embedded.skipped)
    if not embedded.names:
        raise ValueError(f"none of the {len(images)} image(s) in {folder} could be used")
    names = [identity_of[p] for p in embedded.names]
    examples: dict[str, str] = {}
    for path, identity in images:
        if identity in set(names):
            examples.setdefault(identity, str((folder / path).resolve()))
    faces = {
        "paths": [str((folder / p).resolve()) for p in embedded.names],
        "faces": embedded.faces,
    }
    return names, embedded.embeddings, examples, faces


def cmd_gallery_build(args: argparse.Namespace) -> int:
    from ..inference.gallery import MANIFEST_NAME, Gallery

    _check_outside(args.out, args.folder, "--out")
    if (args.out / MANIFEST_NAME).exists() and not args.overwrite:
        raise ValueError(f"{args.out} holds a gallery already: `gallery add` to it, or --overwrite")
    model = _face_model(args, args.model)
    names, rows, examples, faces = _embed_identities(args, model, args.folder)
    gallery = Gallery(
        model.description,
        model_source=_model_source(args.model),
        index_kind=args.index,
        approximate_above=args.approximate_above,
    )
    gallery.add(names, rows, examples, **faces)
    _describe_index(args, gallery)
    gallery.save(args.out)
    _echo(args, f"gallery of {len(gallery)} identities ({len(names)} images) written to {args.out}")
    return 0


def _describe_index(args: argparse.Namespace, gallery: Any) -> None:
    index = gallery.index()
    line = f"index: {index.kind} ({index.backend}) over {len(index)} templates"
    if index.recall_at_10 is not None:
        line += f"; recall@10 against exact search: {index.recall_at_10:.4f}"
    _echo(args, line)


def _model_source(model: Path) -> str:
    """What a gallery records of its model: a pretrained model's name as it is (the file is
    found again wherever this install keeps it), a path made absolute."""
    from ..models.catalogue import pretrained_name

    name = pretrained_name(model)
    if name is not None:
        return name
    return str(model.resolve())


def _gallery_model(args: argparse.Namespace, gallery: Any) -> Any:
    source = args.using or gallery.model_source
    if source is None:
        raise ValueError("the gallery does not name its model: pass --with MODEL")
    model = _face_model(args, source)
    if model.embedding_dim != gallery.embedding_dim:
        raise ValueError(
            f"the gallery holds {gallery.embedding_dim}-D templates, {source} makes "
            f"{model.embedding_dim}-D embeddings: use the model the gallery was built with"
        )
    return model


def cmd_gallery_add(args: argparse.Namespace) -> int:
    from ..inference.gallery import Gallery

    _check_outside(args.gallery, args.folder, "GALLERY")
    gallery = Gallery.load(args.gallery)
    model = _gallery_model(args, gallery)
    before = len(gallery)
    names, rows, examples, faces = _embed_identities(args, model, args.folder)
    gallery.add(names, rows, examples, **faces)
    gallery.save(args.gallery)
    _echo(
        args,
        f"{len(names)} image(s) added: {len(gallery) - before} new identities, "
        f"{len(gallery)} in {args.gallery}",
    )
    return 0


def cmd_gallery_remove(args: argparse.Namespace) -> int:
    from ..inference.gallery import Gallery

    gallery = Gallery.load(args.gallery)
    gallery.remove(list(args.names))
    gallery.save(args.gallery)
    _echo(args, f"{len(args.names)} identities removed; {len(gallery)} left in {args.gallery}")
    return 0


# ------------------------------------------------------------------------------ search
def add_search_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    """``marginface search GALLERY PHOTOS``."""
    search = sub.add_parser(
        parents=[common],
        name="search",
        help="1:N search of photos (aligned crops) in a gallery: top-k, open-set decision",
        description="Embed each probe (an image, or every image of a folder), find the top-k "
        "identities of the gallery, and accept the best when its cosine clears the calibrated "
        "threshold (else 'unknown'). Prints a table; --out writes CSV or JSON, --html a page "
        "with thumbnails of each probe and its match.",
    )
    search.add_argument("gallery", type=Path)
    search.add_argument("photos", type=Path, help="an image or a folder of images")
    search.add_argument(
        "--with",
        dest="using",
        type=Path,
        metavar="MODEL",
        help="the model (default: the one the gallery was built with)",
    )
    search.add_argument("--top-k", type=positive_int, default=5, help="identities listed (5)")
    search.add_argument(
        "--threshold", type=float, help="a cosine threshold (default: the calibrated one)"
    )
    search.add_argument(
        "--truth",
        metavar="folders|FILE.csv",
        help="the probes' identities: 'folders' (PHOTOS/<identity>/<image>) or a CSV of "
        "probe,identity; then search also reports rank-1, the known (mated) probes accepted "
        "right/wrong or rejected, the unknown ones rejected or accepted (FPIR), FNIR at the "
        "threshold and at FPIR 0.01 and 0.1 where the probes support them (default: none)",
    )
    search.add_argument("--out", type=Path, help="results as .csv or .json (default: none)")
    search.add_argument("--html", type=Path, help="an HTML page with thumbnails (default: none)")
    search.add_argument("--workers", type=non_negative_int, default=0, help="decoding threads")
    _add_model_options(search)
    _add_progress_option(search)
    search.set_defaults(func="marginface.cli.inference:cmd_search")


def cmd_search(args: argparse.Namespace) -> int:

    from ..inference.embed_paths import embed_paths
    from ..inference.folder import list_images
    from ..inference.gallery import Gallery

    gallery = Gallery.load(args.gallery)
    if len(gallery) == 0:
        raise ValueError(f"{args.gallery} is empty: add identities with `marginface gallery add`")
    if args.out is not None and args.out.suffix not in (".csv", ".json"):
        raise ValueError(f"--out must end in .csv or .json, got {args.out.name!r}")
    if args.html is not None and args.html.suffix.lower() not in (".html", ".htm"):
        raise ValueError(f"--html must end in .html, got {args.html.name!r}")
    model = _gallery_model(args, gallery)
    if args.photos.is_dir():
        root, relative = args.photos, [p for p, _ in list_images(args.photos)]
    elif args.photos.is_file():
        root, relative = args.photos.parent, [args.photos.name]
    else:
        raise ValueError(f"no image or folder at {args.photos}")
    truth = None
    if args.truth is not None:  # read and checked before any image is embedded
        from ..inference.truth import read_truth

        truth = dict(zip(relative, read_truth(args.truth, relative, root=root), strict=True))
        gallery.mated(list(truth.values()))
    embedded = embed_paths(model, root, relative, workers=args.workers)
    _report_skipped(embedded.skipped)
    if not embedded.names:
        raise ValueError(f"no usable image in {args.photos} ({len(embedded.skipped)} skipped)")
    names, embeddings = embedded.names, embedded.embeddings
    results = gallery.search(
        embeddings, names, k=args.top_k, threshold=args.threshold, faces=embedded.faces
    )
    report = None
    if truth is not None:  # before anything is printed or written: its errors stop it all
        report = gallery.open_set(
            embeddings, [truth[name] for name in names], threshold=args.threshold
        )
    threshold = args.threshold if args.threshold is not None else gallery.description.threshold
    if threshold is None:
        print(
            "no calibrated threshold: every probe gets its best match (calibrate the model, "
            "or pass --threshold)",
            file=sys.stderr,
        )
    from ..report import format_table

    table = [
        {
            "probe": r.probe,
            "identity": r.identity or "unknown",
            "cosine": r.score,
            "top-k": ", ".join(f"{i} {s:.3f}" for i, s in r.matches),
        }
        for r in results
    ]
    print(format_table(table))
    if report is not None:
        print(f"truth ({args.truth}):")
        for line in report.lines():
            print(f"  {line}")
    if args.out is not None:
        _write_results(args.out, results)
        _echo(args, f"written to {args.out}")
    if args.html is not None:
        from ..report.search_page import write_search_page

        page = write_search_page(
            args.html,
            results,
            probe_paths={name: str(root / name) for name in names},
            examples=gallery.examples,
            threshold=threshold,
            title=f"marginface search: {args.photos.name} in {args.gallery.name}",
        )
        _echo(args, f"page: {page}")
    return 0


def _write_results(path: Path, results: list) -> None:
    import csv
    import io
    import json

    from .._atomic import atomic_write_text

    if path.suffix == ".json":
        atomic_write_text(path, json.dumps([r.as_dict() for r in results], indent=1) + "\n")
        return
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    header = ["probe", "identity", "cosine", "accepted", "rank", "match", "match_cosine"]
    detected = any(r.face is not None for r in results)  # else the columns as they were
    if detected:  # the probe's face in its photo's pixels; empty for an aligned crop
        header += ["box_x1", "box_y1", "box_x2", "box_y2", "face_score"]
    writer.writerow(header)
    for r in results:
        face: list[str] = []
        if detected:
            face = ["", "", "", "", ""]
            if r.face is not None:
                face = [f"{v:.3f}" for v in r.face.box] + [f"{r.face.score:.6f}"]
        for rank, (identity, score) in enumerate(r.matches, start=1):
            writer.writerow(
                [
                    r.probe,
                    r.identity or "",
                    f"{r.score:.6f}",
                    "" if r.accepted is None else r.accepted,
                    rank,
                    identity,
                    f"{score:.6f}",
                    *face,
                ]
            )
    atomic_write_text(path, buffer.getvalue())
