"""Names that say what they hold: ``loss.margin`` is the Margin module; its size reads as
``angular_margin`` / ``cosine_margin`` / ... and, as before, as ``margin``."""

from __future__ import annotations

import inspect

import pytest

import marginface
from marginface.margins import Margin
from marginface.margins._alias import alias, aliases_of

EXPECTED = {
    "arcface": "angular_margin",
    "subcenter-arcface": "angular_margin",
    "curricularface": "angular_margin",
    "cosface": "cosine_margin",
    "amsoftmax": "cosine_margin",
    "sphereface": "angle_multiplier",
    "elasticface": "mean_margin",
    "adaface": "base_margin",
    "mv-am-softmax": "cosine_margin",
    "mv-arc-softmax": "angular_margin",
    "li-arcface": "angular_margin",
    "circle": "relaxation",
    "arcnegface": "angular_margin",
    "sphereface2": "variant_margin",
    "sphereface2-a": "variant_margin",
    "sphereface2-m": "variant_margin",
    "uniface": "variant_margin",
    "uniface-a": "variant_margin",
    "npcface": "angular_margin",
    "sphereface-r": "angle_multiplier",
    "sphereface-plus": "angle_multiplier",
}


@pytest.mark.parametrize("name", marginface.list_losses())
def test_the_head_holds_the_margin_module_under_its_old_name(name):
    loss = marginface.create_loss(name, 7, 5)
    assert isinstance(loss.margin, Margin)
    assert dict(loss.named_children())["margin"] is loss.margin


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_size_has_a_unit_name_and_keeps_its_old_one(name):
    loss = marginface.create_loss(name, 7, 5)
    margin = loss.margin
    assert aliases_of(type(margin)) == {EXPECTED[name]: "margin"}
    new = EXPECTED[name]
    default = inspect.signature(type(margin)).parameters["margin"].default
    declared = marginface.get_loss_class(name).declaration.margin_options  # SphereFace2-A, -M
    default = declared.get("margin", default)
    assert getattr(margin, new) == margin.margin == (default if default is not None else 0.5)
    changed = 3 if name == "sphereface" else 0.25
    setattr(margin, new, changed)  # writes through: both names agree
    assert margin.margin == changed and getattr(margin, new) == changed
    margin.margin = default if default is not None else 0.5
    assert getattr(margin, new) == margin.margin
    assert "margin" not in dict(margin.named_buffers())  # a plain float, not state
    assert "margin" in vars(margin) and new not in vars(margin)  # stored once


def test_margins_without_a_margin_argument_have_no_alias():
    for name in set(marginface.list_losses()) - set(EXPECTED):
        margin_class = type(marginface.create_loss(name, 7, 5).margin)
        assert "margin" not in inspect.signature(margin_class).parameters, name
        assert aliases_of(margin_class) == {}, name


def test_alias_is_documented_and_readable_on_the_class():
    descriptor = marginface.margins.ArcFaceMargin.angular_margin
    assert isinstance(descriptor, alias) and "radians" in descriptor.__doc__
    assert "cosine units" in marginface.margins.CosFaceMargin.cosine_margin.__doc__
