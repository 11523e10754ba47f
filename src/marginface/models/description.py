"""What a backbone file says about itself: :class:`ModelDescription`, written into every
backbone file marginface writes and read back by every loader.

A description holds what is needed to use the weights without any other option: the
architecture and its options, the input (channels, size, colour order, pixel normalisation
``(x / 255 - mean) / std``), the embedding size, whether evaluation used the flip test, the
training loss and its options, the verification results the model had, an optional
verification threshold calibrated for a false accept rate, the marginface version that wrote it
and the description's own format version.

Where it lives, per format (:func:`read_description`, :func:`write_description_sidecar`):

=====================  ===========================================================
run checkpoint         the checkpoint's ``"description"`` key (older checkpoints: made
                       from their ``config`` and ``meta`` on reading)
``.pt`` export         the saved dict's ``"description"`` key (weights under ``"model"``)
``.safetensors``       the file's metadata, key :data:`DESCRIPTION_KEY` (JSON text)
ONNX                   the graph's ``metadata_props``, key :data:`DESCRIPTION_KEY`
TorchScript, any file  a JSON file beside it: ``FILE`` + ``.json`` (``model.ts.json``)
=====================  ===========================================================

A description of a newer format version than this marginface reads is a one-line
``ValueError`` naming the file; so is a malformed one. Format 2 added per-channel ``mean`` and
``std`` (a number, or one number per channel) and ``face_crop`` (how faces were cut from photos:
:data:`FACE_CROPS`); a format-1 description reads as before.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "COLOUR_ORDERS",
    "DESCRIPTION_FORMAT_VERSION",
    "DESCRIPTION_KEY",
    "FACE_CROPS",
    "ModelDescription",
    "describe_run",
    "description_of_state",
    "is_torchscript",
    "marginface_version",
    "normalise_pixels",
    "read_description",
    "sidecar_path",
    "write_description_sidecar",
]

DESCRIPTION_FORMAT_VERSION = 2
"""The format version this marginface writes and the newest it reads."""

DESCRIPTION_KEY = "marginface.description"
"""The metadata key of a ``.safetensors`` file and of an ONNX graph's ``metadata_props``."""

COLOUR_ORDERS = ("rgb", "bgr", "grey")
"""The channel orders a description may name: RGB, BGR (the images are reversed on the
channel axis before the model), or one grey channel."""

FACE_CROPS = ("arcface", "dlib-chip", "mtcnn-box")
"""How a model's faces are cut from photos (``ModelDescription.face_crop``):

* ``"arcface"``: a similarity transform of the five landmarks onto insightface's ArcFace
  template (112×112, scaled to other sizes; :func:`marginface.data.align.norm_crop`);
* ``"dlib-chip"``: dlib's face chip (150×150, padding 0.25), reproduced from the five landmarks
  (:mod:`marginface.data.face_chip`);
* ``"mtcnn-box"``: facenet-pytorch's crop, the detector's box (plus a margin) resized to the
  input size, no rotation.

None: not recorded (a marginface training run on crops it was given)."""

_INSIGHTFACE_NORMALISED = ("insightface",)
"""Datasets whose images enter the model as ``(x / 255 - 0.5) / 0.5``; the others as
``x / 255``."""


def marginface_version() -> str:
    """The installed marginface's version (``"unknown"`` when not installed as a package)."""
    try:
        return importlib.import_module("importlib.metadata").version("marginface")
    except Exception:
        return "unknown"


def _finite_or_none(value: Any) -> float | None:
    number = float(value)
    return number if math.isfinite(number) else None


