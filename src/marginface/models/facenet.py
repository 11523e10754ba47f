"""facenet-pytorch's published Inception-ResNet-v1 weights: where they are, and loading them.

facenet-pytorch (Tim Esler) converted David Sandberg's TensorFlow FaceNet models to PyTorch and
publishes them as GitHub release assets of its v2.2.9 release (:data:`PUBLISHED_WEIGHTS`): a
state_dict of :class:`~.inception_resnet_v1.InceptionResnetV1` plus the training classifier
``logits`` (``Linear(512 → classes)``), which :func:`load_inception_resnet_v1` drops.

| name | file | trained on | ``logits`` classes |
|---|---|---|---|
| ``vggface2`` | ``20180402-114759-vggface2.pt`` | VGGFace2 | 8631 |
| ``casia-webface`` | ``20180408-102900-casia-webface.pt`` | CASIA-WebFace | 10575 |

The publisher gives no checksum for them and none could be computed when this table was
written, so :attr:`PublishedWeights.sha256` is None: :func:`pretrained_inception_resnet_v1`
then reports the downloaded file's SHA-256 and uses the file only once the caller passes that
digest (after checking it) or ``allow_unverified=True`` (:mod:`.download`).

Input: RGB 160×160 faces, ``(x - 127.5) / 128`` (:func:`.fixed_image_standardization`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from .._validation import check_choice
from .download import fetch_weights
from .inception_resnet_v1 import InceptionResnetV1
from .pretrained import _examples, load_backbone_weights, read_state_dict

__all__ = [
    "FACENET_RELEASE",
    "PUBLISHED_WEIGHTS",
    "PublishedWeights",
    "load_inception_resnet_v1",
    "pretrained_inception_resnet_v1",
]

FACENET_RELEASE = "https://github.com/timesler/facenet-pytorch/releases/download/v2.2.9"
"""The release whose assets are the published weight files."""


@dataclass(frozen=True)
class PublishedWeights:
    """One published weight file.

    Attributes:
        name: facenet-pytorch's ``pretrained=`` name (``"vggface2"``).
        filename: the release asset's name.
        classes: rows of its ``logits`` layer (the training identities).
        sha256: its SHA-256, or None: not known to marginface.
    """

    name: str
    filename: str
    classes: int
    sha256: str | None = None

    @property
    def url(self) -> str:
        """The release asset's URL."""
        return f"{FACENET_RELEASE}/{self.filename}"


PUBLISHED_WEIGHTS: dict[str, PublishedWeights] = {
    "vggface2": PublishedWeights("vggface2", "20180402-114759-vggface2.pt", 8631),
    "casia-webface": PublishedWeights("casia-webface", "20180408-102900-casia-webface.pt", 10575),
}
"""facenet-pytorch's ``pretrained=`` names → their files (no SHA-256 known: None)."""


def load_inception_resnet_v1(
    path: str | os.PathLike[str],
    *,
    image_size: int = 160,
    device: torch.device | str = "cpu",
) -> InceptionResnetV1:
    """An :class:`~.inception_resnet_v1.InceptionResnetV1` in eval mode with the weights of a
    local state_dict file (facenet-pytorch's published ``.pt`` files, or any file of its
    names), read safely (``torch.load(weights_only=True)``,
    :func:`~.pretrained.read_state_dict`). The classifier ``logits.*`` is dropped.

    Args:
        path: the file.
        image_size: the input side the model is built for (only checked: >= 75). Default: 160.
        device: where the model is put. Default: the CPU.

    Returns:
        The model, ``Tensor[N, 3, H, W] -> Tensor[N, 512]`` (not normalised).

    Raises:
        ValueError: one line naming ``path``: no such file, a damaged or truncated file, a
            file that is not a state_dict, another network's weights (how many keys are
            missing and unexpected, with examples), other shapes or dtypes.
    """
    model = InceptionResnetV1(image_size=image_size)
    state = model.adapt_state_dict(read_state_dict(path))
    expected = model.state_dict()
    missing = [key for key in expected if key not in state]
    unexpected = [key for key in state if key not in expected]
    if missing or unexpected:
        raise ValueError(
            f"{path} does not hold facenet-pytorch's InceptionResnetV1 weights: "
            f"{len(missing)} of its {len(expected)} keys are missing "
            f"({_examples(missing) or 'none'}) and {len(unexpected)} in the file are unexpected "
            f"({_examples(unexpected) or 'none'})"
        )
    load_backbone_weights(model, state, source=str(path), name="inception-resnet-v1")
    return model.to(device).eval()


def pretrained_inception_resnet_v1(
    name: str = "vggface2",
    *,
    sha256: str | None = None,
    allow_unverified: bool = False,
    cache_dir: str | os.PathLike[str] | None = None,
    progress: bool = True,
    image_size: int = 160,
    device: torch.device | str = "cpu",
) -> InceptionResnetV1:
    """facenet-pytorch's published weights ``name``, fetched once into the cache
    (:func:`.download.fetch_weights`) and loaded (:func:`load_inception_resnet_v1`).

    Args:
        name: ``"vggface2"`` or ``"casia-webface"`` (:data:`PUBLISHED_WEIGHTS`).
        sha256: the file's SHA-256 as you checked it. Default: the table's (None: unknown, so
            the first call raises :class:`~.download.UnverifiedWeightsError` with the
            downloaded file's SHA-256, and the file is kept in the cache for the next call).
        allow_unverified: use the file without a known SHA-256 (logged). Default: False.
        cache_dir: the weights' cache folder. Default: :func:`.download.default_models_dir`.
        progress: show the download's progress (:func:`.download.fetch_weights`).
        image_size, device: as :func:`load_inception_resnet_v1`.

    Raises:
        ValueError: an unknown ``name``; as :func:`.download.fetch_weights` and
            :func:`load_inception_resnet_v1`.
        OSError: the download failed (:class:`~marginface.data.download.DownloadError`).
    """
    published = PUBLISHED_WEIGHTS[check_choice("name", name, tuple(PUBLISHED_WEIGHTS))]
    path: Path = fetch_weights(
        published.url,
        sha256 if sha256 is not None else published.sha256,
        cache_dir=cache_dir,
        allow_unverified=allow_unverified,
        progress=progress,
    )
    return load_inception_resnet_v1(path, image_size=image_size, device=device)
