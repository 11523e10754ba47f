"""Parity of every Keras head with its PyTorch loss on identical weights and inputs, in float64:
logits, loss, gradients with respect to the embeddings and the centers, and the margin's state
after two training steps; then the eval-mode logits and ``s·cos θ``.

The PyTorch side is the registered loss itself (``forward`` for the loss and gradients,
``logits`` for the logits, each on a copy of the same state); the Keras side is the head called
as a user calls it, with ``SparseCategoricalCrossentropy(from_logits=True) + sum(head.losses)``.
"""

from __future__ import annotations

import copy
import math
import zlib

import keras
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from keras import ops

import marginface
import marginface.keras as mfk
from marginface.keras.layers import HEADS

from ._autodiff import step

N, C, D = 12, 6, 5

CASES: list[tuple[str, dict]] = [
    ("normface", {}),
    ("sphereface", {}),
    ("sphereface", {"scale": 30.0, "margin": 3, "lambda_base": 5.0, "lambda_min": 0.5}),
    ("cosface", {}),
    ("cosface", {"conditional": True, "margin": 0.3}),
    ("amsoftmax", {}),
    ("arcface", {}),
    ("arcface", {"policy": "easy"}),
    ("arcface", {"policy": "clip", "margin": 0.7}),
    ("arcface", {"policy": "none", "gradient": "straight_through"}),
    ("arcface", {"sub_centers": 2}),
    ("combined", {"m1": 1.0, "m2": 0.3, "m3": 0.2}),
    ("combined", {"m1": 1.35, "m2": 0.25, "m3": 0.1}),
    ("combined", {"m1": 1.35, "m2": 0.25, "policy": "clip"}),
    ("curricularface", {}),
    ("curricularface", {"scale": 30.0, "momentum": 0.5, "gradient": "straight_through"}),
    ("adacos", {}),
    ("adacos", {"dynamic": False}),
    ("subcenter-arcface", {}),
    ("magface", {}),
    ("magface", {"gradient": "straight_through", "policy": "easy"}),
    ("adaface", {}),
    ("adaface", {"momentum": 0.5, "h": 0.5}),
    ("elasticface", {"seed": 0}),
    ("elasticface", {"kind": "cos", "plus": True}),
    ("elasticface", {"plus": True, "std": 0.4}),
    ("arcface", {"interclass_filtering_threshold": 0.2}),
    ("curricularface", {"interclass_filtering_threshold": 0.3}),
    ("adacos", {"interclass_filtering_threshold": 0.2}),
    ("magface", {"interclass_filtering_threshold": 0.25}),
    ("adaface", {"cosine_clamp": 0.3}),
    ("mv-am-softmax", {}),
    ("mv-am-softmax", {"mode": "fixed", "conditional": False, "margin": 0.2}),
    ("mv-am-softmax", {"conditional": "easy", "margin": 0.3}),
    ("mv-arc-softmax", {}),
    ("mv-arc-softmax", {"mode": "fixed", "t": 1.3, "policy": "linear", "margin": 0.5}),
    ("li-arcface", {}),
    ("li-arcface", {"margin": 0.3, "scale": 30.0, "gradient": "straight_through"}),
    ("circle", {}),
    ("circle", {"margin": 0.4, "scale": 64.0}),
    ("arcnegface", {}),
    ("arcnegface", {"alpha": 1.5, "sigma": 0.5, "policy": "easy", "margin": 0.3}),
    ("sphereface2", {}),
    ("sphereface2", {"power": 1.5, "balance": 0.6, "interclass_filtering_threshold": 0.3}),
    ("sphereface2-a", {}),
    ("sphereface2-a", {"gradient": "straight_through", "margin": 0.8}),
    ("sphereface2-m", {}),
    ("uniface", {}),
    ("uniface", {"margin": 0.0, "negative_weight": 0.5, "clamp_logits": True}),
    ("uniface-a", {}),
    ("uniface-a", {"policy": "easy", "gradient": "straight_through", "margin": 0.3}),
    ("adam-softmax", {}),
    ("npcface", {}),
    ("sphereface-r", {}),
    ("sphereface-r", {"kind": "v1", "margin": 1.7, "feature_norm": "soft", "gradient": "exact"}),
    ("sphereface-r", {"kind": "v2", "feature_norm": "none"}),
    ("sphereface-plus", {}),
    ("sphereface-plus", {"margin": 1.3, "gradient": "exact"}),
    ("npcface", {"margin": 0.3, "m0": 0.3, "m1": 0.4, "t": 1.3, "a": 0.1, "policy": "linear"}),
    ("adam-softmax", {"scale": 16.0, "lambda_m": 5.0, "margin_init_low": 0.1}),
]

