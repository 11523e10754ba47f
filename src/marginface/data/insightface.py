"""insightface's training sets (``train.rec`` + ``train.idx`` + ``property``) as a PyTorch
``Dataset``, read without MXNet, and the ``.bin`` verification sets beside them.

A dataset folder (faces_emore, faces_webface_112x112, ms1m-retinaface-t1, ... or one written by
:func:`marginface.data.convert.convert_folder`) holds:

* ``train.rec`` / ``train.idx``: RecordIO (:mod:`.recordio`). When record 0's header has
  ``flag > 0``, it is insightface's header record: images are the keys ``1 .. label[0] - 1``,
  and the keys ``label[0] .. label[1] - 1`` are identity records (each giving its identity's
  image keys ``[label[0], label[1])``), not images. Without it (``im2rec`` output) every indexed
  key is an image. An image record's class is its header's ``label`` (``label[0]`` when it
  carries an array).
* ``property``: ``num_classes,height,width`` (e.g. ``85742,112,112``).
* ``*.bin``: verification sets (``lfw.bin``, ``cfp_fp.bin``, ``agedb_30.bin``, ...), read by
  :func:`load_verification_sets`.

Images are decoded to RGB and normalised as insightface does, ``(x / 255 - 0.5) / 0.5`` in
``[-1, 1]``. JPEG decoding uses ``simplejpeg`` when it is installed (the ``marginface[jpeg]``
extra; about twice Pillow's JPEG decode rate, docs/benchmarks.md) and Pillow otherwise; PNG
always uses Pillow.
"""

from __future__ import annotations

import copy
import io
import logging
import math
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from .base import DatasetBundle, ImageSet, StreamedImageSet, VerificationSet
from .framing import warn_framing
from .insightface_bin import VerificationBin, load_verification_bin
from .recordio import RecordFormatError, RecordReader, unpack_image_record

__all__ = [
    "DECODERS",
    "InsightFaceDataset",
    "decode_rgb",
    "default_decoder",
    "load_insightface",
    "load_verification_sets",
    "read_property",
]

logger = logging.getLogger(__name__)

DECODERS = ("auto", "pillow", "simplejpeg")
"""Accepted ``decoder`` names: ``auto`` is ``simplejpeg`` when importable, else ``pillow``."""
_MASK64 = (1 << 64) - 1


def read_property(path: str | os.PathLike[str]) -> tuple[int, int, int]:
    """Read an insightface ``property`` file: ``num_classes,height,width``.

    Returns:
        ``(num_classes, height, width)``.

    Raises:
        FileNotFoundError: no file at ``path``.
        ValueError: not three positive integers separated by commas (names the file).
    """
    path = Path(path)
    text = path.read_bytes().decode("utf-8", "replace").strip()
    fields = [field.strip() for field in text.split(",")]
    try:
        values = tuple(int(field) for field in fields)
    except ValueError:
        values = ()
    if len(values) != 3 or min(values) < 1:
        raise ValueError(
            f"{path}: expected 'num_classes,height,width' (three positive integers), "
            f"got {text[:60]!r}"
        )
    return values  # type: ignore[return-value]


def default_decoder() -> str:
    """``"simplejpeg"`` when it can be imported, else ``"pillow"``."""
    try:
        import simplejpeg  # noqa: F401
    except ImportError:
        return "pillow"
    return "simplejpeg"


def _check_decoder(decoder: object) -> str:
    if decoder not in DECODERS:
        raise ValueError(f"decoder must be one of {', '.join(DECODERS)}; got {decoder!r}")
    if decoder == "auto":
        return default_decoder()
    if decoder == "simplejpeg":
        try:
            import simplejpeg  # noqa: F401
        except ImportError as error:
            raise ImportError(
                "decoder='simplejpeg' needs the simplejpeg package (pip install 'marginface[jpeg]')"
            ) from error
    return str(decoder)


def decode_rgb(data: bytes, decoder: str = "pillow") -> np.ndarray:
    """Decode an encoded image to ``uint8[H, W, 3]`` RGB.

    Args:
        data: JPEG, PNG or any format Pillow reads.
        decoder: ``"pillow"`` or ``"simplejpeg"`` (JPEG only; other formats go to Pillow).

    Raises:
        ValueError: the bytes are not a decodable image (a truncated or corrupt JPEG included).
    """
    if decoder == "simplejpeg" and data[:2] == b"\xff\xd8":
        import simplejpeg

        try:
            return simplejpeg.decode_jpeg(data, colorspace="RGB")
        except ValueError as error:
            raise ValueError(f"corrupt JPEG ({error})") from None
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as image:
            return np.asarray(image.convert("RGB"), dtype=np.uint8)
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as error:
        raise ValueError(f"cannot decode the image ({error})") from None