@dataclass(frozen=True)
class ModelDescription:
    """A backbone's self-description (all plain types; JSON-serialisable).

    Attributes:
        architecture: the registered architecture name (``"r50"``, ``"mbf"``, ``"seed-cnn"``).
        embedding_dim: ``D``, the embedding size.
        in_channels: ``C`` of the input. Default: 3.
        image_size: ``(H, W)`` of the input in pixels. Default: ``(112, 112)``.
        architecture_options: further keyword options of the architecture (``dropout``...).
        colour: channel order, one of :data:`COLOUR_ORDERS`. Default: ``"rgb"``.
        mean, std: a ``uint8`` pixel ``x`` of channel ``c`` enters the model as
            ``(x / 255 - mean[c]) / std[c]``; a number is the same for every channel, a tuple
            has one number per channel (in the model's channel order). Defaults: 0.5, 0.5
            (insightface's ``[-1, 1]``).
        flip: whether evaluation averaged the embeddings of the image and its mirror.
        loss: the training loss's registered name, or None (unknown).
        loss_options: its options (``{"margin": 0.5, "scale": 64.0}``...).
        verification: the verification results the model had (``{"lfw_accuracy": 0.99, ...}``).
        threshold: a cosine threshold (same identity when ``cos >= threshold``) calibrated on
            ``threshold_set`` for false accept rate ``threshold_far``; None when not calibrated.
        threshold_far, threshold_set: see ``threshold``.
        face_crop: how the faces the model takes are cut from photos, one of
            :data:`FACE_CROPS`, or None (not recorded).
        marginface_version: the version that wrote the description.
        format_version: the description's format version (:data:`DESCRIPTION_FORMAT_VERSION`).
    """

    architecture: str
    embedding_dim: int
    in_channels: int = 3
    image_size: tuple[int, int] = (112, 112)
    architecture_options: dict[str, Any] = field(default_factory=dict)
    colour: str = "rgb"
    mean: float | tuple[float, ...] = 0.5
    std: float | tuple[float, ...] = 0.5
    flip: bool = False
    loss: str | None = None
    loss_options: dict[str, Any] = field(default_factory=dict)
    verification: dict[str, float | None] = field(default_factory=dict)
    threshold: float | None = None
    threshold_far: float | None = None
    threshold_set: str | None = None
    face_crop: str | None = None
    marginface_version: str = field(default_factory=marginface_version)
    format_version: int = DESCRIPTION_FORMAT_VERSION

    def __post_init__(self) -> None:
        if not isinstance(self.architecture, str) or not self.architecture:
            raise ValueError(f"architecture must be a non-empty str, got {self.architecture!r}")
        for name in ("embedding_dim", "in_channels"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        size = self.image_size
        if isinstance(size, int) and not isinstance(size, bool):
            size = (size, size)
        if (
            not isinstance(size, tuple | list)
            or len(size) != 2
            or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in size)
        ):
            raise ValueError(f"image_size must be an int or (H, W) of ints >= 1, got {size!r}")
        object.__setattr__(self, "image_size", (int(size[0]), int(size[1])))
        if self.colour not in COLOUR_ORDERS:
            raise ValueError(
                f"colour must be one of {', '.join(COLOUR_ORDERS)}, got {self.colour!r}"
            )
        if (self.colour == "grey") != (self.in_channels == 1):
            raise ValueError(
                f"colour {self.colour!r} does not fit in_channels = {self.in_channels} "
                "(grey is one channel, rgb/bgr more)"
            )
        for name in ("mean", "std"):
            object.__setattr__(self, name, self._channel_values(name, getattr(self, name)))
        if any(s <= 0 for s in self._per_channel(self.std)):
            raise ValueError(f"std must be > 0, got {self.std!r}")
        if self.face_crop is not None and self.face_crop not in FACE_CROPS:
            raise ValueError(
                f"face_crop must be one of {', '.join(FACE_CROPS)} or None, got {self.face_crop!r}"
            )
        if not isinstance(self.flip, bool):
            raise ValueError(f"flip must be a bool, got {self.flip!r}")
        if self.threshold is not None and not -1.0 <= float(self.threshold) <= 1.0:
            raise ValueError(f"threshold must be a cosine in [-1, 1], got {self.threshold!r}")
        if self.threshold_far is not None and not 0.0 < float(self.threshold_far) <= 1.0:
            raise ValueError(f"threshold_far must be in (0, 1], got {self.threshold_far!r}")
        version = self.format_version
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            raise ValueError(f"format_version must be an int >= 1, got {version!r}")

    def _channel_values(self, name: str, value: Any) -> float | tuple[float, ...]:
        """``value`` as a float, or a tuple of ``in_channels`` floats; else a ValueError."""

        def finite(item: Any) -> bool:
            return (
                not isinstance(item, bool) and isinstance(item, int | float) and math.isfinite(item)
            )

        if isinstance(value, tuple | list):
            if len(value) != self.in_channels or not all(finite(v) for v in value):
                raise ValueError(
                    f"{name} must be a finite number or {self.in_channels} finite numbers "
                    f"(one per channel), got {value!r}"
                )
            values = tuple(float(v) for v in value)
            return values[0] if len(set(values)) == 1 else values
        if not finite(value):
            raise ValueError(f"{name} must be a finite number, got {value!r}")
        return value

    def _per_channel(self, value: float | tuple[float, ...]) -> tuple[float, ...]:
        return tuple(value) if isinstance(value, tuple) else (float(value),) * self.in_channels

    def normalise(self, pixels: Any) -> Any:
        """``uint8[N, C, H, W]`` pixels (a tensor) → the model's float32 input,
        ``(x / 255 - mean[c]) / std[c]`` per channel ``c`` (:func:`normalise_pixels`)."""
        return normalise_pixels(pixels, self.mean, self.std)

    @property
    def side(self) -> int:
        """The input's side when square (``image_size[0]``), as the architectures take it."""
        return self.image_size[0]

    def to_dict(self) -> dict[str, Any]:
        """The description as plain JSON types (``image_size`` as a list)."""
        data = dataclasses.asdict(self)
        data["image_size"] = list(self.image_size)
        for name in ("mean", "std"):
            if isinstance(data[name], tuple):
                data[name] = list(data[name])
        data["verification"] = {
            k: _finite_or_none(v) if v is not None else None for k, v in self.verification.items()
        }
        return data

    def to_json(self) -> str:
        """:meth:`to_dict` as compact, key-sorted JSON text."""
        return json.dumps(self.to_dict(), sort_keys=True, allow_nan=False)

    def replace(self, **changes: Any) -> ModelDescription:
        """A copy with ``changes`` applied (validated again)."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_dict(cls, data: Any, *, source: str = "the description") -> ModelDescription:
        """A description from :meth:`to_dict`'s form, validated.

        Raises:
            ValueError: one line naming ``source``: not a mapping, a newer format version than
                this marginface reads, an unknown or missing key, a bad value.
        """
        if not isinstance(data, Mapping):
            raise ValueError(
                f"{source}: a model description must be a JSON object, got {type(data).__name__}"
            )
        version = data.get("format_version", 1)
        if (
            isinstance(version, int)
            and not isinstance(version, bool)
            and version > DESCRIPTION_FORMAT_VERSION
        ):
            raise ValueError(
                f"{source} has model description format {version}, newer than this marginface "
                f"reads ({DESCRIPTION_FORMAT_VERSION}); upgrade marginface"
            )
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"{source}: unknown model description key(s) {', '.join(unknown)}")
        missing = [name for name in ("architecture", "embedding_dim") if name not in data]
        if missing:
            raise ValueError(f"{source}: the model description lacks {', '.join(missing)}")
        values = dict(data)
        if isinstance(values.get("image_size"), list):
            values["image_size"] = tuple(values["image_size"])
        for name in ("architecture_options", "loss_options", "verification"):
            if name in values and not isinstance(values[name], Mapping):
                raise ValueError(f"{source}: {name} must be an object, got {values[name]!r}")
            if name in values:
                values[name] = dict(values[name])
        try:
            return cls(**values)
        except (TypeError, ValueError) as error:
            raise ValueError(f"{source}: bad model description: {error}") from None

    @classmethod
    def from_json(cls, text: str | bytes, *, source: str = "the description") -> ModelDescription:
        """:meth:`from_dict` of JSON text; a one-line ``ValueError`` for text that is not JSON."""
        try:
            data = json.loads(text)
        except ValueError as error:
            raise ValueError(f"{source}: the model description is not JSON ({error})") from None
        return cls.from_dict(data, source=source)


_VERIFICATION_WORDS = ("accuracy", "tar@far", "val@far", "auc", "eer", "ijb", "tpir", "rank")


def normalise_pixels(
    pixels: Any, mean: float | tuple[float, ...], std: float | tuple[float, ...]
) -> Any:
    """``uint8[N, C, H, W]`` pixels (a torch tensor) → float32 ``(x / 255 - mean[c]) / std[c]``.

    ``mean`` and ``std`` are numbers (every channel) or one number per channel, as a
    :class:`ModelDescription` holds them (dlib's ResNet: per-channel means, one scale).
    """
    import torch

    x = pixels.float() / 255.0
    if isinstance(mean, tuple | list):
        mean = torch.tensor(mean, dtype=torch.float32, device=x.device).view(1, -1, 1, 1)
    if isinstance(std, tuple | list):
        std = torch.tensor(std, dtype=torch.float32, device=x.device).view(1, -1, 1, 1)
    return (x - mean) / std


def describe_run(
    config: Mapping[str, Any],
    meta: Mapping[str, Any],
    history: list[Mapping[str, Any]] | None = None,
) -> ModelDescription:
    """The description of a training run's backbone, from what its checkpoint holds.

    Args:
        config: the run's configuration as a dict (``TrainConfig.to_dict()``).
        meta: the checkpoint's ``meta`` (``in_channels``, ``image_size``, ``dataset``).
        history: the per-epoch rows; the last row's verification columns (``*_accuracy``,
            ``*tar@far*``, ``*auc``, ``*eer``, IJB's) become :attr:`ModelDescription.verification`.

    The pixel normalisation is the pipeline's: ``(x / 255 - 0.5) / 0.5`` for the
    ``insightface`` dataset, ``x / 255`` (mean 0, std 1) for the others; RGB for three channels,
    grey for one.
    """
    channels = int(meta["in_channels"])
    size = meta["image_size"]
    image_size = (int(size), int(size)) if isinstance(size, int) else (int(size[0]), int(size[1]))
    insightface = str(meta.get("dataset", config.get("dataset", ""))) in _INSIGHTFACE_NORMALISED
    results: dict[str, float | None] = {}
    if history:
        for key, value in history[-1].items():
            if key == "epoch" or isinstance(value, bool) or not isinstance(value, int | float):
                continue
            if any(word in key.lower() for word in _VERIFICATION_WORDS):
                results[str(key)] = _finite_or_none(value)
    return ModelDescription(
        architecture=str(config.get("model", "seed-cnn")),
        embedding_dim=int(config.get("embedding_dim", 3)),
        in_channels=channels,
        image_size=image_size,
        architecture_options=dict(config.get("model_options", {}) or {}),
        colour="rgb" if channels == 3 else "grey" if channels == 1 else "rgb",
        mean=0.5 if insightface else 0.0,
        std=0.5 if insightface else 1.0,
        flip=bool(config.get("flip", False)),
        loss=str(config["loss"]) if config.get("loss") else None,
        loss_options=dict(config.get("loss_options", {}) or {}),
        verification=results,
    )


def sidecar_path(path: str | os.PathLike[str]) -> Path:
    """The JSON description beside a backbone file: ``FILE`` + ``.json``."""
    path = Path(path)
    return path.with_name(path.name + ".json")


def write_description_sidecar(path: str | os.PathLike[str], description: ModelDescription) -> Path:
    """Write ``description`` as JSON beside ``path`` (:func:`sidecar_path`), atomically."""
    from .._atomic import atomic_write_text

    text = json.dumps(description.to_dict(), indent=2, sort_keys=True, allow_nan=False) + "\n"
    return atomic_write_text(sidecar_path(path), text)


def _from_pickled(state: Any, source: str) -> ModelDescription | None:
    """The description inside a loaded ``.pt`` dict or run checkpoint, or None."""
    if not isinstance(state, Mapping):
        return None
    if "description" in state:
        value = state["description"]
        if isinstance(value, str):
            return ModelDescription.from_json(value, source=source)
        return ModelDescription.from_dict(value, source=source)
    if all(k in state for k in ("config", "meta")) and isinstance(state["config"], Mapping):
        history = state.get("history")
        return describe_run(
            state["config"], state["meta"], history if isinstance(history, list) else None
        )
    return None


def description_of_state(state: Any, source: str) -> ModelDescription | None:
    """The description held by an already loaded ``.pt`` file or checkpoint dict (its
    ``"description"`` key, or a run checkpoint's ``config`` and ``meta``), or None."""
    return _from_pickled(state, source)


def read_description(path: str | os.PathLike[str]) -> ModelDescription | None:
    """The description of a backbone file of any format, or None when it carries none.

    A sidecar (:func:`sidecar_path`) wins over what the file holds; then, by format: a
    ``.safetensors`` file's metadata, an ONNX graph's ``metadata_props``, a TorchScript file
    (sidecar only), a ``.pt``/``.pth``/``.ckpt`` dict's ``"description"`` key (or a run
    checkpoint's configuration). A run folder is read by
    :func:`marginface.inference.describe_model` (it needs the run's checkpoint reader).

    Raises:
        ValueError: a malformed description, one of a newer format version, or a
            ``.safetensors``/``.onnx`` file its reader cannot parse (file named).
    """
    path = Path(path)
    source = str(path)
    sidecar = sidecar_path(path)
    if sidecar.is_file():
        return ModelDescription.from_json(sidecar.read_text(encoding="utf-8"), source=str(sidecar))
    if not path.is_file():
        return None
    if path.suffix == ".safetensors":
        safetensors = importlib.import_module("safetensors")
        try:
            with safetensors.safe_open(str(path), framework="pt") as handle:
                metadata = handle.metadata() or {}
        except Exception as error:  # SafetensorError: truncated, or another format
            raise ValueError(f"{path} is not a readable safetensors file ({error})") from None
        text = metadata.get(DESCRIPTION_KEY)
        return None if text is None else ModelDescription.from_json(text, source=source)
    if path.suffix == ".onnx":
        onnx = importlib.import_module("onnx")
        try:
            graph = onnx.load(str(path), load_external_data=False)
        except Exception as error:  # protobuf's DecodeError: truncated, or another format
            reason = str(error).strip().splitlines()[0] if str(error).strip() else ""
            raise ValueError(
                f"{path} is not a readable ONNX model ({reason or type(error).__name__}): "
                "truncated, or another format under an .onnx name"
            ) from None
        for prop in graph.metadata_props:
            if prop.key == DESCRIPTION_KEY:
                return ModelDescription.from_json(prop.value, source=source)
        return None
    if is_torchscript(path):
        return None
    import torch

    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:
        return None  # not a readable pickle: the weights reader says why
    return _from_pickled(state, source)


def is_torchscript(path: Path) -> bool:
    """Whether ``path`` is a TorchScript archive (a zip holding ``constants.pkl``/``code/``)."""
    import zipfile

    if not zipfile.is_zipfile(path):
        return False
    with zipfile.ZipFile(path) as archive:
        return any(
            name.endswith("/constants.pkl") or "/code/" in name for name in archive.namelist()
        )
