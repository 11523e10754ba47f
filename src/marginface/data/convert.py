"""Convert image folders and LFW-style pairs into insightface's formats.

* :func:`convert_folder`: ``SRC/<identity>/<image>`` → ``OUT/train.rec``, ``OUT/train.idx`` and
  ``OUT/property``, in the layout insightface's ``face2rec2.py`` writes: record 0 is a header
  record (``flag`` 2, label ``[N + 1, N + 1 + K]``: the images are records ``1 .. N`` and the
  identity records ``N + 1 .. N + K``); record ``k`` (``1 <= k <= N``) is an image (``flag`` 0,
  its class in the header's ``label``, ``id`` = ``k``) stored as a JPEG; identity record
  ``N + 1 + c`` has label ``[first image key, last image key + 1]`` of class ``c``. Classes
  are the sub-folders in sorted order, ``0 .. K - 1``. ``property`` reads ``K,S,S``.
* :func:`convert_pairs`: an LFW ``pairs.txt`` (or any file in that format) and the images it
  names → a verification ``.bin``: the pickle (protocol 2, as insightface's) of
  ``(list of 2·P JPEG bytes, list of P bools)``, pair ``p`` being images ``2p``, ``2p + 1``.

Each writes its framing beside its output (``train.convert.json``, ``<stem>.convert.json``:
the crop and the side, :mod:`marginface.data.framing`), which ``train`` compares: a training
set and a verification set converted with different crops are framed differently, and the
``insightface`` dataset warns, naming the ``--crop`` that frames them alike.

Images are decoded with Pillow (RGB), centre-cropped to a square (and, with ``crop``, to that
many pixels first), resized to ``image_size`` and encoded as JPEG with ``quality``. Every file is
written atomically: after a failure (an unreadable image, a full disk, Ctrl-C) no output file
has changed and no temporary is left.

:func:`marginface.cli.convert_command.run_convert` runs the ``marginface convert`` command.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import pickle
import re
import tarfile
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .._atomic import atomic_write
from .._progress import track
from .._validation import is_same_or_inside
from .folder import list_image_folder
from .framing import write_framing
from .imaging import check_image_size, decode_image
from .lfw import read_lfw_pairs
from .recordio import RecordWriter, pack_image_record

__all__ = [
    "FolderConversion",
    "PairsConversion",
    "convert_folder",
    "convert_pairs",
    "encode_jpeg",
]

logger = logging.getLogger("marginface.convert")  # the name `marginface convert` logs under too

_LFW_IMAGE = re.compile(r"(?:^|/)([^/]+)/\1_(\d{4})\.jpg$")
_BATCH = 256  # images decoded per round (bounds memory whatever the folder's size)


@dataclass(frozen=True)
class FolderConversion:
    """What :func:`convert_folder` wrote.

    Attributes:
        out: the dataset folder (``train.rec``, ``train.idx``, ``property``).
        num_images: image records (keys ``1 .. num_images``).
        num_classes: identities (``property``'s first field).
        image_size: side of the stored square images.
        class_names: the identity folder of each class, in label order.
        crop: the centred square crop in source pixels before resizing, or None (recorded in
            ``OUT/train.convert.json``, :mod:`marginface.data.framing`).
        report: with a detector, the report of photos with no face, several faces or
            unreadable (None when there were none).
    """

    out: Path
    num_images: int
    num_classes: int
    image_size: int
    class_names: tuple[str, ...]
    crop: int | None = None
    report: Path | None = None


@dataclass(frozen=True)
class PairsConversion:
    """What :func:`convert_pairs` wrote.

    Attributes:
        out: the ``.bin`` file.
        num_pairs: pairs (the file holds twice as many images).
        num_same: genuine pairs among them.
        image_size: side of the stored square images.
        crop: the centred square crop in source pixels before resizing, or None (recorded in
            ``<stem>.convert.json`` beside the ``.bin``, :mod:`marginface.data.framing`).
        report: with a detector, the report of images where no face was found (stored as the
            centred ``crop`` instead); None when there were none.
    """

    out: Path
    num_pairs: int
    num_same: int
    image_size: int
    crop: int | None = None
    report: Path | None = None


def _check_side(image_size: object) -> int:
    side = check_image_size(image_size, allow_none=False)
    if side is None:  # pragma: no cover - allow_none=False never returns None
        raise TypeError("image_size must be a positive int, got None")
    return side


def _check_quality(quality: object) -> int:
    if isinstance(quality, bool) or not isinstance(quality, (int, np.integer)):
        raise TypeError(f"quality must be an int in 1..100, got {quality!r}")
    if not 1 <= quality <= 100:
        raise ValueError(f"quality must be in 1..100, got {quality!r}")
    return int(quality)


def _check_crop(crop: object) -> int | None:
    if crop is None:
        return None
    if isinstance(crop, bool) or not isinstance(crop, (int, np.integer)):
        raise TypeError(f"crop must be a positive int or None, got {crop!r}")
    if crop < 1:
        raise ValueError(f"crop must be >= 1 or None, got {crop!r}")
    return int(crop)


def _check_workers(workers: object) -> int:
    if workers is None:
        return os.cpu_count() or 1
    if isinstance(workers, bool) or not isinstance(workers, (int, np.integer)):
        raise TypeError(f"workers must be a positive int or None, got {workers!r}")
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers!r}")
    return int(workers)


def encode_jpeg(image: np.ndarray, quality: int = 95) -> bytes:
    """``uint8[H, W, 3]`` (or ``[H, W]``) → JPEG bytes (Pillow, 4:2:0 chroma, ``quality``)."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(image)).save(buffer, format="JPEG", quality=quality)
    return buffer.getvalue()


def _prepare(
    source: bytes | Path, name: str, image_size: int, crop: int | None, quality: int
) -> bytes:
    try:
        image = decode_image(source, rgb=True, crop=crop, size=image_size)
    except ValueError as error:
        raise ValueError(f"{name}: {error}") from None
    return encode_jpeg(image, quality)


def _in_batches(
    items: Sequence[tuple[bytes | Path, str]],
    work: Callable[[bytes | Path, str], bytes],
    workers: int,
) -> Iterator[bytes]:
    """``work(*item)`` for each item, in order, ``_BATCH`` at a time on ``workers`` threads."""
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for start in range(0, len(items), _BATCH):
            batch = items[start : start + _BATCH]
            yield from pool.map(lambda item: work(*item), batch)


def convert_folder(
    src: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    image_size: int = 112,
    quality: int = 95,
    crop: int | None = None,
    workers: int | None = None,
    detector: object = None,
    faces: str = "subject",
    alignment: str = "float64",
) -> FolderConversion:
    """Write ``SRC/<identity>/<image>`` as an insightface dataset folder (module docstring).

    Args:
        src: one sub-folder per identity, images below it (any extension of
            :data:`~marginface.data.imaging.IMAGE_EXTENSIONS`; hidden files skipped).
        out: the dataset folder (created); ``train.rec``, ``train.idx`` and ``property`` in it
            are replaced, other files (``*.bin``) are left alone.
        image_size: side of the stored images. Default: 112 (insightface's).
        quality: JPEG quality, 1..100. Default: 95.
        crop: centred square crop, in source pixels, before resizing. Default: None.
        workers: decoding threads. Default: ``os.cpu_count()``.
        detector: None (the images are already faces), or a
            :class:`~marginface.detect.DetectorSpec`, ``"mtcnn"``, MTCNN's weights, an SCRFD
            ``.onnx`` or a detector object: each photo's face is then detected and
            aligned to ``image_size`` first (:func:`~marginface.data.face_photos.align_photos`,
            into a temporary folder, losslessly); photos with no face are left out and listed
            with the others in ``OUT.report.tsv``.
        faces, alignment: with a detector, which face and which arithmetic
            (:func:`~marginface.data.face_photos.align_photos`).

    Returns:
        A :class:`FolderConversion`.

    Raises:
        ValueError: ``src`` holds no images in that layout, an image cannot be decoded (named),
            or a bad option (named). Nothing in ``out`` changes.
    """
    size = _check_side(image_size)
    quality = _check_quality(quality)
    crop = _check_crop(crop)
    workers = _check_workers(workers)
    if detector is not None:
        from .convert_detect import convert_detected_folder

        return convert_detected_folder(
            src, Path(out), size, quality, workers, detector, faces, alignment, convert_folder
        )
    items = list_image_folder(src)
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"output {str(out)!r} exists and is not a folder")
    if is_same_or_inside(out, src):
        raise ValueError(
            f"the output folder {str(out)!r} is the image folder or inside it: train.rec would "
            "sit among the identities (and be read as one by the next convert); choose another OUT"
        )
    names = sorted({identity for identity, _ in items})
    label_of = {name: label for label, name in enumerate(names)}
    count = len(items)
    first_identity = count + 1
    logger.info("converting %d images of %d identities from %s", count, len(names), src)

    def work(path: bytes | Path, name: str) -> bytes:
        return _prepare(path, name, size, crop, quality)

    with contextlib.ExitStack() as stack:
        # property is entered first so that it is committed last
        property_file = stack.enter_context(atomic_write(out / "property"))
        writer = stack.enter_context(RecordWriter(out / "train.rec", out / "train.idx"))
        writer.write(0, pack_image_record([first_identity, first_identity + len(names)], b""))
        ranges: dict[int, list[int]] = {}
        sources = [(path, str(path)) for _, path in items]
        encoded_images = track(
            _in_batches(sources, work, workers), "converting", total=count, unit="images"
        )
        for key, encoded in enumerate(encoded_images, start=1):
            label = label_of[items[key - 1][0]]
            writer.write(key, pack_image_record(float(label), encoded, id=key))
            ranges.setdefault(label, [key, key + 1])[1] = key + 1
        for label in range(len(names)):
            key = first_identity + label
            writer.write(key, pack_image_record(ranges[label], b"", id=key))
        property_file.write(f"{len(names)},{size},{size}".encode("ascii"))
    write_framing(out / "train.rec", crop=crop, image_size=size, source=str(src))
    return FolderConversion(out, count, len(names), size, tuple(names), crop)


