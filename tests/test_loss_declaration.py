"""A named loss is one declaration: its signature is its margin's parameters plus the head's
options, its constructor builds that margin, and head options pass through untouched."""

from __future__ import annotations

import inspect

import pytest
import torch

import marginface
from marginface.head import MarginSoftmaxLoss
from marginface.losses import LossDeclaration, NamedLoss
from marginface.margins import ArcFaceMargin, CosFaceMargin, Margin
from marginface.weight_regularizers import MinimumHypersphericalEnergy

NAMED = [
    name
    for name in marginface.list_losses()
    if issubclass(marginface.get_loss_class(name), NamedLoss)
]
FROM_HEAD = {"num_classes", "device", "sample_rate"}
"""Margin parameters the head fills in (AdaCos's initial scale, stateful margins' buffers,
UniFace's initial threshold)."""

HIDDEN = {
    "normface": {"gradient"},
    "adacos": {"gradient"},
    "sphereface-plus": {"kind", "feature_norm", "soft_weight"},  # the authors' head has none
}
OVERRIDES = {
    ("amsoftmax", "scale"): 30.0,
    ("subcenter-arcface", "sub_centers"): 3,
    ("sphereface-plus", "weight_regularizer"): MinimumHypersphericalEnergy(),
    ("sphereface2-a", "variant"): "A",
    ("sphereface2-a", "margin"): 0.5,
    ("sphereface2-a", "gradient"): "straight_through",
    ("sphereface2-m", "variant"): "M",
    ("sphereface2-m", "margin"): 1.7,
    ("sphereface2-m", "gradient"): "straight_through",
    ("uniface-a", "variant"): "A",
    ("uniface-a", "margin"): 0.5,
}


def _head_keywords() -> dict[str, inspect.Parameter]:
    parameters = inspect.signature(MarginSoftmaxLoss).parameters
    return {
        k: p for k, p in parameters.items() if k not in ("num_classes", "embedding_dim", "margin")
    }


def test_every_registered_paper_is_declared():
    # 12 + MV-AM, MV-Arc, Li-ArcFace, Circle, ArcNegFace, AdaM-Softmax, NPCFace, SphereFace-R,
    # SphereFace+ + SphereFace2 (C, A, M), UniFace (C, A)
    assert len(NAMED) == 26 and marginface.list_losses() == NAMED


@pytest.mark.parametrize("name", NAMED)
def test_signature_is_margin_parameters_plus_head_options(name):
    cls = marginface.get_loss_class(name)
    margin_class = cls.declaration.margin_class
    margin_parameters = inspect.signature(margin_class).parameters
    signature = inspect.signature(cls).parameters
    names = list(signature)
    assert names[:2] == ["num_classes", "embedding_dim"]
    expected_margin = [
        key for key in margin_parameters if key not in FROM_HEAD | HIDDEN.get(name, set())
    ]
    head = _head_keywords()
    assert sorted(names[2 : 2 + len(expected_margin)]) == sorted(expected_margin)
    assert names[2 + len(expected_margin) :] == list(head)
    for key in expected_margin:
        default = OVERRIDES.get((name, key), margin_parameters[key].default)
        assert signature[key].default == default, (name, key)
    for key, parameter in head.items():
        assert signature[key].kind is inspect.Parameter.KEYWORD_ONLY, key
        assert signature[key].default == OVERRIDES.get((name, key), parameter.default), key
    assert not any(p.kind is p.VAR_KEYWORD for p in signature.values())


@pytest.mark.parametrize("name", NAMED)
def test_head_options_pass_through(name):
    options = {
        "reduction": "sum",
        "impl": "auto",
        "chunk_size": 3,
        "memory_budget": 0,
        "sub_centers": 2,
        "dtype": torch.float64,
    }
    if name == "elasticface":
        options["seed"] = 0
    loss = marginface.create_loss(name, 7, 5, **options)
    assert (loss.reduction, loss.impl, loss.chunk_size) == ("sum", "auto", 3)
    assert (loss.memory_budget, loss.sub_centers) == (0, 2)
    assert loss.weight.dtype == torch.float64 and loss.weight.shape == (14, 5)


def test_positional_order_is_the_declared_one():
    loss = marginface.CombinedMarginLoss(7, 5, 0.9, 0.4, 0.1, 32.0)
    assert (loss.margin.m1, loss.margin.m2, loss.margin.m3, loss.margin.scale) == (
        0.9,
        0.4,
        0.1,
        32.0,
    )
    elastic = marginface.ElasticFaceLoss(7, 5, 0.3, 16.0, kind="cos")
    assert (elastic.margin.kind, elastic.margin.margin, elastic.margin.scale) == ("cos", 0.3, 16.0)
    with pytest.raises(TypeError, match="ArcFaceLoss: too many positional arguments"):
        marginface.ArcFaceLoss(7, 5, 0.5, 64.0, "linear")
    with pytest.raises(TypeError, match="ArcFaceLoss: missing a required argument"):
        marginface.ArcFaceLoss(7)