def _uniform(seed: int, epoch: int, index: int) -> float:
    """A uniform number in [0, 1) from ``(seed, epoch, index)`` (splitmix64), the same in every
    process whatever the number of workers."""
    value = (seed * 0x9E3779B97F4A7C15 + epoch * 0xBF58476D1CE4E5B9 + index) & _MASK64
    for _ in range(2):
        value = (value + 0x9E3779B97F4A7C15) & _MASK64
        value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK64
        value ^= value >> 31
    return (value >> 11) / float(1 << 53)


class InsightFaceDataset(Dataset):
    """insightface's ``train.rec`` as a map-style dataset (see the module docstring).

    Args:
        root: the folder holding ``train.rec``, ``train.idx`` and ``property``.
        flip: probability of a horizontal mirror per item (True means 0.5, insightface's
            training augmentation). Default: False (no augmentation).
        seed: the flips are a function of ``(seed, epoch, index)`` (call :meth:`set_epoch`
            before each epoch, as with ``DistributedSampler``), identical with any number of
            workers. None: drawn from torch's generator, which ``DataLoader`` seeds per worker
            and per epoch (the run is then reproducible only with a seeded ``DataLoader``).
            Default: 0.
        decoder: ``"auto"`` (default: ``simplejpeg`` when installed, else Pillow),
            ``"pillow"`` or ``"simplejpeg"``.
        rec_name: the record file's stem. Default: ``"train"``.
        output_size: resize every image to ``output_size × output_size`` on the fly (Pillow's
            area-averaging ``BOX`` filter when shrinking, bilinear when enlarging, as
            :func:`~marginface.data.imaging.decode_image`). None (default): the records' size.

    Attributes:
        num_classes: from ``property``.
        image_size: ``(height, width)`` from ``property``; every image must have it.
        output_size: ``(height, width)`` of the items (``image_size`` unless resized).
        keys: ``int64[N]`` record keys of the images, item ``i`` being record ``keys[i]``.
        decoder: the decoder in use.

    ``dataset[i]`` is ``(image, label)``: ``float32[3, H, W]`` (``output_size``) in ``[-1, 1]``
    and an ``int64`` scalar tensor in ``[0, num_classes)``.

    Raises:
        FileNotFoundError: a file is missing (named).
        ValueError: ``property`` or ``train.idx`` is malformed, or the header record's image
            range does not fit the index (names the file).
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        flip: bool | float = False,
        seed: int | None = 0,
        decoder: str = "auto",
        rec_name: str = "train",
        output_size: int | None = None,
    ) -> None:
        self.root = Path(root)
        if isinstance(flip, bool):
            flip = 0.5 if flip else 0.0
        if not isinstance(flip, (int, float)) or not 0.0 <= float(flip) <= 1.0:
            raise ValueError(f"flip must be a bool or a probability in [0, 1], got {flip!r}")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise TypeError(f"seed must be an int or None, got {seed!r}")
        self.flip = float(flip)
        self.seed = seed
        self.epoch = 0
        self.decoder = _check_decoder(decoder)
        self.property_path = self.root / "property"
        self.num_classes, height, width = read_property(self.property_path)
        self.image_size = (height, width)
        if output_size is not None and (
            isinstance(output_size, bool) or not isinstance(output_size, int) or output_size < 1
        ):
            raise ValueError(f"output_size must be an int >= 1 or None, got {output_size!r}")
        self.output_size = self.image_size if output_size is None else (output_size, output_size)
        self.records = RecordReader(self.root / f"{rec_name}.rec", self.root / f"{rec_name}.idx")
        self.keys = self._image_keys()

    def _image_keys(self) -> np.ndarray:
        reader = self.records
        if 0 not in reader:
            return reader.keys
        header = reader.read_header(0)
        if header.flag == 0:
            return reader.keys
        label = np.asarray(header.label, dtype=np.float64)
        if label.size < 2 or not np.all(np.isfinite(label[:2])) or label[0] < 1:
            raise RecordFormatError(
                f"{reader.path}: record 0: header label {label.tolist()} is not insightface's "
                "[first identity record, end] image range"
            )
        end = int(min(label[0], 2.0**62))
        indexed = reader.keys  # ascending, distinct
        found = int(np.searchsorted(indexed, end) - np.searchsorted(indexed, 1))
        if found != end - 1:  # checked before anything of the header's size is allocated
            present = indexed[(indexed >= 1) & (indexed < end)]
            gaps = np.flatnonzero(present != np.arange(1, present.size + 1))
            first = int(gaps[0]) + 1 if gaps.size else present.size + 1
            raise RecordFormatError(
                f"{reader.index_path}: record 0 says images are records 1..{end - 1}, but "
                f"{end - 1 - found} of them are not indexed (first: record {first})"
            )
        return np.arange(1, end, dtype=np.int64)

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch's flips (with an integer ``seed``)."""
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return int(self.keys.size)

    def without_augmentation(self) -> InsightFaceDataset:
        """A copy that reads the same records (the same :class:`RecordReader`) without
        flipping (``flip = 0``): the images as sub-center clean-up embeds them."""
        plain = copy.copy(self)
        plain.flip = 0.0
        return plain

    def read_item(self, index: int) -> tuple[np.ndarray, int]:
        """Item ``index`` decoded (resized to ``output_size``) but not normalised:
        ``uint8[H, W, 3]`` and its class.

        Raises:
            IndexError: ``index`` outside ``[-len, len)``.
            ValueError: the record is malformed, its label is outside ``[0, num_classes)``,
                or its image is corrupt or not ``image_size`` (names the file and record).
        """
        if not -len(self) <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} images")
        key = int(self.keys[index])
        where = f"{self.records.path}: record {key}"
        header, data = unpack_image_record(self.records.read(key), where=where)
        label = header.class_label
        if not (math.isfinite(label) and label == int(label) and 0 <= label < self.num_classes):
            raise ValueError(
                f"{where}: label {label:g} is outside [0, {self.num_classes}) of "
                f"{self.property_path}"
            )
        try:
            image = decode_rgb(data, self.decoder)
        except ValueError as error:
            raise ValueError(f"{where}: {error}") from None
        if image.shape[:2] != self.image_size:
            raise ValueError(
                f"{where}: image is {image.shape[0]}x{image.shape[1]}, {self.property_path} "
                f"says {self.image_size[0]}x{self.image_size[1]}"
            )
        if self.output_size != self.image_size:
            image = _resized(image, self.output_size)
        return image, int(label)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        image, label = self.read_item(index)
        if self.flip > 0.0:
            draw = (
                _uniform(self.seed, self.epoch, int(index) % len(self))
                if self.seed is not None
                else float(torch.rand(()))
            )
            if draw < self.flip:
                image = image[:, ::-1]
        # (x / 255 - 0.5) / 0.5 in NumPy: float32 division then subtraction, bit for bit what
        # torch computes, but single-threaded (torch's intra-op threads cost ~2 ms per item in
        # the main process of a busy 2-core machine; DataLoader workers run with one thread)
        pixels = np.ascontiguousarray(image.transpose(2, 0, 1), dtype=np.float32)  # (3, H, W)
        pixels /= np.float32(127.5)
        pixels -= np.float32(1.0)
        return torch.from_numpy(pixels), torch.tensor(label, dtype=torch.int64)

    def labels(self) -> np.ndarray:
        """``int64[N]``: every item's class, read from the record headers only (one small read
        per record), each checked against ``num_classes``.

        Raises:
            ValueError: a malformed record or a label outside ``[0, num_classes)``.
        """
        out = np.empty(len(self), dtype=np.int64)
        for index, key in enumerate(self.keys.tolist()):
            label = self.records.read_header(key).class_label
            if not (math.isfinite(label) and label == int(label) and 0 <= label < self.num_classes):
                raise ValueError(
                    f"{self.records.path}: record {key}: label {label:g} is outside "
                    f"[0, {self.num_classes}) of {self.property_path}"
                )
            out[index] = int(label)
        return out

    def __repr__(self) -> str:
        return (
            f"InsightFaceDataset({str(self.root)!r}, images={len(self)}, "
            f"classes={self.num_classes}, size={self.output_size}, flip={self.flip}, "
            f"decoder={self.decoder!r})"
        )


