"""Closed-set accuracy against the loss heads' own logits."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import marginface
from marginface.evaluation import closed_set_accuracy, cosine_to_centers


@pytest.mark.parametrize("seed", range(3))
def test_matches_argmax_of_the_heads_inference_logits(seed: int) -> None:
    torch.manual_seed(seed)
    loss = marginface.create_loss("arcface", num_classes=7, embedding_dim=3)
    embeddings, labels = torch.randn(200, 3), torch.randint(0, 7, (200,))
    expected = (loss.logits(embeddings).argmax(dim=1) == labels).double().mean().item()
    assert closed_set_accuracy(embeddings, labels, loss.weight) == pytest.approx(expected)


def test_sub_centers_match_subcenter_arcface() -> None:
    loss = marginface.create_loss("subcenter-arcface", num_classes=5, embedding_dim=4)
    embeddings, labels = torch.randn(100, 4), torch.randint(0, 5, (100,))
    expected = (loss.logits(embeddings).argmax(dim=1) == labels).double().mean().item()
    got = closed_set_accuracy(embeddings, labels, loss.weight, sub_centers=loss.sub_centers)
    assert got == pytest.approx(expected)
    cosine = cosine_to_centers(embeddings, loss.weight, sub_centers=3)
    np.testing.assert_allclose(cosine, loss.cosine(embeddings).detach().numpy(), atol=1e-6)


def test_scale_of_embeddings_does_not_matter_and_perfect_is_one() -> None:
    centers = np.eye(3)
    labels = np.array([0, 1, 2, 2])
    embeddings = np.array([[5.0, 1, 0], [0, 0.1, 0], [0, 0, 3], [1, 0, 2]])
    assert closed_set_accuracy(embeddings, labels, centers) == 1.0
    assert closed_set_accuracy(embeddings, np.array([1, 1, 2, 0]), centers) == 0.5


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"labels": np.array([0, 3])}, ValueError, r"labels must lie in \[0, 2\]"),
        ({"labels": np.array([0, -1])}, ValueError, "got -1"),
        ({"labels": np.array([0])}, ValueError, "labels must have length 2"),
        ({"centers": np.eye(2)}, ValueError, "centers must have D = 3"),
        ({"centers": np.eye(3), "sub_centers": 2}, ValueError, "multiple of sub_centers"),
        ({"centers": np.eye(3), "sub_centers": 0}, ValueError, "sub_centers must be >= 1"),
        ({"embeddings": [[1.0, 0.0, 0.0]] * 2}, None, None),
        ({"embeddings": {"a": 1}}, TypeError, "embeddings must be a torch.Tensor"),
    ],
)
def test_bad_input(kwargs: dict, error: type | None, match: str | None) -> None:
    arguments = {"embeddings": np.ones((2, 3)), "labels": np.array([0, 1]), "centers": np.eye(3)}
    arguments.update(kwargs)
    if error is None:  # lists are accepted too
        assert closed_set_accuracy(**arguments) == 0.5
        return
    with pytest.raises(error, match=match):
        closed_set_accuracy(**arguments)