def test_margin_parameters_named_like_head_ones_come_from_the_head():
    adacos = marginface.AdaCosLoss(11, 5, dtype=torch.float64)
    assert adacos.margin.num_classes == 11
    assert float(adacos.margin.scale) == pytest.approx(2**0.5 * torch.log(torch.tensor(10.0)))
    curricular = marginface.CurricularFaceLoss(7, 5, device="meta")
    assert curricular.margin.t.device.type == "meta"


def test_unknown_keyword_names_the_closest_valid_one():
    with pytest.raises(TypeError, match=r"ArcFaceLoss got unknown keyword argument\(s\) 'scal'"):
        marginface.ArcFaceLoss(7, 5, scal=3.0)
    with pytest.raises(TypeError, match=r"\(did you mean 'scale'\?\)"):
        marginface.ArcFaceLoss(7, 5, scal=3.0)
    with pytest.raises(TypeError, match="'gradient'"):
        marginface.NormFaceLoss(7, 5, gradient="exact")  # hidden: not an option of NormFace


def test_subclass_relations_and_state_dict_keys_are_the_papers():
    assert issubclass(marginface.AMSoftmaxLoss, marginface.CosFaceLoss)
    for name in NAMED:
        assert issubclass(marginface.get_loss_class(name), MarginSoftmaxLoss)
    assert set(marginface.CurricularFaceLoss(7, 5).state_dict()) == {"weight", "margin.t"}
    assert set(marginface.ArcFaceLoss(7, 5).state_dict()) == {"weight"}
    assert marginface.ArcFaceLoss.__module__ == "marginface.losses"
    assert marginface.ArcFaceLoss.__init__.__qualname__ == "ArcFaceLoss.__init__"


def test_docstring_is_the_summary_then_the_margins():
    doc = marginface.CosFaceLoss.__doc__
    assert doc.startswith("CosFace: ``s·(cos θ_y - m)``.")
    assert inspect.cleandoc(CosFaceMargin.__doc__) in doc
    assert "Defaults: ``margin=0.35``, ``scale=64.0``" in doc
    assert "``impl='dense'``" in doc


def test_a_new_declaration_is_one_class_statement():
    class ShiftedMargin(Margin):
        """Toy margin: ``s·(cos θ_y - shift)``."""

        def __init__(self, shift: float = 0.2, scale: float = 8.0, *, gradient: str = "exact"):
            super().__init__(gradient=gradient)
            self.shift, self.scale = shift, scale

        def scale_for(self, norms):
            return self.scale

        def target_cosine(self, cos_target, norms, context):
            return cos_target - self.shift

    class ShiftedLoss(NamedLoss, margin=ShiftedMargin, positional=("shift",)):
        """Shifted: a toy."""

    class WiderShiftedLoss(ShiftedLoss, defaults={"shift": 0.4, "reduction": "sum"}):
        """Shifted with a wider default."""

    assert list(inspect.signature(ShiftedLoss).parameters)[:5] == [
        "num_classes",
        "embedding_dim",
        "shift",
        "scale",
        "gradient",
    ]
    assert inspect.signature(ShiftedLoss).parameters["scale"].kind is inspect.Parameter.KEYWORD_ONLY
    loss = WiderShiftedLoss(4, 3)
    assert isinstance(loss, ShiftedLoss) and loss.margin.shift == 0.4 and loss.reduction == "sum"
    x, y = torch.randn(6, 3), torch.randint(0, 4, (6,))
    expected = MarginSoftmaxLoss(4, 3, ShiftedMargin(0.4), reduction="sum")
    expected.load_state_dict(loss.state_dict())
    torch.testing.assert_close(loss(x, y), expected(x, y))


def test_declaration_errors_name_the_bad_value():
    with pytest.raises(TypeError, match="margin must be a Margin subclass, got 3"):
        LossDeclaration.build(3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"positional names 'margn' \(did you mean 'margin'\?\)"):
        LossDeclaration.build(ArcFaceMargin, positional=("margn",))
    with pytest.raises(ValueError, match=r"defaults names 'scal'"):
        LossDeclaration.build(ArcFaceMargin, defaults={"scal": 3.0})
    with pytest.raises(ValueError, match=r"hidden names 'gradiant'"):
        LossDeclaration.build(ArcFaceMargin, hidden=("gradiant",))
    with pytest.raises(TypeError, match="must declare its margin"):

        class Marginless(NamedLoss):
            pass
