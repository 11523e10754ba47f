"""The one-vs-all (binary) heads in Keras: SphereFace2 and UniFace, twins of the PyTorch
:mod:`marginface.margins.binary` margins.

A binary head returns the binary logits ``z`` (``(N, C)``: ``s·f(cos θ_y) + β·b`` at the label,
``s·g(cos θ_j) + β·b`` elsewhere) and owns the learned bias ``b`` (a trainable scalar variable,
initialized as the PyTorch margin). Its loss is not softmax cross-entropy but
:meth:`BinaryHead.binary_loss` (``w_+·softplus(-z_y) + w_-·Σ_{j≠y} softplus(z_j)`` per sample),
also available as a ``keras.losses.Loss`` for ``model.compile`` (:meth:`BinaryHead.loss`).
"""

from __future__ import annotations

import math
from typing import Any

import keras
from keras import ops

from ._angles import clamp, cos_add
from .head import MarginHead

__all__ = [
    "BinaryHead",
    "OneVsAllLoss",
    "binary_logits_loss",
    "similarity_adjustment",
    "softplus",
    "sphereface2_target",
]


def softplus(z: Any) -> Any:
    """``log(1 + e^z)`` as ``max(z, 0) + log1p(e^{-|z|})`` (exact and finite everywhere;
    ``ops.maximum`` and ``ops.logaddexp`` return float32 for float64 inputs on the torch
    backend). Derivative ``sigmoid(z)``, ``1/2`` at ``z = 0`` too: both pieces are selections
    taking the ``z <= 0`` side's slopes there (``relu`` and ``abs`` would give 0)."""
    positive = ops.greater(z, 0)
    upper = ops.where(positive, z, ops.zeros_like(z))  # max(z, 0)
    lower = ops.where(positive, ops.negative(z), z)  # -|z| <= 0
    return upper + ops.log1p(ops.exp(lower))


def binary_logits_loss(
    labels: Any, logits: Any, positive_weight: float, negative_weight: float
) -> Any:
    """Per-sample one-vs-all loss ``(N,)`` of binary ``logits`` ``(N, C)`` and int ``labels``
    ``(N,)`` (the PyTorch ``marginface.executors.margin_loss.binary_cross_entropy``)."""
    labels = ops.reshape(ops.cast(labels, "int32"), (-1,))
    is_target = ops.one_hot(labels, logits.shape[1], dtype="bool")  # (N, C)
    positive = ops.sum(ops.where(is_target, softplus(-logits), 0.0), axis=1)  # (N,)
    negative = ops.sum(ops.where(is_target, 0.0, softplus(logits)), axis=1)  # (N,)
    return positive_weight * positive + negative_weight * negative


@keras.saving.register_keras_serializable(package="marginface")
class OneVsAllLoss(keras.losses.Loss):
    """The binary heads' loss for ``model.compile``: ``y_true`` class indices ``(N,)`` or
    ``(N, 1)``, ``y_pred`` a binary head's logits ``(N, C)``.

    Args:
        positive_weight, negative_weight: ``w_+``, ``w_-`` (a head's :meth:`BinaryHead.loss`
            fills them in).
        reduction, name, dtype: as for any Keras loss.
    """

    def __init__(
        self, positive_weight: float = 1.0, negative_weight: float = 1.0, **kwargs: Any
    ) -> None:
        kwargs.setdefault("name", "one_vs_all")
        super().__init__(**kwargs)
        self.positive_weight = float(positive_weight)
        self.negative_weight = float(negative_weight)

    def call(self, y_true: Any, y_pred: Any) -> Any:
        return binary_logits_loss(y_true, y_pred, self.positive_weight, self.negative_weight)

    def get_config(self) -> dict[str, Any]:
        return {
            **super().get_config(),
            "positive_weight": self.positive_weight,
            "negative_weight": self.negative_weight,
        }


class BinaryHead(MarginHead):
    """Base of the one-vs-all heads: the binary logits, the bias variable, the loss.

    Attributes:
        bias: trainable scalar variable, the learned ``b`` (logit units), initialized as the
            PyTorch margin's.
    """

    objective = "binary"
    bias_sign = 1.0

    def __init__(self, num_classes: int, **kwargs: Any) -> None:
        super().__init__(num_classes, **kwargs)
        initial = float(self._torch_loss(num_classes, self.options).margin.bias)
        self.bias = self.add_weight(
            shape=(),
            initializer=keras.initializers.Constant(initial),
            trainable=True,
            name="bias",
        )

    def loss(self, **kwargs: Any) -> OneVsAllLoss:
        """This head's :class:`OneVsAllLoss` (its weights ``w_±``), for ``model.compile``."""
        return OneVsAllLoss(self.positive_weight, self.negative_weight, **kwargs)

    def binary_loss(self, labels: Any, logits: Any) -> Any:
        """Per-sample loss ``(N,)`` of this head's logits."""
        return binary_logits_loss(labels, logits, self.positive_weight, self.negative_weight)

    def target_similarity(self, cos_target: Any) -> Any:
        raise NotImplementedError

    def nontarget_similarity(self, cosine: Any) -> Any:
        raise NotImplementedError

    def target_cosine(self, cos_target: Any, norms: Any, context: dict) -> Any:
        return self.target_similarity(cos_target)

    def _logit(self, similarity: Any, cosine: Any) -> Any:
        if self.gradient == "straight_through":
            similarity = cosine + ops.stop_gradient(similarity - cosine)
        z = self.scale * similarity + self.bias_sign * ops.cast(self.bias, cosine.dtype)
        if self.logit_clamp is not None:
            z = ops.clip(z, -self.logit_clamp, self.logit_clamp)
        return z

    def margin_logits(self, cosine: Any, labels: Any, norms: Any, *, training: bool) -> Any:
        is_target = ops.one_hot(labels, self.num_classes, dtype="bool")  # (N, C)
        threshold = self.interclass_filtering_threshold
        if threshold > 0:  # inter-class filtering: value 0, no gradient (as in PyTorch)
            dirty = ops.logical_and(cosine > threshold, ops.logical_not(is_target))
            cosine = ops.where(dirty, ops.zeros_like(cosine), cosine)
        raw_target = ops.sum(ops.where(is_target, cosine, 0.0), axis=1)  # (N,)
        cos_target = clamp(raw_target, -1.0, 1.0)  # (N,)
        target = self._logit(self.target_similarity(cos_target), cos_target)  # (N,)
        others = self._logit(self.nontarget_similarity(cosine), cosine)  # (N, C)
        return ops.where(is_target, target[:, None], others)


def similarity_adjustment(cosine: Any, power: float) -> Any:
    """SphereFace2's ``g(c) = 2((c + 1)/2)^t - 1`` (``(c + 1)/2`` floored at 0)."""
    return 2.0 * ops.power(ops.relu((cosine + 1.0) * 0.5), power) - 1.0


def sphereface2_target(cosine: Any, variant: str, margin: float, power: float) -> Any:
    """SphereFace2's ``f(cos θ_y)``: ``g(c) - m`` (C), ``g(cos(min(θ + m, π)))`` (A),
    ``g(cos(min(m·θ, π)))`` (M)."""
    if variant == "C":
        return similarity_adjustment(cosine, power) - margin
    if variant == "A":
        beyond = cosine <= math.cos(math.pi - margin)
        shifted = ops.where(beyond, -1.0, cos_add(cosine, margin))
    else:
        angle = ops.arccos(clamp(cosine, -1.0, 1.0)) * margin
        shifted = ops.where(angle >= math.pi, -1.0, ops.cos(angle))
    return similarity_adjustment(shifted, power)
