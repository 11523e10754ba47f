"""CurricularFace as a Keras ``Loss`` on cosines and labels, for users who keep
their own normalized Dense layer; the class centers then live in that layer, where Keras trains
them (weights created inside a ``Loss`` are not trained)."""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
from keras import ops

from ..losses import margin_defaults
from ..margins import CurricularFaceMargin
from ._angles import clamp, cos_add
from .functional import additive_angular_margin, batch_mean, curricular_negative
from .head import is_concrete

__all__ = ["CurricularFaceLoss"]

_DEFAULTS = margin_defaults(CurricularFaceMargin)


@keras.saving.register_keras_serializable(package="marginface")
class CurricularFaceLoss(keras.losses.Loss):
    r"""CurricularFace (Huang et al., 2020) cross-entropy on precomputed cosines ``(N, C)``, with
    the math, names and defaults of the PyTorch :class:`~marginface.margins.CurricularFaceMargin`:

    .. math::
        L_i = -\log\frac{e^{s\cos(\theta_{y_i} + m)}}{e^{s\cos(\theta_{y_i} + m)}
              + \sum_{j\ne y_i} e^{s\,N(t, \cos\theta_{ij})}},\qquad
        t \leftarrow \alpha\,t + (1 - \alpha)\,\overline{\cos\theta_y}

    ``t`` is a non-trainable ``keras.Variable`` (initially 0), updated before use at each call
    while :attr:`training` is True (set it to False to evaluate without moving ``t``). The update
    is the paper's and the authors' code's (the mean of ``cos θ_y``, weight ``1 - α`` on the
    batch), the cosines are not clipped, and the default scale is the paper's 64.

    ``t`` moves under ``model.fit`` on the torch and TensorFlow backends; on JAX a ``Loss`` has no
    state that Keras's training step carries from step to step (``model.fit`` runs, ``t`` stays
    0), so with JAX use the :class:`~marginface.keras.CurricularFace` layer, whose ``t`` is layer
    state.

    Args:
        margin: ``m`` in radians, ``0 <= m < π``. Default: 0.5 (paper).
        scale: ``s > 0``. Default: 64.0 (paper).
        momentum: ``α`` in ``[0, 1]``. Default: 0.99 (paper).
        policy: the positive's behaviour where ``θ_y + m > π``. Default: ``"linear"``.
        gradient: ``"exact"`` (default) or ``"straight_through"``.
        reduction, name, dtype: as for any Keras loss.

    ``y_true``: class indices ``(N,)`` or ``(N, 1)`` of an integer dtype, or one-hot ``(N, C)``
    (``keras.utils.to_categorical`` labels). ``y_pred``: the cosines ``(N, C)``.
    """

    def __init__(
        self,
        margin: float = _DEFAULTS["margin"],
        scale: float = _DEFAULTS["scale"],
        *,
        momentum: float = _DEFAULTS["momentum"],
        policy: str = _DEFAULTS["policy"],
        gradient: str = _DEFAULTS["gradient"],
        reduction: str = "sum_over_batch_size",
        name: str = "curricular_face_loss",
        dtype: Any = None,
    ) -> None:
        super().__init__(name=name, reduction=reduction, dtype=dtype)
        checked = CurricularFaceMargin(
            margin, scale, momentum=momentum, policy=policy, gradient=gradient
        )
        self.margin = checked.margin
        self.scale = checked.scale
        self.momentum = checked.momentum
        self.policy = checked.policy
        self.gradient = checked.gradient
        self.training = True
        self.t = keras.Variable(0.0, trainable=False, name="t", dtype=self.dtype)

    def __call__(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> Any:
        """The reduced loss (per-sample ``(N,)`` for ``reduction=None``). The reduction is done
        here in the loss dtype (Keras's own reduction divides in float32 on the torch backend,
        keras-team/keras#23704)."""
        labels = self._sparse_labels(y_true, y_pred)
        cosine = ops.cast(y_pred, self.dtype)
        losses = self.call(labels, cosine)  # (N,)
        weights = None
        if sample_weight is not None:
            weights = ops.reshape(ops.cast(sample_weight, losses.dtype), (-1,))
            losses = losses * weights
        if self.reduction in (None, "none"):
            return losses
        if self.reduction == "sum":
            return ops.sum(losses)
        if self.reduction == "mean_with_sample_weight" and weights is not None:
            return ops.sum(losses) / ops.sum(weights)
        return batch_mean(losses)  # "sum_over_batch_size", "mean"

    def call(self, y_true: Any, y_pred: Any) -> Any:
        """Per-sample losses ``(N,)`` from class indices ``(N,)`` and cosines ``(N, C)``."""
        labels = ops.cast(y_true, "int32")
        cosine = y_pred  # (N, C)
        is_target = ops.one_hot(labels, ops.shape(cosine)[1], dtype="bool")  # (N, C)
        cos_target = clamp(ops.sum(ops.where(is_target, cosine, 0.0), axis=1), -1.0, 1.0)
        t = ops.cast(self.t, cosine.dtype)
        if self.training:
            mean_target = batch_mean(ops.stop_gradient(cos_target))
            t = self.momentum * t + (1.0 - self.momentum) * mean_target
            self.t.assign(ops.cast(t, self.t.dtype))
            t = ops.cast(ops.cast(t, self.t.dtype), cosine.dtype)
        threshold = ops.stop_gradient(cos_add(cos_target, self.margin))[:, None]  # (N, 1)
        target = additive_angular_margin(cos_target, self.margin, self.policy)  # (N,)
        if self.gradient == "straight_through":
            target = cos_target + ops.stop_gradient(target - cos_target)
        others = curricular_negative(cosine, threshold, ops.stop_gradient(t))  # (N, C)
        logits = ops.where(is_target, target[:, None], others) * self.scale
        return ops.sparse_categorical_crossentropy(labels, logits, from_logits=True)

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config.update(
            dtype=self.dtype,  # keras.losses.Loss's own config leaves it out
            margin=self.margin,
            scale=self.scale,
            momentum=self.momentum,
            policy=self.policy,
            gradient=self.gradient,
        )
        return config

    def _sparse_labels(self, y_true: Any, y_pred: Any) -> Any:
        """``y_true`` as class indices ``(N,)``, checked against the cosines ``y_pred``."""
        if not hasattr(y_true, "dtype"):
            y_true = ops.convert_to_tensor(y_true)
        if not hasattr(y_pred, "dtype"):
            y_pred = ops.convert_to_tensor(y_pred)
        if len(y_pred.shape) != 2:
            raise ValueError(f"y_pred must be cosines of shape (N, C), got {tuple(y_pred.shape)}")
        n, classes = y_pred.shape
        shape = tuple(y_true.shape)
        dtype = keras.backend.standardize_dtype(y_true.dtype)
        one_hot = len(shape) == 2 and classes is not None and shape[1] == classes and classes > 1
        if not one_hot and "int" not in dtype:
            raise TypeError(
                f"y_true must be integer class indices of shape (N,) or (N, 1), or one-hot "
                f"(N, {classes}); got {dtype} of shape {shape}"
            )
        if not one_hot and not (len(shape) == 1 or (len(shape) == 2 and shape[1] == 1)):
            raise ValueError(
                f"y_true must have shape (N,), (N, 1) or (N, {classes}) (one-hot), got {shape}"
            )
        if shape[0] is not None and n is not None and shape[0] != n:
            raise ValueError(f"y_true has {shape[0]} rows but y_pred has {n}")
        concrete = is_concrete(y_true)
        if one_hot:
            if concrete:
                values = ops.convert_to_numpy(y_true)
                if not (np.isin(values, (0, 1)).all() and (values.sum(axis=1) == 1).all()):
                    raise ValueError("one-hot y_true must have exactly one 1 per row, zeros else")
            return ops.argmax(y_true, axis=1)
        labels = ops.reshape(y_true, (-1,))
        if concrete and classes is not None:
            values = ops.convert_to_numpy(labels)
            if values.size and (values.min() < 0 or values.max() >= classes):
                bad = values.min() if values.min() < 0 else values.max()
                raise ValueError(
                    f"y_true must lie in [0, {classes - 1}] for {classes} classes, got {int(bad)}"
                )
        return labels
