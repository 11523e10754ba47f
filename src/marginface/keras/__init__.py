"""marginface for Keras 3: the same margins for TensorFlow, JAX and PyTorch, in ``keras.ops``.

``pip install "marginface[keras]"``; choose the backend with ``KERAS_BACKEND`` as usual.
Importing :mod:`marginface` never imports Keras; only this subpackage does.

>>> import keras, marginface.keras as mfk
>>> head = mfk.create_head("arcface", num_classes=10)           # or mfk.ArcFace(10)
>>> embeddings = keras.Input((3,)); labels = keras.Input((), dtype="int32")
>>> logits = head([embeddings, labels])                          # margin logits (N, C)
>>> model = keras.Model([embeddings, labels], logits)
>>> model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))

Every registered PyTorch loss (``marginface.list_losses()``) has a layer here with the same
options, defaults, checks and state (:mod:`marginface.keras.layers`), and
:class:`CurricularFaceLoss` is CurricularFace as a ``keras.losses.Loss`` on precomputed cosines.
The one-vs-all heads (SphereFace2, UniFace: :mod:`marginface.keras.binary`) return binary logits
and train with their own loss, ``model.compile("adam", head.loss())``.
"""

from __future__ import annotations

from typing import Any

from ..registry import LOSSES
from .binary import BinaryHead, OneVsAllLoss
from .head import MarginHead
from .layers import (
    HEADS,
    AdaCos,
    AdaFace,
    AMSoftmax,
    ArcFace,
    CombinedMargin,
    CosFace,
    CurricularFace,
    ElasticFace,
    MagFace,
    NormFace,
    SphereFace,
    SphereFace2,
    SphereFace2A,
    SphereFace2M,
    SubCenterArcFace,
    UniFace,
    UniFaceA,
)
from .losses import CurricularFaceLoss

__all__ = [
    "AMSoftmax",
    "AdaCos",
    "AdaFace",
    "ArcFace",
    "BinaryHead",
    "CombinedMargin",
    "CosFace",
    "CurricularFace",
    "CurricularFaceLoss",
    "ElasticFace",
    "MagFace",
    "MarginHead",
    "NormFace",
    "OneVsAllLoss",
    "SphereFace",
    "SphereFace2",
    "SphereFace2A",
    "SphereFace2M",
    "SubCenterArcFace",
    "UniFace",
    "UniFaceA",
    "create_head",
    "get_head_class",
]


def get_head_class(name: str) -> type[MarginHead]:
    """The Keras head class of the registered loss ``name`` (aliases accepted, as
    ``marginface.get_loss_class``); ``ValueError`` listing the valid names if none."""
    loss_name = LOSSES.canonical(name)  # the ValueError for an unknown name
    if loss_name not in HEADS:
        raise ValueError(
            f"loss {name!r} has no Keras head; Keras heads exist for: {', '.join(HEADS.names())}"
        )
    return HEADS.get(loss_name)


def create_head(name: str, /, num_classes: int, **options: Any) -> MarginHead:
    """Build the Keras head of a registered loss: ``create_head("arcface", num_classes=10,
    margin=0.5)``. ``options`` are the PyTorch loss's margin options (same names and defaults)
    plus Keras's ``name``, ``dtype``, ``trainable`` and ``centers_initializer``,
    ``centers_regularizer``; an unknown one raises ``TypeError`` naming the valid ones."""
    return get_head_class(name)(num_classes, **options)