def _resized(image: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """``uint8[H, W, 3]`` → ``uint8[size[0], size[1], 3]``: Pillow's ``BOX`` filter when
    shrinking, bilinear when enlarging (the rule of
    :func:`~marginface.data.imaging.decode_image`)."""
    from PIL import Image

    height, width = size
    shrinking = height <= image.shape[0] and width <= image.shape[1]
    resample = Image.Resampling.BOX if shrinking else Image.Resampling.BILINEAR
    resized = Image.fromarray(np.ascontiguousarray(image)).resize((width, height), resample)
    return np.asarray(resized, dtype=np.uint8)


def load_verification_sets(
    root: str | os.PathLike[str],
    *,
    names: Sequence[str] | None = None,
    image_size: int | None = None,
    rgb: bool = True,
) -> dict[str, VerificationBin]:
    """Every ``*.bin`` verification set in ``root``, decoded (see
    :func:`~marginface.data.insightface_bin.load_verification_bin`).

    Args:
        root: the dataset folder.
        names: only these sets (file stems, e.g. ``["lfw", "agedb_30"]``). None: all.
        image_size: resize every image to this side. None: keep (112 in insightface's sets).
        rgb: three channels (default) or luminance.

    Returns:
        ``{stem: VerificationBin}`` sorted by name; empty when ``root`` has no ``.bin``.

    Raises:
        ValueError: ``root`` is not a folder, a name in ``names`` has no file (the available
            ones are listed), or a set is malformed (its file is named).
    """
    root = Path(root)
    if not root.is_dir():
        raise ValueError(f"verification sets: {str(root)!r} is not a folder")
    found = {path.stem: path for path in sorted(root.glob("*.bin")) if path.is_file()}
    if names is not None:
        if isinstance(names, str):
            names = [names]
        unknown = [name for name in names if name not in found]
        if unknown:
            raise ValueError(
                f"no verification set {', '.join(map(repr, unknown))} in {root}; available: "
                f"{', '.join(found) or 'none'}"
            )
        found = {name: found[name] for name in names}
    sets = {}
    for name, path in found.items():
        logger.info("reading verification set %s", path)
        sets[name] = load_verification_bin(path, image_size=image_size, rgb=rgb)
    return sets


def load_insightface(
    data_dir: str | os.PathLike[str] | None = None,
    *,
    seed: int = 0,
    image_size: int | None = None,
    decoder: str = "auto",
    verification: Sequence[str] | None = None,
    resize: bool = False,
) -> DatasetBundle:
    """The ``insightface`` dataset of the pipeline: ``train.rec`` streamed for training
    (random horizontal flip, [-1, 1]) and every ``*.bin`` beside it as verification sets.

    Args:
        data_dir: the folder holding ``train.rec``, ``train.idx`` and ``property`` (or a folder
            whose ``insightface/`` sub-folder does). Required.
        seed: seeds the flips.
        image_size: the side of the images. None: the records' own (``property``'s). Without
            ``resize`` it must equal ``property``'s side.
        decoder: see :class:`InsightFaceDataset`.
        verification: only these ``.bin`` sets (stems). None: all.
        resize: resize the records and the ``.bin`` sets to ``image_size`` on the fly
            (``train --resize-records``, dataset option ``resize = true``). Default: False.

    Returns:
        A bundle whose ``train`` is a :class:`~marginface.data.base.StreamedImageSet`, whose
        test set is empty (identities of these datasets are open-set: they are judged by the
        verification sets) and whose ``verification`` holds the ``.bin`` sets.
    """
    if data_dir is None:
        raise ValueError("dataset 'insightface' needs --data-dir DIR, DIR holding train.rec")
    root = Path(data_dir)
    if not (root / "train.rec").is_file() and (root / "insightface" / "train.rec").is_file():
        root = root / "insightface"
    if not (root / "train.rec").is_file():
        raise FileNotFoundError(f"dataset 'insightface': no train.rec in {root}")
    if not isinstance(resize, bool):
        raise TypeError(f"resize must be a bool, got {resize!r}")
    if resize and image_size is None:
        raise ValueError("resize = true needs image_size (--image-size N): the side to resize to")
    dataset = InsightFaceDataset(
        root, flip=True, seed=seed, decoder=decoder, output_size=image_size if resize else None
    )
    height, width = dataset.image_size
    if not resize and image_size is not None and (image_size, image_size) != (height, width):
        raise ValueError(
            f"image_size = {image_size} differs from {root / 'property'} ({height}x{width}); "
            "the records are used at their own size: leave --image-size unset, or pass "
            "--resize-records (dataset option resize = true) to resize them on the fly"
        )
    height, width = dataset.output_size
    train = StreamedImageSet(dataset, dataset.labels(), (), (3, height, width), dataset.num_classes)
    test = ImageSet(np.zeros((0, 3, height, width), np.float32), np.zeros(0, np.int64))
    found_sets = load_verification_sets(
        root, names=verification, image_size=image_size if resize else None
    )
    warn_framing(root, found_sets)
    sets = {
        name: VerificationSet(found.images, found.pairs(), mean=0.5, std=0.5)
        for name, found in found_sets.items()
    }
    return DatasetBundle("insightface", train, test, open_set=True, verification=sets)
