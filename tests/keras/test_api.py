"""The Keras frontend's API: options shared with PyTorch, configs, saving, training, bad input."""

from __future__ import annotations

import subprocess
import sys

import keras
import numpy as np
import pytest
from keras import ops

import marginface
import marginface.keras as mfk
from marginface.keras.head import TORCH_ONLY_OPTIONS, loss_option_defaults

C, D = 5, 3


def _inputs(n: int = 8, seed: int = 0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, D)).astype("float32"), rng.integers(0, C, size=n).astype("int32")


def _model(head):
    embeddings = keras.Input((D,), name="embeddings")
    labels = keras.Input((), dtype="int32", name="labels")
    return keras.Model([embeddings, labels], head([embeddings, labels]))


def test_importing_marginface_does_not_import_keras():
    code = (
        "import sys, marginface, marginface.losses, marginface.registry\n"
        "assert 'keras' not in sys.modules, 'marginface imported keras'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


@pytest.mark.parametrize("name", marginface.list_losses())
def test_options_and_defaults_are_the_pytorch_losses(name):
    loss_class = marginface.get_loss_class(name)
    head_class = mfk.get_head_class(name)
    expected = set(marginface.registry.accepted_keywords(loss_class)) - set(TORCH_ONLY_OPTIONS)
    assert set(head_class.option_defaults()) == expected
    head = mfk.create_head(name, num_classes=C)
    torch_margin = marginface.create_loss(name, C, D).margin
    for option in ("margin", "scale", "policy", "gradient", "momentum", "kind", "m1", "m2", "m3"):
        if hasattr(torch_margin, option) and not hasattr(torch_margin.__class__, option):
            assert getattr(head, option) == getattr(torch_margin, option), option
    assert head.sub_centers == marginface.create_loss(name, C, D).sub_centers


def test_documented_defaults():
    assert mfk.AMSoftmax.option_defaults()["scale"] == 30.0
    assert mfk.SubCenterArcFace.option_defaults()["sub_centers"] == 3
    assert mfk.ElasticFace(C, kind="cos").margin == 0.35
    assert mfk.ArcFace.option_defaults() == loss_option_defaults(marginface.ArcFaceLoss)
    assert "Defaults: " in mfk.CurricularFace.__doc__
    assert mfk.get_head_class("subcenter") is mfk.SubCenterArcFace  # aliases resolve


def test_centers_layout_and_sub_center_max():
    head = mfk.SubCenterArcFace(C, sub_centers=2)
    x, _ = _inputs()
    head(ops.convert_to_tensor(x))
    assert tuple(head.centers.shape) == (C * 2, D)
    centers = ops.convert_to_numpy(head.centers)
    unit = centers / np.linalg.norm(centers, axis=1, keepdims=True)
    xn = x / np.linalg.norm(x, axis=1, keepdims=True)
    expected = (xn @ unit.T).reshape(len(x), C, 2).max(axis=2) * head.scale
    np.testing.assert_allclose(ops.convert_to_numpy(head(x)), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", marginface.list_losses())
def test_config_round_trip(name):
    head = mfk.create_head(name, num_classes=C, name=f"head_{name.replace('-', '_')}")
    clone = type(head).from_config(head.get_config())
    assert clone.get_config() == head.get_config()
    assert clone.options == head.options


def test_saved_model_loads_back_with_centers_and_state(tmp_path):
    head = mfk.CurricularFace(C, scale=30.0, name="curricular")
    model = _model(head)
    x, y = _inputs()
    model([x, y], training=True)
    model([x, y], training=True)
    t = float(ops.convert_to_numpy(head.t))
    assert t != 0.0
    path = tmp_path / "model.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    twin = loaded.get_layer("curricular")
    assert isinstance(twin, mfk.CurricularFace)
    assert twin.options == head.options
    assert float(ops.convert_to_numpy(twin.t)) == pytest.approx(t)
    np.testing.assert_array_equal(
        ops.convert_to_numpy(twin.centers), ops.convert_to_numpy(head.centers)
    )
    np.testing.assert_allclose(
        ops.convert_to_numpy(loaded([x, y])), ops.convert_to_numpy(model([x, y])), rtol=1e-6
    )


@pytest.mark.parametrize("name", ["adaface", "sphereface", "adacos"])
def test_saved_state_of_the_other_stateful_heads(name, tmp_path):
    head = mfk.create_head(name, num_classes=C, name="head")
    model = _model(head)
    x, y = _inputs()
    model([x * 10, y], training=True)
    path = tmp_path / "model.keras"
    model.save(path)
    twin = keras.saving.load_model(path).get_layer("head")
    for state in head.state_names:
        assert float(ops.convert_to_numpy(getattr(twin, state))) == pytest.approx(
            float(ops.convert_to_numpy(getattr(head, state)))
        )


def test_fit_trains_the_centers_and_moves_state_in_training_only():
    keras.utils.set_random_seed(0)
    head = mfk.CurricularFace(C, scale=16.0, margin=0.2)
    model = _model(head)
    model.compile(
        optimizer=keras.optimizers.Adam(0.05),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    x, y = _inputs(64, seed=1)
    x = x + 3.0 * np.eye(C, D, dtype="float32")[y]  # separable classes
    before = ops.convert_to_numpy(head.centers).copy()
    history = model.fit([x, y], y, epochs=3, batch_size=16, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    assert history.history["loss"][-1] < history.history["loss"][0]
    assert not np.allclose(ops.convert_to_numpy(head.centers), before)
    t = float(ops.convert_to_numpy(head.t))
    assert t > 0.0  # 12 updates of t towards the mean target cosine
    model.evaluate([x, y], y, verbose=0)
    model.predict([x, y], verbose=0)
    assert float(ops.convert_to_numpy(head.t)) == t


def test_magface_regularizer_goes_through_add_loss():
    head = mfk.MagFace(C)
    x, y = _inputs()
    head([x * 30, y], training=True)
    assert len(head.losses) == 1
    norms = np.clip(np.linalg.norm(x * 30, axis=1), 10.0, 110.0)
    expected = 35.0 * np.mean(1.0 / norms + norms / 110.0**2)
    assert float(ops.convert_to_numpy(head.losses[0])) == pytest.approx(expected, rel=1e-5)
    head(x * 30)
    assert not head.losses  # inference: s·cos θ, no regularizer


def test_curricular_face_loss_config_and_model_use():
    loss = mfk.CurricularFaceLoss(scale=30.0, momentum=0.9, reduction="sum")
    clone = mfk.CurricularFaceLoss.from_config(loss.get_config())
    assert clone.get_config() == loss.get_config()
    cosine = np.tanh(np.random.default_rng(0).normal(size=(6, C))).astype("float32")
    labels = np.arange(6) % C
    per_sample = mfk.CurricularFaceLoss(reduction=None)(labels, cosine)
    assert tuple(per_sample.shape) == (6,)
    total = loss(labels, cosine)
    assert float(ops.convert_to_numpy(loss.t)) != 0.0
    assert np.isfinite(float(ops.convert_to_numpy(total)))


# ------------------------------------------------------------------ bad input
def _built_head():
    head = mfk.ArcFace(C)
    head.build((None, D))
    return head


def test_labels_out_of_range():
    x, y = _inputs()
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 4\].*got 5"):
        _built_head()([x, np.where(np.arange(8) == 3, C, y).astype("int32")], training=True)
    with pytest.raises(ValueError, match=r"got -1"):
        _built_head()([x, np.full_like(y, -1)], training=True)


def test_float_labels():
    x, y = _inputs()
    with pytest.raises(TypeError, match="labels must have an integer dtype.*float32"):
        _built_head()([x, y.astype("float32")], training=True)
    with pytest.raises(TypeError, match="labels must have an integer dtype.*bool"):
        _built_head()([x, y > 2], training=True)


def test_label_shapes():
    x, y = _inputs()
    head = _built_head()
    column = head([x, y[:, None]], training=False)  # (N, 1), as Keras feeds it
    np.testing.assert_allclose(
        ops.convert_to_numpy(column), ops.convert_to_numpy(head([x, y], training=False))
    )
    with pytest.raises(ValueError, match=r"shape \(N,\) or \(N, 1\), got \(8, 2\)"):
        head([x, np.stack([y, y], axis=1)], training=True)
    with pytest.raises(ValueError, match="expected N = 8, got 7"):
        head([x, y[:7]], training=True)


def test_embedding_ranks_dtypes_and_widths():
    x, y = _inputs()
    head = _built_head()
    with pytest.raises(ValueError, match=r"embeddings must have shape \(N, D\), got \(2, 4, 3\)"):
        head([x.reshape(2, 4, D), y], training=True)
    with pytest.raises(TypeError, match="embeddings must have a floating dtype, got int32"):
        head([x.astype("int32"), y], training=True)
    with pytest.raises(ValueError, match="D = 3 columns"):
        head([np.ones((8, 4), "float32"), y], training=True)
    with pytest.raises(ValueError, match="non-finite values.*in 1 row"):
        head([np.where(np.arange(8)[:, None] == 2, np.nan, x).astype("float32"), y])
    with pytest.raises(ValueError, match="takes embeddings or \\[embeddings, labels\\]"):
        head([x, y, y])
    with pytest.raises(ValueError, match="known D"):
        mfk.ArcFace(C).build((None, D, 2))


def test_bad_options():
    with pytest.raises(TypeError, match="'margn' \\(did you mean 'margin'\\?\\)"):
        mfk.ArcFace(C, margn=0.3)
    with pytest.raises(TypeError, match="'impl'"):
        mfk.create_head("cosface", num_classes=C, impl="chunked")  # PyTorch-only option
    with pytest.raises(ValueError, match="margin must be >= 0, got -0.1"):
        mfk.ArcFace(C, margin=-0.1)
    with pytest.raises(ValueError, match="policy must be one of"):
        mfk.CurricularFace(C, policy="wrap")
    with pytest.raises(ValueError, match="num_classes must be >= 2, got 1"):
        mfk.NormFace(1)
    with pytest.raises(ValueError, match="unknown loss 'arcfaec'; valid names"):
        mfk.create_head("arcfaec", num_classes=C)


def test_curricular_face_loss_bad_labels():
    loss = mfk.CurricularFaceLoss()
    cosine = np.zeros((4, C), "float32")
    with pytest.raises(TypeError, match="y_true must be integer class indices"):
        loss(np.array([0.0, 1.0, 2.0, 3.0], "float32"), cosine)
    with pytest.raises(ValueError, match=r"y_true must lie in \[0, 4\].*got 7"):
        loss(np.array([0, 1, 2, 7]), cosine)
    with pytest.raises(ValueError, match="exactly one 1 per row"):
        loss(np.full((4, C), 0.5, "float32"), cosine)
    with pytest.raises(ValueError, match="y_pred must be cosines of shape"):
        loss(np.array([0, 1, 2, 3]), np.zeros((4,), "float32"))
    with pytest.raises(ValueError, match="y_true has 3 rows but y_pred has 4"):
        loss(np.array([0, 1, 2]), cosine)
    with pytest.raises(ValueError, match="momentum must be <= 1"):
        mfk.CurricularFaceLoss(momentum=1.5)


def test_traced_out_of_range_labels_give_nan_rows():
    if keras.backend.backend() != "jax":
        pytest.skip("tracing with concrete-free labels is exercised on JAX (make test-keras-jax)")
    import jax

    head = _built_head()
    x, y = _inputs()
    bad = np.where(np.arange(8) == 3, C, y).astype("int32")

    @jax.jit
    def logits(labels):
        out, _ = head.stateless_call(
            [v.value for v in head.trainable_variables],
            [v.value for v in head.non_trainable_variables],
            [x, labels],
            training=False,
        )
        return out

    out = np.asarray(logits(bad))
    assert np.isnan(out[3]).all()
    assert np.isfinite(np.delete(out, 3, axis=0)).all()