# float64 is kept end to end on the torch backend; Keras >= 3.12 computes cos/sin/arccos of a
# float64 tensor in float32 on JAX (keras-team/keras#23704), which then bounds the agreement.
FLOAT64_OPS = (
    keras.backend.standardize_dtype(
        ops.cos(ops.convert_to_tensor(np.zeros(1), dtype="float64")).dtype
    )
    == "float64"
)
TOLERANCE = 1e-8 if FLOAT64_OPS else 2e-4


def _close(actual, expected, what: str) -> None:
    actual, expected = np.asarray(actual, dtype=np.float64), np.asarray(expected, np.float64)
    scale = 1.0 if FLOAT64_OPS else max(1.0, float(np.abs(expected).max()))
    np.testing.assert_allclose(actual, expected, rtol=0, atol=TOLERANCE * scale, err_msg=what)


def _batch(rng: np.random.Generator, weight: np.ndarray, sub_centers: int):
    """Embeddings with norms in [2, 120] (MagFace, AdaFace, SphereFace see a range of norms),
    a third of them pointing away from their class center (θ_y + m > π: the policies' branch)."""
    labels = rng.integers(0, C, size=N)
    x = rng.normal(size=(N, D))
    centers = weight.reshape(C, sub_centers, D)[:, 0]  # first sub-center of each class
    away = np.arange(N) % 3 == 0
    x[away] = -centers[labels[away]] / np.linalg.norm(centers[labels[away]], axis=1, keepdims=True)
    x[away] += 0.05 * rng.normal(size=(int(away.sum()), D))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    x *= rng.uniform(2.0, 120.0, size=(N, 1))
    return x, labels


def _torch_state(loss) -> dict[str, float]:
    return {name: float(value) for name, value in loss.margin.named_buffers()}


def _keras_state(head) -> dict[str, float]:
    return {name: float(ops.convert_to_numpy(getattr(head, name))) for name in head.state_names}


def _draws(monkeypatch, head, loss, values: np.ndarray) -> None:
    """ElasticFace: both sides draw ``values`` (the margin math is compared, not two RNGs)."""
    monkeypatch.setattr(torch, "normal", lambda *a, **k: torch.tensor(values))
    monkeypatch.setattr(
        head, "sample_margins", lambda rows, dtype: ops.convert_to_tensor(values, dtype=dtype)
    )


def _torch_step(loss, x: np.ndarray, y: np.ndarray):
    """Loss and gradients from ``forward``, logits from ``logits`` on a copy of the same state;
    returns ``(logits, loss, grad_x, grad_w)`` and leaves ``loss`` in its post-step state."""
    twin = copy.deepcopy(loss)
    xt = torch.tensor(x, requires_grad=True)
    value = loss(xt, torch.tensor(y))
    gx, gw = torch.autograd.grad(value, [xt, loss.weight])
    with torch.no_grad():
        logits = twin.logits(torch.tensor(x), torch.tensor(y))
    return logits.numpy(), float(value.detach()), gx.numpy(), gw.numpy()