def _find_pair_images(
    root: Path, wanted: set[tuple[str, int]]
) -> Iterator[tuple[tuple[str, int], bytes | Path]]:
    """``((name, number), path or bytes)`` for the wanted LFW images under a folder or in a
    tar archive (``<Name>/<Name>_NNNN.jpg`` at any depth)."""
    if root.is_dir():
        for name, number in wanted:
            direct = root / name / f"{name}_{number:04d}.jpg"
            if direct.is_file():
                yield (name, number), direct
                continue
            for candidate in root.glob(f"*/{name}/{name}_{number:04d}.jpg"):
                yield (name, number), candidate
                break
        return
    try:
        with tarfile.open(root, "r:*") as archive:
            for member in archive:
                match = _LFW_IMAGE.search(member.name) if member.isfile() else None
                if match and (match.group(1), int(match.group(2))) in wanted:
                    handle = archive.extractfile(member)
                    if handle is not None:
                        yield (match.group(1), int(match.group(2))), handle.read()
    except (tarfile.TarError, EOFError, OSError) as error:
        raise ValueError(f"{root}: neither a folder nor a readable tar archive ({error})") from None


def convert_pairs(
    pairs_file: str | os.PathLike[str],
    images_root: str | os.PathLike[str],
    out_bin: str | os.PathLike[str],
    *,
    image_size: int = 112,
    crop: int | None = 150,
    quality: int = 95,
    workers: int | None = None,
    detector: object = None,
    faces: str = "subject",
    alignment: str = "float64",
    face_crop: str = "arcface",
) -> PairsConversion:
    """Write the pairs of an LFW-format pairs file as an insightface ``.bin`` verification set.

    The images go through the same decoding as :func:`marginface.data.lfw.load_lfw` (RGB,
    ``crop``, ``image_size``), so the ``.bin`` holds the pairs ``load_lfw(fold=None)`` evaluates,
    in file order, up to JPEG re-encoding.

    Args:
        pairs_file: ``pairs.txt`` format (see :func:`~marginface.data.lfw.read_lfw_pairs`).
        images_root: the ``lfw-deepfunneled`` folder (``<Name>/<Name>_NNNN.jpg``, or one level
            deeper), or its ``.tgz``/``.tar`` archive.
        out_bin: the ``.bin`` to write.
        image_size: side of the stored images. Default: 112.
        crop: centred square crop in source pixels before resizing. Default: 150 (the face
            region of LFW's deep-funneled 250×250 images, as ``load_lfw``); None: whole image.
        quality: JPEG quality, 1..100. Default: 95.
        workers: decoding threads. Default: ``os.cpu_count()``.

        detector: None, or a :class:`~marginface.detect.DetectorSpec`, ``"mtcnn"``, MTCNN's
            weights, an SCRFD ``.onnx`` or a detector
            object: each image's face (``faces``: ``"subject"``, ``"largest"`` or
            ``"central"``) is detected and aligned to ``image_size`` (``alignment``, as
            ``convert --detector`` aligns a training folder); an image with no face is stored
            as its centred ``crop`` and listed in ``OUT.report.tsv``.
        face_crop: with a detector, how the face is cut
            (:func:`~marginface.data.face_crops.cut_face`: ``"arcface"``, ``"dlib-chip"``,
            ``"mtcnn-box"``; a model description's ``face_crop``). Default: ``"arcface"``.

    Returns:
        A :class:`PairsConversion`.

    Raises:
        ValueError: a malformed pairs file (line named), an image it names is missing from
            ``images_root`` or cannot be decoded (named), or a bad option. ``out_bin`` is left
            as it was.
    """
    size = _check_side(image_size)
    quality = _check_quality(quality)
    crop = _check_crop(crop)
    workers = _check_workers(workers)
    from .convert_detect import detected_framing, pair_worker

    work, missed = pair_worker(
        detector,
        faces,
        alignment,
        size,
        crop,
        quality,
        prepare=_prepare,
        encode_jpeg=encode_jpeg,
        face_crop=face_crop,
    )
    pairs_file, images_root = Path(pairs_file), Path(images_root)
    if not images_root.exists():
        raise FileNotFoundError(f"LFW images {str(images_root)!r} not found")
    pairs = read_lfw_pairs(pairs_file)
    if not pairs:
        raise ValueError(f"{pairs_file}: no pairs")
    wanted = {key for pair in pairs for key in (pair.first, pair.second)}
    found = dict(
        track(
            _find_pair_images(images_root, wanted),
            f"finding the pairs' images in {images_root.name}",
            total=len(wanted),
            unit="images",
        )
    )
    for line, pair in enumerate(pairs, start=2):
        for name, number in (pair.first, pair.second):
            if (name, number) not in found:
                raise ValueError(
                    f"{pairs_file}:{line}: image {name}/{name}_{number:04d}.jpg is not in "
                    f"{images_root}"
                )
    order = sorted(found)
    sources = [(found[key], f"{images_root}: {key[0]}_{key[1]:04d}.jpg") for key in order]

    encoding = track(
        _in_batches(sources, work, workers), "converting", total=len(order), unit="images"
    )
    encoded = dict(zip(order, encoding, strict=True))
    bins = [encoded[key] for pair in pairs for key in (pair.first, pair.second)]
    same = [bool(pair.same) for pair in pairs]
    with atomic_write(out_bin) as stream:
        pickle.dump((bins, same), stream, protocol=2)
    report = None
    if missed:
        from .._atomic import atomic_write_text
        from .face_photos import default_report_path

        report = default_report_path(out_bin)
        rows = "".join(f"{name}\tno_face\tstored as the centred crop\n" for name in sorted(missed))
        atomic_write_text(report, "name\tproblem\tdetail\n" + rows)
    write_framing(
        out_bin,
        crop=None if detector is not None else crop,
        image_size=size,
        source=str(images_root),
        detector=None if detector is None else detected_framing(detector, faces, alignment),
    )
    return PairsConversion(Path(out_bin), len(pairs), sum(same), size, crop, report)
