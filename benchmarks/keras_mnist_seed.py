"""Seed 000's MNIST experiment in Keras 3 with marginface's Keras CurricularFace.

The model is seed 000's (Reshape, ZeroPadding2D(2), three Conv2D 3×3 + ReLU + MaxPool with an L2
penalty of 1e-5 on the kernels, Flatten, Dropout 0.5, Dense(3): a 3-D embedding), trained with
Adam (lr 1e-3, Keras's default) on batches of 1024 in the seed's order (no shuffling),
CurricularFace s = 30, m = 0.5. Two ways to attach the margin:

* ``--head layer`` (default): :class:`marginface.keras.CurricularFace` owns the class centers and
  takes ``[embeddings, labels]``; test accuracy is the argmax of ``s·cos θ`` (its inference call).
* ``--head loss``: seed 000's own layout: a normalized Dense layer (``CosSimLayer``, glorot
  initialized ``(D, C)`` weight) returns the cosines, :class:`marginface.keras.CurricularFaceLoss`
  is the loss; test accuracy is the argmax of the cosines.

Usage (from the repository root; the backend is Keras's, ``KERAS_BACKEND``, default torch)::

    KERAS_BACKEND=torch python benchmarks/keras_mnist_seed.py --epochs 5
    KERAS_BACKEND=jax python benchmarks/keras_mnist_seed.py --epochs 5

Prints one line per epoch (training seconds, loss, t, test accuracy) and a summary with the median
training seconds per epoch (epoch 1, which includes tracing/compilation, is reported apart).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from pathlib import Path

os.environ.setdefault("KERAS_BACKEND", "torch")

import keras
import numpy as np
from keras import layers, ops
from keras.regularizers import l2

import marginface.keras as mfk
from marginface.data.mnist import load_mnist

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO / ".." / "shared" / "data"


def backbone(embedding_dim: int = 3) -> keras.Model:
    """Seed 000's CNN: ``(28, 28)`` images -> ``(embedding_dim,)`` embeddings."""
    images = keras.Input((28, 28), name="images")
    channels_first = keras.config.image_data_format() == "channels_first"
    x = layers.Reshape((1, 28, 28) if channels_first else (28, 28, 1))(images)
    x = layers.ZeroPadding2D(padding=2)(x)
    for filters in (32, 64, 128):
        x = layers.Conv2D(
            filters, (3, 3), padding="same", activation="relu", kernel_regularizer=l2(1e-5)
        )(x)
        x = layers.MaxPool2D()(x)
    x = layers.Flatten()(x)
    x = layers.Dropout(0.5)(x)
    return keras.Model(images, layers.Dense(embedding_dim)(x), name="backbone")


class CosSimLayer(layers.Layer):
    """Seed 000's normalized Dense layer: ``(N, D) -> (N, C)`` cosines to glorot-initialized
    centers (stored ``(D, C)`` as in the seed)."""

    def __init__(self, num_classes: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.num_classes = num_classes

    def build(self, input_shape) -> None:
        self.w = self.add_weight(
            shape=(input_shape[-1], self.num_classes), initializer="glorot_uniform", name="w"
        )

    def call(self, embeddings):
        x = embeddings / ops.sqrt(ops.sum(ops.square(embeddings), axis=1, keepdims=True) + 1e-12)
        w = self.w / ops.sqrt(ops.sum(ops.square(self.w), axis=0, keepdims=True) + 1e-12)
        return ops.matmul(x, w)


def build(head_kind: str, scale: float, margin: float):
    """``(training model, inference model, object holding t)`` for ``head_kind``."""
    net = backbone()
    images = keras.Input((28, 28), name="images")
    embeddings = net(images)
    if head_kind == "layer":
        labels = keras.Input((), dtype="int32", name="labels")
        head = mfk.CurricularFace(10, scale=scale, margin=margin, name="curricular_face")
        train = keras.Model([images, labels], head([embeddings, labels]))
        train.compile(
            optimizer=keras.optimizers.Adam(1e-3),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
        return train, keras.Model(images, head(embeddings)), head
    cosines = CosSimLayer(10, name="cos_sim")(embeddings)
    model = keras.Model(images, cosines)
    loss = mfk.CurricularFaceLoss(scale=scale, margin=margin)
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=loss)
    return model, model, loss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--head", choices=("layer", "loss"), default="layer")
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--scale", type=float, default=30.0)
    parser.add_argument("--margin", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--data-format",
        choices=("channels_last", "channels_first"),
        default="channels_last",
        help="Keras's image data format (channels_first is faster on the torch backend; "
        "TensorFlow's CPU convolutions need channels_last)",
    )
    parser.add_argument("--limit", type=int, default=None, help="train on a subset (smoke runs)")
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA)
    args = parser.parse_args()
    if not (args.data_dir / "mnist").is_dir():
        raise SystemExit(f"MNIST not found under {args.data_dir}/mnist (pass --data-dir)")
    keras.config.set_image_data_format(args.data_format)
    keras.utils.set_random_seed(args.seed)
    bundle = load_mnist(data_dir=args.data_dir, download=False, limit=args.limit)
    train_x, train_y = bundle.train.images[:, 0], bundle.train.labels.astype("int32")
    test_x, test_y = bundle.test.images[:, 0], bundle.test.labels.astype("int32")
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"keras {keras.__version__} ({keras.backend.backend()}), head {args.head}, "
        f"{args.data_format}, "
        f"load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    train, infer, state = build(args.head, args.scale, args.margin)
    inputs = [train_x, train_y] if args.head == "layer" else train_x
    seconds, accuracies = [], []
    for epoch in range(1, args.epochs + 1):
        start = time.perf_counter()
        history = train.fit(
            inputs, train_y, batch_size=args.batch_size, epochs=1, shuffle=False, verbose=0
        )
        seconds.append(time.perf_counter() - start)
        scores = infer.predict(test_x, batch_size=args.batch_size, verbose=0)
        accuracy = float(np.mean(np.argmax(scores, axis=1) == test_y))
        accuracies.append(accuracy)
        t = float(ops.convert_to_numpy(state.t))
        print(
            f"epoch {epoch:3d}: train {seconds[-1]:6.1f} s  loss {history.history['loss'][0]:.4f}"
            f"  t {t:.4f}  accuracy {accuracy:.4f}",
            flush=True,
        )
    steady = seconds[1:] or seconds
    print(
        f"summary keras {keras.backend.backend()} head={args.head}: epoch 1 {seconds[0]:.1f} s, "
        f"median of epochs 2-{len(seconds)} {statistics.median(steady):.1f} s/epoch; final "
        f"accuracy {accuracies[-1]:.4f}, best {max(accuracies):.4f}; load average "
        f"{os.getloadavg()[0]:.2f}",
        flush=True,
    )


if __name__ == "__main__":
    main()