def test_every_registered_loss_has_a_case_and_a_head():
    assert {name for name, _ in CASES} == set(marginface.list_losses())
    missing = sorted(set(marginface.list_losses()) - set(HEADS.names()))
    assert not missing, f"registered losses without a Keras head: {missing}"


@pytest.mark.parametrize(("name", "options"), CASES, ids=[f"{n}-{o}" for n, o in CASES])
def test_parity_with_pytorch(name, options, monkeypatch):
    rng = np.random.default_rng(zlib.crc32(f"{name}{options}".encode()))
    loss = marginface.create_loss(name, C, D, dtype=torch.float64, **options).double()
    head = mfk.create_head(name, num_classes=C, dtype="float64", **options)
    head.build((None, D))
    weight = loss.weight.detach().numpy()
    head.centers.assign(weight)
    assert tuple(head.centers.shape) == tuple(loss.weight.shape)
    for key, value in loss.class_parameters.items():  # AdaM-Softmax's margins
        getattr(head, f"class_{key}").assign(value.detach().numpy())
    assert _keras_state(head) == pytest.approx(_torch_state(loss))

    for number in (1, 2):  # two training steps: the state moves on both sides
        x, y = _batch(rng, weight, loss.sub_centers)
        if name == "elasticface":
            _draws(monkeypatch, head, loss, rng.normal(loss.margin.margin, 0.2, size=N))
        loss.train()
        t_logits, t_loss, t_gx, t_gw = _torch_step(loss, x, y)
        k = step(head, x, y, training=True)
        _close(k.logits, t_logits, f"logits, training step {number}")
        _close(k.loss, t_loss, f"loss, training step {number}")
        _close(k.grad_embeddings, t_gx, f"d loss / d embeddings, training step {number}")
        _close(k.grad_centers, t_gw, f"d loss / d centers, training step {number}")
        torch_state, keras_state = _torch_state(loss), _keras_state(head)
        assert keras_state.keys() == torch_state.keys()
        for key, value in torch_state.items():
            _close(keras_state[key], value, f"state {key!r} after training step {number}")

    before = _keras_state(head)
    x, y = _batch(rng, weight, loss.sub_centers)
    loss.eval()
    t_logits, t_loss, t_gx, t_gw = _torch_step(loss, x, y)
    k = step(head, x, y, training=False)
    _close(k.logits, t_logits, "logits, eval")
    _close(k.loss, t_loss, "loss, eval")
    _close(k.grad_embeddings, t_gx, "d loss / d embeddings, eval")
    assert _keras_state(head) == before  # training=False leaves the state alone
    with torch.no_grad():
        inference = loss.logits(torch.tensor(x)).numpy()
    _close(ops.convert_to_numpy(head(ops.convert_to_tensor(x))), inference, "s·cos θ")


def test_float64_is_kept_on_this_backend():
    if not FLOAT64_OPS:
        pytest.skip(f"Keras {keras.__version__} computes cos in float32 on this backend")
    head = mfk.ArcFace(4, dtype="float64")
    x = ops.convert_to_tensor(np.ones((2, 3)), dtype="float64")
    y = ops.convert_to_tensor(np.array([0, 1]), dtype="int32")
    assert keras.backend.standardize_dtype(head([x, y], training=True).dtype) == "float64"
    assert keras.backend.standardize_dtype(head(x).dtype) == "float64"


