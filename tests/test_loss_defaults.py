"""The named losses take their margin's defaults: one source of truth, in the margin classes."""

from __future__ import annotations

import inspect
import pydoc

import pytest

import marginface
from marginface.losses import AM_SOFTMAX_SCALE, margin_defaults
from marginface.margins import AdaCosMargin, ArcFaceMargin

ALL = marginface.list_losses()

DELIBERATE = {
    ("amsoftmax", "scale"): AM_SOFTMAX_SCALE,
    ("sphereface2-a", "variant"): "A",
    ("sphereface2-a", "margin"): 0.5,
    ("sphereface2-a", "gradient"): "straight_through",
    ("sphereface2-m", "variant"): "M",
    ("sphereface2-m", "margin"): 1.7,
    ("sphereface2-m", "gradient"): "straight_through",
    ("uniface-a", "variant"): "A",
    ("uniface-a", "margin"): 0.5,
}
"""Named-loss defaults that differ from their margin's on purpose (AM-Softmax's paper: s = 30;
SphereFace2-A and -M: the variant, its margin from the authors' configurations and their
straight-through gradient; UniFace-A: the angular variant with ArcFace's m = 0.5)."""

NOT_EXPOSED = {("normface", "gradient"), ("adacos", "gradient")} | {
    ("sphereface-plus", key) for key in ("kind", "feature_norm", "soft_weight")
}
"""Margin options a named loss does not take (the margin leaves the target cosine as it is, so
the gradient mode changes nothing; SphereFace+ is the authors' one-variant head)."""

HEAD_OR_STATE = {"device", "num_classes"}


def _margin_class(name: str) -> type:
    return type(marginface.create_loss(name, num_classes=7, embedding_dim=5).margin)


def _settings(margin) -> dict:
    """The margin's plain settings (floats, strings...) and scalar buffers."""
    plain = {
        key: value
        for key, value in vars(margin).items()
        if not key.startswith("_") and isinstance(value, (bool, int, float, str, type(None)))
    }
    buffers = {key: float(value) for key, value in margin.named_buffers() if value.numel() == 1}
    return {**plain, **buffers}


def _loss_parameter(cls: type, key: str) -> inspect.Parameter | None:
    """``key`` in the signature of ``cls`` or, where ``cls`` forwards ``**kwargs`` to a parent
    loss (AM-Softmax to CosFace), of the first parent that declares it."""
    for klass in cls.__mro__:
        if klass is marginface.MarginSoftmaxLoss:
            return None
        parameters = inspect.signature(klass).parameters
        if key in parameters:
            return parameters[key]
    return None


@pytest.mark.parametrize("name", ALL)
def test_named_loss_defaults_equal_the_margins(name):
    cls = marginface.get_loss_class(name)
    margin_parameters = inspect.signature(_margin_class(name)).parameters
    shared = [key for key in margin_parameters if key not in HEAD_OR_STATE]
    for key in shared:
        parameter = _loss_parameter(cls, key)
        if (name, key) in NOT_EXPOSED:
            assert parameter is None
            continue
        assert parameter is not None, f"{name} does not take its margin's {key!r}"
        expected = DELIBERATE.get((name, key), margin_parameters[key].default)
        assert parameter.default == expected, (name, key)


@pytest.mark.parametrize("name", ALL)
def test_a_default_loss_builds_the_default_margin(name):
    """The defaults are passed on, not only declared: the margin of ``Loss(C, D)`` equals
    ``Margin()`` (with AM-Softmax's scale)."""
    margin_class = _margin_class(name)
    options = {key: value for (loss, key), value in DELIBERATE.items() if loss == name}
    if margin_class is AdaCosMargin:
        options["num_classes"] = 7
    built = marginface.create_loss(name, num_classes=7, embedding_dim=5).margin
    assert _settings(built) == _settings(margin_class(**options))


def test_margin_defaults_reads_the_signature():
    class Toy:
        def __init__(self, needed: int, scale: float = 2.0, *, kind: str = "a", off=None):
            pass

    assert margin_defaults(Toy) == {"scale": 2.0, "kind": "a", "off": None}
    assert margin_defaults(ArcFaceMargin) == {
        "margin": 0.5,
        "scale": 64.0,
        "policy": "linear",
        "gradient": "exact",
        "interclass_filtering_threshold": 0.0,
    }


@pytest.mark.parametrize("name", ALL)
def test_help_shows_the_parameters_and_their_defaults(name):
    cls = marginface.get_loss_class(name)
    text = pydoc.render_doc(cls, renderer=pydoc.plaintext)
    for key, parameter in inspect.signature(cls).parameters.items():
        if parameter.default is inspect.Parameter.empty or key == "device":
            continue
        assert f"{key}={parameter.default!r}" in text, (name, key)
