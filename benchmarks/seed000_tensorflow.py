"""Seed 000's own TensorFlow code (its CurricularFaceLoss, CosSimLayer, model and @tf.function
training loop, copied from the seed with only the data loading and the printing changed), timed per
epoch: the reference that ``benchmarks/keras_mnist_seed.py`` is compared with.

Needs TensorFlow (``pip install tensorflow-cpu``; ``make test-keras-tensorflow`` puts it in
``.venv/tensorflow-site``, then ``PYTHONPATH=.venv/tensorflow-site``). MNIST is read from
``../shared/data/mnist`` with marginface's reader instead of ``tf.keras.datasets`` (no network).

    PYTHONPATH=src:.venv/tensorflow-site python benchmarks/seed000_tensorflow.py --epochs 2
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time
from pathlib import Path

import numpy as np
import tensorflow as tf
from tensorflow.keras import layers
from tensorflow.keras.regularizers import l2

from marginface.data.mnist import load_mnist

REPO = Path(__file__).resolve().parents[1]


class CurricularFaceLoss(tf.keras.losses.Loss):  # seed 000, verbatim
    def __init__(self, scale=30, margin=0.5, alpha=0.99, name="CurricularFaceLoss", **kwargs):
        super().__init__(name=name, **kwargs)
        self.scale = scale
        self.margin = margin
        self.alpha = alpha
        self.t = tf.Variable(0.0)
        self.eps = 1e-7

    def positive_forward(self, y_logit):
        theta_margin = tf.math.acos(y_logit) + self.margin
        return tf.math.cos(theta_margin)

    def negative_forward(self, y_logit_pos_masked, y_logit):
        hard_sample_mask = y_logit_pos_masked < y_logit
        return tf.where(hard_sample_mask, tf.square(y_logit) + self.t * y_logit, y_logit)

    def forward(self, y_true, y_logit):
        y_logit = tf.clip_by_value(y_logit, -1.0 + self.eps, 1.0 - self.eps)
        y_logit_masked = tf.expand_dims(tf.reduce_sum(y_true * y_logit, axis=1), axis=1)
        y_logit_pos_masked = self.positive_forward(y_logit_masked)
        y_logit_neg = self.negative_forward(y_logit_pos_masked, y_logit)
        r = tf.reduce_mean(y_logit_pos_masked)
        self.t.assign(self.alpha * r + (1 - self.alpha) * self.t)
        y_true = tf.cast(y_true, dtype=tf.bool)
        return tf.where(y_true, y_logit_pos_masked, y_logit_neg)

    def __call__(self, y_true, y_logit):
        y_logit_fixed = self.forward(y_true, y_logit)
        loss = tf.nn.softmax_cross_entropy_with_logits(y_true, y_logit_fixed * self.scale)
        return tf.reduce_mean(loss)


class CosSimLayer(tf.keras.layers.Layer):  # seed 000, verbatim
    def __init__(self, num_classes, regularizer=None, name="NormLayer", **kwargs):
        super().__init__(name=name, **kwargs)
        self._n_classes = num_classes
        self._regularizer = regularizer

    def build(self, embedding_shape):
        self._w = self.add_weight(
            shape=(embedding_shape[-1], self._n_classes),
            initializer="glorot_uniform",
            trainable=True,
            regularizer=self._regularizer,
            name="cosine_weights",
        )

    def call(self, embedding, training=None):
        x = tf.nn.l2_normalize(embedding, axis=1, name="normalize_prelogits")
        w = tf.nn.l2_normalize(self._w, axis=0, name="normalize_weights")
        return tf.matmul(x, w, name="cosine_similarity"), x


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--data-dir", type=Path, default=REPO / ".." / "shared" / "data")
    args = parser.parse_args()
    bundle = load_mnist(data_dir=args.data_dir, download=False)
    train_x, test_x = bundle.train.images[:, 0], bundle.test.images[:, 0]
    train_y = tf.keras.utils.to_categorical(bundle.train.labels, 10).astype("float32")
    test_y = tf.keras.utils.to_categorical(bundle.test.labels, 10).astype("float32")
    print(f"tensorflow {tf.__version__}, load average {os.getloadavg()[0]:.2f}", flush=True)

    model_input = layers.Input(shape=(28, 28))
    x = layers.Reshape((28, 28, 1))(model_input)
    x = layers.ZeroPadding2D(padding=2)(x)
    for filters in (32, 64, 128):
        x = layers.Conv2D(
            filters, (3, 3), padding="same", activation="relu", kernel_regularizer=l2(1e-5)
        )(x)
        x = layers.MaxPool2D()(x)
    x = layers.Flatten()(x)
    x = layers.Dropout(0.5)(x)
    x = layers.Dense(3)(x)
    cosine_sim, embedding = CosSimLayer(10)(x)
    model = tf.keras.models.Model(model_input, [cosine_sim, embedding])
    optimizer = tf.optimizers.Adam()
    curricular_face_loss = CurricularFaceLoss()

    @tf.function
    def train_step(batch_x, batch_y):
        with tf.GradientTape() as tape:
            cosine_sim, _ = model(batch_x, training=True)
            loss = curricular_face_loss(batch_y, cosine_sim)
            grad = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grad, model.trainable_variables, strict=True))
            return loss

    batch_size = 1024
    n_batchs = math.ceil(len(train_x) / batch_size)
    seconds = []
    for i in range(args.epochs):
        start = time.perf_counter()
        avg_loss = 0
        for j in range(n_batchs):
            batch_x = train_x[batch_size * j : batch_size * (j + 1)]
            batch_y = train_y[batch_size * j : batch_size * (j + 1)]
            loss = train_step(batch_x, batch_y)
            avg_loss += loss * len(batch_x)
        avg_loss /= len(train_x)
        seconds.append(time.perf_counter() - start)
        cosine_sim, _ = model.predict(test_x, verbose=0)
        acc = float(np.mean(np.argmax(cosine_sim, axis=1) == np.argmax(test_y, axis=1)))
        print(
            f"epoch {i + 1:3d}: train {seconds[-1]:6.1f} s  loss {float(avg_loss):.4f}  "
            f"t {float(curricular_face_loss.t.numpy()):.4f}  accuracy {acc:.4f}",
            flush=True,
        )
    steady = seconds[1:] or seconds
    print(
        f"summary seed 000 tensorflow: epoch 1 {seconds[0]:.1f} s, median of epochs "
        f"2-{len(seconds)} {statistics.median(steady):.1f} s/epoch; load average "
        f"{os.getloadavg()[0]:.2f}",
        flush=True,
    )


if __name__ == "__main__":
    main()
