"""The one-vs-all Keras heads in a compiled model: ``model.compile(..., head.loss())`` trains
the centers and the bias; the loss object round-trips through its config."""

from __future__ import annotations

import keras
import numpy as np
import pytest

import marginface.keras as mfk
from marginface.keras.binary import OneVsAllLoss


@pytest.mark.parametrize("name", ["sphereface2", "uniface"])
def test_fit_with_the_heads_own_loss_moves_the_bias_and_lowers_the_loss(name):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 4)).astype("float32")
    y = rng.integers(0, 5, size=64).astype("int32")
    embeddings = keras.Input((4,))
    labels = keras.Input((), dtype="int32")
    head = mfk.create_head(name, num_classes=5, scale=16.0)
    model = keras.Model([embeddings, labels], head([embeddings, labels]))
    model.compile(keras.optimizers.SGD(0.5), head.loss())
    before = float(keras.ops.convert_to_numpy(head.bias))
    history = model.fit([x, y], y, epochs=8, batch_size=64, verbose=0)
    losses = history.history["loss"]
    assert all(np.isfinite(losses)) and losses[-1] < losses[0]
    assert float(keras.ops.convert_to_numpy(head.bias)) != before


def test_loss_config_round_trip():
    loss = mfk.SphereFace2(3).loss()
    assert isinstance(loss, OneVsAllLoss)
    assert loss.positive_weight == pytest.approx(50.0 * 0.7 / 40.0)
    again = OneVsAllLoss.from_config(loss.get_config())
    assert (again.positive_weight, again.negative_weight) == (
        loss.positive_weight,
        loss.negative_weight,
    )


def test_softplus_value_and_slope_at_zero():
    """``softplus(z) = log(1 + e^z)`` with slope ``sigmoid(z)``, ``1/2`` at ``z = 0`` exactly
    (``relu`` and ``abs`` give slope 0 there), on the torch and JAX backends."""
    from marginface.keras.binary import softplus

    z = np.array([-800.0, -3.0, 0.0, 3.0, 800.0], dtype="float32")
    expected = np.logaddexp(0.0, z.astype("float64"))
    if keras.backend.backend() == "torch":
        import torch

        tensor = torch.tensor(z, requires_grad=True)
        values = softplus(tensor)
        values.sum().backward()
        slope = tensor.grad.numpy()
        values = values.detach().numpy()
    elif keras.backend.backend() == "jax":
        import jax

        values = np.asarray(softplus(z))
        slope = np.asarray(jax.grad(lambda v: softplus(v).sum())(z))
    else:
        pytest.skip(f"no gradient helper for the {keras.backend.backend()} backend")
    assert np.allclose(values, expected, rtol=1e-6, atol=0)
    assert np.allclose(slope, 1 / (1 + np.exp(-z.astype("float64"))), rtol=0, atol=1e-7)
    assert slope[2] == 0.5
