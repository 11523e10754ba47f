"""How pixels enter the model a run trains: ``TrainConfig.model_input`` (pixel normalisation,
colour order, face crop), applied to a loaded dataset (:func:`convert_bundle`) and recorded in
the run's description (:func:`describe_training_run`).

The pipeline's datasets hold ``float32`` images ``x / 255`` in ``[0, 1]``
(:class:`~marginface.data.base.ImageSet`). With a ``model_input`` table the run trains, and
evaluates, on ``(x / 255 - mean[c]) / std[c]`` in the model's colour order instead, so a
pretrained model (dlib's ResNet: per-channel means, ``std = 256/255``) sees its own input
during fine-tuning, and the run's description says so: ``FaceModel(RUN)`` then feeds photos
exactly as the pretrained model is fed.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..data.base import DatasetBundle, ImageSet, StreamedImageSet, VerificationSet
from ..models.description import COLOUR_ORDERS, FACE_CROPS, ModelDescription, describe_run

__all__ = [
    "MODEL_INPUT_KEYS",
    "check_model_input",
    "convert_bundle",
    "convert_colour",
    "describe_training_run",
    "model_input_of",
]

MODEL_INPUT_KEYS = ("mean", "std", "colour", "face_crop")
"""The keys of a ``model_input`` table."""

_LUMA = np.asarray([0.299, 0.587, 0.114], dtype=np.float32)
"""ITU-R BT.601 weights of R, G, B: the grey value of a colour pixel (Pillow's ``convert("L")``)."""


def _channels(colour: str | None) -> int | None:
    return None if colour is None else (1 if colour == "grey" else 3)


def _number_or_list(name: str, value: Any) -> float | list[float]:
    def finite(item: Any) -> bool:
        return not isinstance(item, bool) and isinstance(item, int | float) and math.isfinite(item)

    if isinstance(value, list | tuple):
        if not value or not all(finite(v) for v in value):
            raise ValueError(f"model_input.{name} must be a number or a list of numbers, "
                             f"got {value!r}")  # fmt: skip
        return float(value[0]) if len(value) == 1 else [float(v) for v in value]
    if not finite(value):
        raise ValueError(f"model_input.{name} must be a finite number, got {value!r}")
    return float(value)


def check_model_input(table: Any) -> dict[str, Any]:
    """``table`` checked and normalised: numbers as floats, per-channel values as lists.

    Keys (all optional, :data:`MODEL_INPUT_KEYS`): ``mean`` and ``std`` (a number, or one per
    channel; ``std > 0``), ``colour`` (one of
    :data:`~marginface.models.description.COLOUR_ORDERS`) and ``face_crop`` (one of
    :data:`~marginface.models.description.FACE_CROPS`).

    Raises:
        TypeError: ``table`` is not a mapping.
        ValueError: an unknown key or a bad value, in one line naming it.
    """
    if not isinstance(table, Mapping):
        raise TypeError(f"model_input must be a table, got {table!r}")
    unknown = sorted(set(table) - set(MODEL_INPUT_KEYS))
    if unknown:
        raise ValueError(
            f"model_input has unknown key(s) {', '.join(unknown)}; valid: "
            f"{', '.join(MODEL_INPUT_KEYS)}"
        )
    checked: dict[str, Any] = {}
    colour = table.get("colour")
    if colour is not None and colour not in COLOUR_ORDERS:
        raise ValueError(
            f"model_input.colour must be one of {', '.join(COLOUR_ORDERS)}, got {colour!r}"
        )
    for name in ("mean", "std"):
        if name in table:
            value = _number_or_list(name, table[name])
            count = _channels(colour)
            if isinstance(value, list) and count is not None and len(value) not in (1, count):
                raise ValueError(
                    f"model_input.{name} has {len(value)} values, but colour {colour!r} has "
                    f"{count} channel(s)"
                )
            if name == "std" and any(v <= 0 for v in np.atleast_1d(value)):
                raise ValueError(f"model_input.std must be > 0, got {table[name]!r}")
            checked[name] = value
    if colour is not None:
        checked["colour"] = colour
    crop = table.get("face_crop")
    if crop is not None:
        if crop not in FACE_CROPS:
            raise ValueError(
                f"model_input.face_crop must be one of {', '.join(FACE_CROPS)}, got {crop!r}"
            )
        checked["face_crop"] = crop
    return checked


def model_input_of(description: ModelDescription) -> dict[str, Any]:
    """A description's ``model_input`` table: its ``mean``, ``std``, ``colour`` and (when
    recorded) ``face_crop``."""
    table: dict[str, Any] = {"colour": description.colour}
    for name in ("mean", "std"):
        value = getattr(description, name)
        table[name] = list(value) if isinstance(value, tuple) else float(value)
    if description.face_crop is not None:
        table["face_crop"] = description.face_crop
    return check_model_input(table)


def convert_colour(images: np.ndarray, colour: str) -> np.ndarray:
    """``float32[N, C, H, W]`` images (``C`` = 1 grey, 3 RGB) in ``colour``'s channel order.

    * to ``rgb``/``bgr`` from grey: the grey channel repeated three times;
    * to ``grey`` from RGB: ``0.299 R + 0.587 G + 0.114 B`` (ITU-R BT.601);
    * to ``bgr`` from RGB: the channel axis reversed.

    Raises:
        ValueError: ``colour`` unknown, or ``C`` neither 1 nor 3.
    """
    if colour not in COLOUR_ORDERS:
        raise ValueError(f"colour must be one of {', '.join(COLOUR_ORDERS)}, got {colour!r}")
    channels = images.shape[1]
    if channels not in (1, 3):
        raise ValueError(f"images must have 1 (grey) or 3 (RGB) channels, got {channels}")
    if colour == "grey":
        if channels == 1:
            return images
        return np.einsum("nchw,c->nhw", images, _LUMA, dtype=np.float32)[:, None]
    if channels == 1:
        return np.repeat(images, 3, axis=1)
    return images[:, ::-1].copy() if colour == "bgr" else images


def _per_channel(value: Any, channels: int) -> np.ndarray:
    array = np.asarray(value, dtype=np.float32).reshape(-1)
    if array.size == 1:
        array = np.repeat(array, channels)
    return array.reshape(1, channels, 1, 1)


def _normalised(images: ImageSet, table: Mapping[str, Any]) -> ImageSet:
    """``images`` (``x / 255`` in ``[0, 1]``) in the table's colour, as
    ``(x / 255 - mean[c]) / std[c]`` (float32)."""
    pixels = images.images
    if "colour" in table:
        pixels = convert_colour(pixels, table["colour"])
    channels = pixels.shape[1]
    mean = _per_channel(table.get("mean", 0.0), channels)
    std = _per_channel(table.get("std", 1.0), channels)
    out = ((pixels - mean) / std).astype(np.float32, copy=False)
    return ImageSet(out, images.labels, images.class_names)


def _verification_set(name: str, found: VerificationSet, table: Mapping[str, Any]) -> Any:
    """A verification set fed as the table says (its ``uint8`` images' channels converted)."""
    images = found.images
    if "colour" in table and images.dtype == np.uint8:
        converted = convert_colour(images.astype(np.float32), table["colour"])
        images = np.clip(np.rint(converted), 0, 255).astype(np.uint8)
    elif images.dtype != np.uint8:
        raise ValueError(
            f"verification set {name!r} holds float images already normalised; model_input "
            "needs its uint8 pixels"
        )
    mean = table.get("mean", 0.0)
    std = table.get("std", 1.0)
    mean = tuple(mean) if isinstance(mean, list) else mean
    std = tuple(std) if isinstance(std, list) else std
    return dataclasses.replace(found, images=images, mean=mean, std=std)


def convert_bundle(bundle: DatasetBundle, table: Mapping[str, Any]) -> DatasetBundle:
    """``bundle`` fed as ``table`` (a checked ``model_input``) says; the bundle itself when the
    table is empty (the pipeline's ``x / 255``).

    In-memory sets (``x / 255`` in ``[0, 1]``) are converted to the table's colour
    (:func:`convert_colour`) and normalised, ``(x / 255 - mean[c]) / std[c]``; the verification
    sets' ``mean``/``std`` are replaced (their ``uint8`` channels converted).

    Raises:
        ValueError: a streamed training set (insightface records, normalised by their reader as
            ``(x / 255 - 0.5) / 0.5`` in RGB) with another normalisation or colour, one line.
    """
    if not table:
        return bundle
    train = bundle.train
    if isinstance(train, StreamedImageSet):
        wanted = (table.get("mean", 0.5), table.get("std", 0.5), table.get("colour", "rgb"))
        if wanted != (0.5, 0.5, "rgb"):
            raise ValueError(
                f"dataset {bundle.name!r} streams images normalised as (x/255 - 0.5) / 0.5 in "
                f"RGB; model_input asks for mean {wanted[0]!r}, std {wanted[1]!r}, colour "
                f"{wanted[2]!r}: convert the records to an image folder (dataset folder) instead"
            )
    else:
        train = _normalised(train, table)
    verification = {
        name: _verification_set(name, found, table) for name, found in bundle.verification.items()
    }
    return DatasetBundle(
        bundle.name,
        train,
        _normalised(bundle.test, table),
        bundle.pairs,
        bundle.open_set,
        verification,
    )


def describe_training_run(
    config: Mapping[str, Any],
    meta: Mapping[str, Any],
    history: list[Mapping[str, Any]] | None = None,
) -> ModelDescription:
    """The description of a run's backbone: :func:`~marginface.models.description.describe_run`
    with the run's ``model_input`` (``mean``, ``std``, ``colour``, ``face_crop``) in place of
    the pipeline's normalisation, so that a fine-tuned run is fed as its pretrained model."""
    description = describe_run(config, meta, history)
    table = config.get("model_input") or {}
    changes: dict[str, Any] = {}
    for name in ("mean", "std"):
        if name in table:
            value = table[name]
            changes[name] = tuple(value) if isinstance(value, list | tuple) else value
    for name in ("colour", "face_crop"):
        if table.get(name) is not None:
            changes[name] = table[name]
    return description.replace(**changes) if changes else description