@pytest.mark.parametrize("options", [{}, {"gradient": "straight_through", "scale": 20.0}])
def test_curricular_face_loss_matches_the_pytorch_margin(options):
    """``CurricularFaceLoss`` on cosines = PyTorch CE of ``CurricularFaceMargin``'s logits, and
    ``t`` after two calls; one-hot labels (seed 000's) give the same as class indices."""
    rng = np.random.default_rng(3)
    margin = marginface.margins.CurricularFaceMargin(**options).double().train()
    keras_loss = mfk.CurricularFaceLoss(**options, dtype="float64")
    for _ in range(2):
        cosine = np.tanh(rng.normal(size=(N, C)))
        labels = rng.integers(0, C, size=N)
        ct = torch.tensor(cosine, requires_grad=True)
        expected = F.cross_entropy(margin(ct, torch.tensor(labels)), torch.tensor(labels))
        (expected_grad,) = torch.autograd.grad(expected, ct)
        value, grad = _loss_and_grad(keras_loss, labels, cosine)
        _close(value, float(expected), "CurricularFaceLoss")
        _close(grad, expected_grad.numpy(), "d CurricularFaceLoss / d cosine")
        _close(float(ops.convert_to_numpy(keras_loss.t)), float(margin.t), "t")
    keras_loss.training = False
    one_hot = np.eye(C, dtype="float32")[labels]
    frozen = float(ops.convert_to_numpy(keras_loss.t))
    by_index = keras_loss(labels.astype("int32"), cosine)
    by_one_hot = keras_loss(one_hot, cosine)
    _close(ops.convert_to_numpy(by_one_hot), ops.convert_to_numpy(by_index), "one-hot labels")
    assert float(ops.convert_to_numpy(keras_loss.t)) == frozen


def _loss_and_grad(keras_loss, labels, cosine):
    backend = keras.backend.backend()
    if backend == "torch":
        ct = torch.tensor(cosine, requires_grad=True)
        value = keras_loss(torch.tensor(labels), ct)
        (grad,) = torch.autograd.grad(value, ct)
        return float(value), grad.numpy()
    if backend == "jax":
        import jax

        def objective(c):
            value = keras_loss(labels, c)
            return value

        # the loss assigns t eagerly: differentiate a copy of the call, then call once for t
        t = float(ops.convert_to_numpy(keras_loss.t))
        grad = jax.grad(lambda c: _frozen_call(keras_loss, labels, c, t))(cosine)
        value = objective(cosine)
        return float(value), np.asarray(grad)
    import tensorflow as tf

    ct = tf.constant(cosine)
    with tf.GradientTape() as tape:
        tape.watch(ct)
        value = keras_loss(labels, ct)
    return float(value), tape.gradient(value, ct).numpy()


def _frozen_call(keras_loss, labels, cosine, t):
    """The loss at the ``t`` it will have after this call's update (JAX: no assignment inside
    ``grad``)."""
    clone = mfk.CurricularFaceLoss.from_config(keras_loss.get_config())
    clone.t.assign(t)
    return clone(labels, cosine)


@pytest.mark.parametrize("m", [0.3, 0.5, 1.2])
def test_boundary_takes_the_fallback_as_in_pytorch(m: float) -> None:
    """At θ + m = π exactly (and m1·θ + m2 = π for the combined margin) the Keras margins take
    the fallback, like the PyTorch ones (docs/parity.md); one step above it the margin applies."""
    from marginface.keras import functional as kf
    from marginface.margins.arcface import additive_angular_margin
    from marginface.margins.combined import combined_margin

    at = torch.tensor([math.cos(math.pi - m)], dtype=torch.float64)
    above = torch.nextafter(at, torch.tensor(1.0, dtype=torch.float64))
    for value in (at, above):
        x = ops.convert_to_tensor(value.numpy(), dtype="float64")
        for policy in ("linear", "clip"):
            got = np.asarray(ops.convert_to_numpy(kf.additive_angular_margin(x, m, policy)))
            want = additive_angular_margin(value, m, policy).numpy()
            assert np.array_equal(got, want), (policy, value.item(), got, want)
    half = ops.convert_to_tensor(np.array([math.cos(math.pi / 2)]), dtype="float64")
    for policy in ("linear", "clip"):
        got = ops.convert_to_numpy(kf.combined_margin(half, 2.0, 0.0, 0.0, policy))
        want = combined_margin(torch.tensor([math.cos(math.pi / 2)], dtype=torch.float64), 2.0,
                               0.0, 0.0, policy).numpy()  # fmt: skip
        assert np.array_equal(np.asarray(got), want), policy
