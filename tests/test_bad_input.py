"""Every bad input raises ValueError/TypeError naming the argument and the value: the margins'
hyperparameters and the functional API (a head's batch: tests/head/test_inputs.py; a head's
constructor: tests/head/test_margin_softmax.py)."""

from __future__ import annotations

import math

import pytest
import torch

import marginface
from marginface import functional as MF
from marginface.margins import (
    AdaCosMargin,
    AdaFaceMargin,
    ArcFaceMargin,
    CombinedMargin,
    CosFaceMargin,
    CurricularFaceMargin,
    ElasticFaceMargin,
    MagFaceMargin,
    NormFaceMargin,
    SphereFaceMargin,
)


# ------------------------------------------------------------------ hyperparameters
@pytest.mark.parametrize(
    ("factory", "message"),
    [
        (lambda: ArcFaceMargin(margin=-0.1), r"margin must be >= 0, got -0.1"),
        (lambda: ArcFaceMargin(margin=math.pi), r"margin must be < 3.14159, got 3.14159"),
        (lambda: ArcFaceMargin(margin=4.0), r"margin must be < 3.14159, got 4.0"),
        (lambda: ArcFaceMargin(scale=0.0), r"scale must be > 0, got 0.0"),
        (lambda: ArcFaceMargin(scale=-64), r"scale must be > 0, got -64"),
        (lambda: ArcFaceMargin(policy="soft"), r"policy must be one of .*'linear'.*got 'soft'"),
        (lambda: ArcFaceMargin(gradient="none"), r"gradient must be one of .*got 'none'"),
        (lambda: ArcFaceMargin(margin=float("nan")), r"margin must be finite, got nan"),
        (lambda: CosFaceMargin(margin=-0.35), r"margin must be >= 0, got -0.35"),
        (lambda: NormFaceMargin(scale=-1.0), r"scale must be > 0, got -1.0"),
        (lambda: CombinedMargin(m1=0.0), r"m1 must be > 0, got 0.0"),
        (lambda: CombinedMargin(m2=-0.5), r"m2 must be >= 0, got -0.5"),
        (lambda: CombinedMargin(m3=-0.1), r"m3 must be >= 0, got -0.1"),
        (lambda: SphereFaceMargin(margin=0), r"margin must be >= 1, got 0"),
        (lambda: SphereFaceMargin(margin=-2), r"margin must be >= 1, got -2"),
        (lambda: SphereFaceMargin(margin=1.5), r"margin must be an integer, got 1.5"),
        (lambda: SphereFaceMargin(margin=True), r"margin must be an integer, got True"),
        (lambda: SphereFaceMargin(scale=0.0), r"scale must be > 0, got 0.0"),
        (lambda: CurricularFaceMargin(momentum=1.5), r"momentum must be <= 1, got 1.5"),
        (lambda: AdaCosMargin(num_classes=1), r"num_classes must be >= 2, got 1"),
        (lambda: MagFaceMargin(lower_norm=50, upper_norm=20), r"upper_norm must be > lower_norm"),
        (lambda: MagFaceMargin(lower_norm=20, upper_norm=20), r"upper_norm must be > lower_norm"),
        (lambda: MagFaceMargin(lower_margin=0.9), r"upper_margin must be >= lower_margin"),
        (lambda: AdaFaceMargin(h=0), r"h must be > 0, got 0"),
        (lambda: ElasticFaceMargin(kind="sphere"), r"kind must be one of 'arc', 'cos'"),
        (lambda: ElasticFaceMargin(std=-0.1), r"std must be >= 0, got -0.1"),
        (lambda: ArcFaceMargin(margin="0.5"), r"margin must be a real number, got '0.5'"),
    ],
)
def test_invalid_hyperparameters(factory, message: str) -> None:
    with pytest.raises((ValueError, TypeError), match=message):
        factory()


@pytest.mark.parametrize("name", marginface.list_losses())
def test_num_classes_below_two(name: str) -> None:
    with pytest.raises(ValueError, match="num_classes must be >= 2, got 1"):
        marginface.create_loss(name, num_classes=1, embedding_dim=3)


# ----------------------------------------------------------------- functional API
def test_functional_bad_cosine_and_norms() -> None:
    labels = torch.tensor([0, 1])
    with pytest.raises(ValueError, match=r"cosine must have shape \(N, C\)"):
        MF.margin_logits(torch.rand(2), labels, ArcFaceMargin())
    with pytest.raises(ValueError, match="non-finite"):
        MF.margin_logits(torch.tensor([[float("nan"), 0.0], [0.0, 0.0]]), labels, ArcFaceMargin())
    with pytest.raises(ValueError, match="norms is required"):
        MF.margin_logits(torch.rand(2, 3), labels, MagFaceMargin())
    with pytest.raises(ValueError, match=r"norms must have shape \(2,\), got \(3,\)"):
        MF.margin_logits(torch.rand(2, 3), labels, MagFaceMargin(), torch.ones(3))
    with pytest.raises(TypeError, match=r"norms must be a floating torch.Tensor.*\[20, 30\]"):
        MF.margin_logits(torch.rand(2, 3), labels, MagFaceMargin(), torch.tensor([20, 30]))
    with pytest.raises(TypeError, match="margin must be a marginface Margin"):
        MF.margin_cross_entropy(torch.rand(2, 3), labels, "arcface")
    with pytest.raises(ValueError, match="got -1"):
        MF.margin_cross_entropy(torch.rand(2, 3), torch.tensor([-1, 0]), ArcFaceMargin())


def test_functional_accepts_missing_label_rows() -> None:
    """label -1: the row's class is elsewhere (sharded executors); it gets no margin."""
    cosine = torch.tensor([[0.5, 0.2], [0.3, 0.9]])
    logits = MF.margin_logits(cosine, torch.tensor([-1, 1]), ArcFaceMargin(0.5, 10.0))
    torch.testing.assert_close(logits[0], cosine[0] * 10)
    assert float(logits[1, 1]) < 9.0
