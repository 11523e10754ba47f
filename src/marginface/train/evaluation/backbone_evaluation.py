"""Evaluate a pretrained backbone without a run folder (``marginface evaluate --backbone FILE``
or ``--onnx FILE``): insightface's ``.bin`` verification sets, or an image folder and an
LFW-format pairs file, with insightface's protocol (:func:`~marginface.evaluation.bin_set_metrics`:
Accuracy-Flip on the squared-L2 grid, 10 folds, XNorm, VAL@FAR, beside marginface's finer
threshold search and the ROC)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch
from torch import nn

from ...data.base import VerificationSet
from ...data.insightface import load_verification_sets
from ...evaluation import bin_set_metrics
from ..embeddings import extract_embeddings
from .evaluate import as_is_and_flipped

__all__ = ["bin_image_sizes", "evaluate_backbone"]


def bin_image_sizes(data_dir: str | os.PathLike[str]) -> dict[str, tuple[int, int]]:
    """The side of the images stored in each ``*.bin`` of ``data_dir``, read from its first
    image (a ``.bin``'s images share one size): ``{"lfw": (height, width), ...}`` sorted by
    name; ``{}`` for a folder without ``.bin`` (or not a folder). For messages: the data's own
    size, before any resize.

    Raises:
        UnsafePickleError: a ``.bin`` is not the plain pickle of ``(bins, issame_list)``.
        ValueError: its first image cannot be decoded.
    """
    from ...data.imaging import decode_image
    from ...data.safe_pickle import UnsafePickleError, restricted_load

    sizes: dict[str, tuple[int, int]] = {}
    root = Path(data_dir)
    if not root.is_dir():
        return sizes
    for path in sorted(root.glob("*.bin")):
        content = restricted_load(path)
        try:
            first = content[0][0]
            data = bytes(first) if isinstance(first, (bytes, bytearray)) else first.tobytes()
        except (TypeError, IndexError, KeyError, AttributeError):
            message = f"{path}: expected a pickled (bins, issame_list) pair"
            raise UnsafePickleError(message) from None
        height, width = decode_image(data, rgb=True).shape[:2]
        sizes[path.stem] = (int(height), int(width))
    return sizes


def evaluate_backbone(
    model: nn.Module,
    data_dir: str | os.PathLike[str],
    *,
    pairs: str | os.PathLike[str] | None = None,
    image_size: int = 112,
    device: torch.device | str = "cpu",
    batch_size: int = 256,
    flip: bool = True,
    mean: float | tuple[float, ...] = 0.5,
    std: float | tuple[float, ...] = 0.5,
    face_crop: str | None = None,
) -> dict[str, float]:
    """Verification metrics of ``model`` (``Tensor[N, 3, s, s] -> Tensor[N, D]``, RGB input
    ``(x / 255 - 0.5) / 0.5``) by cosine similarity.

    Args:
        model: e.g. :func:`~marginface.models.pretrained.load_backbone`'s.
        data_dir: a folder of ``*.bin`` sets (each evaluated), or, with ``pairs``, the image
            folder those pairs name (``<Name>/<Name>_NNNN.jpg``, LFW's layout).
        pairs: an LFW-format pairs file (``pairs.txt``); its images are read whole (no crop),
            resized to ``image_size``.
        image_size: side of the model's input. Default: 112.
        device: where the images are embedded. Default: the CPU.
        batch_size: images per forward pass. Default: 256.
        flip: embed the horizontally flipped images too (insightface's flip test). Default:
            True.
        mean, std: a pixel ``x`` enters the model as ``(x / 255 - mean) / std`` (numbers, or
            one per channel). Defaults: 0.5, 0.5 (insightface's; a marginface file's
            description says its own).
        face_crop: with ``pairs``: the images are photos, each face detected by MTCNN and cut
            as the model takes it (a description's ``face_crop``: ``"arcface"``,
            ``"dlib-chip"``, ``"mtcnn-box"``; a photo without a face keeps the whole image,
            resized, and is listed in the report). Default: None (the whole images, resized).

    Returns:
        ``{"<set>_accuracy", "<set>_accuracy_std", "<set>_threshold", "<set>_xnorm",
        "<set>_val@far=1e-03", "<set>_accuracy_midpoint", "<set>_auc", "<set>_eer",
        "<set>_tar@far=1e-03", ...}`` (NaN where not measurable): the keys of
        :func:`~marginface.evaluation.bin_set_metrics`, as ``marginface evaluate`` reports a
        run's ``.bin`` sets.

    Raises:
        ValueError: no ``.bin`` in ``data_dir`` and no ``pairs``, or as the readers raise.
    """
    data_dir = Path(data_dir)
    if pairs is not None:
        from ...data.convert import convert_pairs

        with tempfile.TemporaryDirectory() as folder:
            converted = Path(folder) / f"{Path(pairs).stem}.bin"
            detected = {} if face_crop is None else {"detector": "mtcnn", "face_crop": face_crop}
            convert_pairs(pairs, data_dir, converted, image_size=image_size, crop=None, **detected)
            sets = load_verification_sets(folder)
    else:
        if not data_dir.is_dir():
            raise ValueError(f"--data-dir {str(data_dir)!r} is not a folder")
        sets = load_verification_sets(data_dir, image_size=image_size)
        if not sets:
            raise ValueError(
                f"no .bin verification set in {data_dir}; give --pairs FILE to evaluate the "
                "images of an image folder"
            )
    metrics: dict[str, float] = {}
    for name, found in sets.items():
        verification = VerificationSet(found.images, found.pairs(), mean=mean, std=std)
        if flip:
            as_is, flipped = as_is_and_flipped(
                model, verification, batch_size=batch_size, device=device, name=name
            )
        else:
            as_is = extract_embeddings(
                model,
                found.images,
                batch_size=batch_size,
                device=device,
                transform=verification.model_input,
                desc=name,
            ).numpy()
            flipped = None
        values, _ = bin_set_metrics(as_is, flipped, verification.pairs)
        metrics.update({f"{name}_{key}": value for key, value in values.items()})
    return metrics
