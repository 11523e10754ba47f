"""One training (or evaluation) step of a Keras head on any backend, with the gradients of
``SparseCategoricalCrossentropy(from_logits=True) + sum(head.losses)`` with respect to the
embeddings and the centers, as NumPy arrays."""

from __future__ import annotations

from dataclasses import dataclass

import keras
import numpy as np
from keras import ops

from marginface.keras.functional import batch_mean


@dataclass
class Step:
    logits: np.ndarray  # (N, C)
    loss: float
    grad_embeddings: np.ndarray  # (N, D)
    grad_centers: np.ndarray  # (C·K, D)


def _loss(head, labels, logits, extra):
    # the batch mean of keras.losses.SparseCategoricalCrossentropy(from_logits=True) (its own
    # reduction, like ops.mean, runs in float32 on the torch backend, keras-team/keras#23704)
    if getattr(head, "objective", "softmax") == "binary":  # one-vs-all: Σ softplus
        total = batch_mean(_one_vs_all(head, labels, logits))
    else:
        total = batch_mean(ops.sparse_categorical_crossentropy(labels, logits, from_logits=True))
    for term in extra:
        total = total + ops.cast(term, total.dtype)
    return total


def _one_vs_all(head, labels, logits):
    """``w_+·log(1 + e^{-z_y}) + w_-·Σ_{j≠y} log(1 + e^{z_j})`` per row, restated here."""
    is_target = ops.one_hot(ops.cast(labels, "int32"), logits.shape[1], dtype="bool")
    tail = ops.log1p(ops.exp(-ops.abs(logits)))  # (ops.logaddexp is float32 on torch)
    softplus, softplus_neg = ops.relu(logits) + tail, ops.relu(-logits) + tail
    positive = ops.sum(ops.where(is_target, softplus_neg, 0.0), axis=1)
    negative = ops.sum(ops.where(is_target, 0.0, softplus), axis=1)
    return head.positive_weight * positive + head.negative_weight * negative


def step(head, embeddings: np.ndarray, labels: np.ndarray, *, training: bool) -> Step:
    """Call ``head([embeddings, labels], training=training)`` once (state variables move as in a
    real step) and differentiate the loss."""
    backend = keras.backend.backend()
    if backend == "torch":
        import torch

        x = torch.tensor(embeddings, requires_grad=True)
        y = torch.tensor(labels)
        logits = head([x, y], training=training)
        loss = _loss(head, y, logits, head.losses)
        gx, gw = torch.autograd.grad(loss, [x, head.centers.value])
        return Step(logits.detach().numpy(), float(loss.detach()), gx.numpy(), gw.numpy())
    if backend == "jax":
        import jax

        trainable = [v.value for v in head.trainable_variables]
        fixed = [v.value for v in head.non_trainable_variables]
        index = [id(v) for v in head.trainable_variables].index(id(head.centers))

        def objective(x, trainable):
            logits, new_fixed, losses = head.stateless_call(
                trainable, fixed, [x, labels], training=training, return_losses=True
            )
            return _loss(head, labels, logits, losses), (logits, new_fixed)

        (loss, (logits, new_fixed)), (gx, gtrainable) = jax.value_and_grad(
            objective, argnums=(0, 1), has_aux=True
        )(embeddings, trainable)
        for variable, value in zip(head.non_trainable_variables, new_fixed, strict=True):
            variable.assign(value)
        return Step(np.asarray(logits), float(loss), np.asarray(gx), np.asarray(gtrainable[index]))
    if backend == "tensorflow":
        import tensorflow as tf

        x = tf.constant(embeddings)
        with tf.GradientTape() as tape:
            tape.watch(x)
            logits = head([x, tf.constant(labels)], training=training)
            loss = _loss(head, labels, logits, head.losses)
        gx, gw = tape.gradient(loss, [x, head.centers])
        return Step(logits.numpy(), float(loss), gx.numpy(), gw.numpy())
    raise NotImplementedError(f"no autodiff helper for the {backend} backend")
