"""head/margin_softmax.py: :class:`MarginSoftmaxLoss` wires one margin to one executor. Its loss
is checked against ArcFace restated by hand (cosines, the additive angular margin on the
target, softmax cross-entropy, each reduction), in float64; its constructor's argument errors
name the argument and the value."""

from __future__ import annotations

import math

import pytest
import torch

import marginface
from marginface.margins import ArcFaceMargin, CosFaceMargin

C, D, N = 5, 4, 6


def _batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(N, D, generator=generator, dtype=torch.float64) * 3
    labels = torch.randint(0, C, (N,), generator=generator)
    return x, labels


def _arcface_by_hand(x, labels, weight, margin: float, scale: float) -> list[float]:
    """Per-sample ``-log softmax`` of ``s·cos θ_j`` with ``cos(θ_y + m)`` at the target (the
    plain rule: ``θ_y + m < π`` here), written with Python floats."""
    losses = []
    for row, y in zip(x.tolist(), labels.tolist(), strict=True):
        norm = math.sqrt(sum(v * v for v in row))
        logits = []
        for j, center in enumerate(weight.tolist()):
            cos = sum(a * b for a, b in zip(row, center, strict=True))
            cos /= norm * math.sqrt(sum(b * b for b in center))
            if j == y:
                theta = math.acos(max(-1.0, min(1.0, cos)))
                assert theta + margin < math.pi
                cos = math.cos(theta + margin)
            logits.append(scale * cos)
        top = max(logits)
        log_sum = top + math.log(sum(math.exp(v - top) for v in logits))
        losses.append(log_sum - logits[y])
    return losses


def test_the_loss_is_arcface_restated_by_hand_for_each_reduction():
    x, labels = _batch()
    head = marginface.MarginSoftmaxLoss(
        C, D, ArcFaceMargin(margin=0.3, scale=8.0), dtype=torch.float64, reduction="none"
    )
    expected = _arcface_by_hand(x, labels, head.weight.detach(), 0.3, 8.0)
    torch.testing.assert_close(head(x, labels), torch.tensor(expected, dtype=torch.float64))
    head.reduction = "sum"
    torch.testing.assert_close(head(x, labels), torch.tensor(sum(expected), dtype=torch.float64))
    head.reduction = "mean"
    torch.testing.assert_close(
        head(x, labels), torch.tensor(sum(expected) / N, dtype=torch.float64)
    )


def test_cosine_and_plain_logits_are_the_scaled_cosines():
    x, labels = _batch(1)
    head = marginface.MarginSoftmaxLoss(C, D, CosFaceMargin(margin=0.2, scale=10.0))
    x32 = x.float()
    expected = (
        torch.nn.functional.normalize(x32, dim=1)
        @ torch.nn.functional.normalize(head.weight.detach(), dim=1).T
    )
    torch.testing.assert_close(head.cosine(x32), expected)
    torch.testing.assert_close(head.logits(x32), 10.0 * expected)
    with_margin = head.logits(x32, labels)  # CosFace: s·(cos θ_y − m) at the target only
    shifted = 10.0 * expected
    shifted[torch.arange(N), labels] -= 10.0 * 0.2
    torch.testing.assert_close(with_margin, shifted)


def test_the_loss_trains_the_centers_and_keeps_their_shape_and_dtype():
    x, labels = _batch(2)
    head = marginface.ArcFaceLoss(C, D, dtype=torch.float64)
    assert tuple(head.weight.shape) == (C, D) and head.weight.dtype == torch.float64
    head(x, labels).backward()
    assert head.weight.grad is not None and torch.isfinite(head.weight.grad).all()
    assert head.weight.grad.abs().sum() > 0
    text = repr(head)
    assert f"num_classes={C}, embedding_dim={D}" in text and "impl='dense'" in text


def test_reset_parameters_redraws_the_centers():
    head = marginface.ArcFaceLoss(C, D)
    before = head.weight.detach().clone()
    head.reset_parameters()
    assert not torch.equal(before, head.weight.detach())
    assert float(head.weight.detach().abs().max()) < 0.1  # N(0, 0.01²)


# ---------------------------------------------------------------- constructor errors
def test_embedding_dim_and_sub_centers() -> None:
    with pytest.raises(ValueError, match="embedding_dim must be >= 1, got 0"):
        marginface.ArcFaceLoss(3, 0)
    with pytest.raises(ValueError, match="sub_centers must be >= 1, got 0"):
        marginface.SubCenterArcFaceLoss(3, 2, sub_centers=0)
    with pytest.raises(TypeError, match="sub_centers must be an integer, got 2.0"):
        marginface.SubCenterArcFaceLoss(3, 2, sub_centers=2.0)


def test_reduction_and_impl_and_dtype() -> None:
    with pytest.raises(ValueError, match="reduction must be one of .*got 'avg'"):
        marginface.ArcFaceLoss(3, 2, reduction="avg")
    with pytest.raises(ValueError, match="impl must be one of .*got 'sparse'"):
        marginface.ArcFaceLoss(3, 2, impl="sparse")
    with pytest.raises(TypeError, match="dtype must be a floating dtype, got torch.int64"):
        marginface.ArcFaceLoss(3, 2, dtype=torch.long)


def test_head_rejects_non_margin() -> None:
    with pytest.raises(TypeError, match="margin must be a marginface Margin, got Linear"):
        marginface.MarginSoftmaxLoss(3, 2, torch.nn.Linear(2, 2))


@pytest.mark.parametrize(
    ("options", "error", "text"),
    [
        ({"sample_rate": 0.0}, ValueError, "sample_rate"),
        ({"sample_rate": 1.5}, ValueError, "sample_rate must be <= 1"),
        ({"row_block": 0}, ValueError, "row_block must be >= 1, got 0"),
        ({"kernels": "cuda"}, ValueError, "kernels must be one of .*got 'cuda'"),
        ({"device": "gpu0"}, (TypeError, ValueError), "device"),
    ],
)
def test_more_options_are_named_when_bad(options, error, text):
    with pytest.raises(error, match=text):
        marginface.ArcFaceLoss(3, 2, **options)
