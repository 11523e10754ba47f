"""The pipeline reads the margin's declaration, never its class: a run's error-versus-reject
curve (the feature norm as a quality score) follows ``Margin.feature_norm_is_quality``.

A margin declared in this file, unrelated to MagFace, gets the curve; the same margin without
the declaration, and MagFace's own with it switched off, get none.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import Tensor, nn

from marginface.data import DatasetBundle, ImageSet
from marginface.head import MarginSoftmaxLoss
from marginface.margins import MagFaceMargin
from marginface.margins.base import Context, Margin
from marginface.registry import create_loss, list_losses
from marginface.train.evaluation.evaluate import evaluate_model
from marginface.train.evaluation.quality import ERC_REPORTED_FRACTIONS, norm_is_quality


class _PlainMargin(Margin):
    """``s·(cos θ_y - 0.1)``: a margin that knows nothing of norms."""

    def scale_for(self, norms: Tensor | None) -> float:
        return 8.0

    def target_cosine(self, cos_target: Tensor, norms: Tensor | None, context: Context) -> Tensor:
        return cos_target - 0.1


class _QualityMargin(_PlainMargin):
    feature_norm_is_quality = True


def _bundle() -> DatasetBundle:
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(4), 6)  # 24 images, 4 identities
    images = rng.random((labels.size, 1, 4, 4), dtype=np.float32)
    test = ImageSet(images, labels, tuple("abcd"))
    return DatasetBundle("planted", test, test)


def _erc_keys(margin: Margin) -> list[str]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 3))
    head = MarginSoftmaxLoss(4, 3, margin)
    evaluation = evaluate_model(
        model, head, _bundle(), flip=False, batch_size=8, device="cpu", num_pairs=60
    )
    return [key for key in evaluation.metrics if key.startswith("erc_accuracy@")]


def test_a_declared_margin_gets_the_error_versus_reject_curve():
    expected = [f"erc_accuracy@reject={fraction:.2f}" for fraction in ERC_REPORTED_FRACTIONS]
    assert _erc_keys(_QualityMargin()) == expected
    assert _erc_keys(_PlainMargin()) == []


def test_magface_declares_it_and_the_declaration_is_what_counts(monkeypatch):
    assert MagFaceMargin.feature_norm_is_quality
    assert norm_is_quality(MarginSoftmaxLoss(4, 3, MagFaceMargin()))
    monkeypatch.setattr(MagFaceMargin, "feature_norm_is_quality", False)
    assert not norm_is_quality(MarginSoftmaxLoss(4, 3, MagFaceMargin()))


def test_only_magface_among_the_registered_losses_declares_it():
    declared = {
        name
        for name in list_losses()
        if create_loss(name, num_classes=4, embedding_dim=3).margin.feature_norm_is_quality
    }
    assert declared == {"magface"}


@pytest.mark.parametrize("head", [nn.Linear(3, 4), object()])
def test_a_head_without_a_margin_declares_nothing(head):
    assert not norm_is_quality(head)
