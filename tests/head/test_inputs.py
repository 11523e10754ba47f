"""head/inputs.py: the checks of a head's batch, through the head (every bad label or embedding
raises ValueError/TypeError naming the argument and the value) and through
:func:`checked_batch` / :func:`step_labels` directly (unsharded; the sharded path is checked
under torchrun in tests/distributed/)."""

from __future__ import annotations

import pytest
import torch

import marginface
from marginface.head.inputs import checked_batch, step_labels


@pytest.fixture()
def arcface() -> marginface.ArcFaceLoss:
    return marginface.ArcFaceLoss(5, 3)


# --------------------------------------------------------------------------- labels
def test_labels_out_of_range(arcface) -> None:
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 4\].*got 5"):
        arcface(torch.randn(2, 3), torch.tensor([0, 5]))
    with pytest.raises(ValueError, match="got -1"):
        arcface(torch.randn(2, 3), torch.tensor([-1, 0]))


def test_labels_float_dtype(arcface) -> None:
    with pytest.raises(TypeError, match=r"labels must have an integer dtype.*float32"):
        arcface(torch.randn(2, 3), torch.tensor([0.0, 1.0]))
    with pytest.raises(TypeError, match="torch.bool"):
        arcface(torch.randn(2, 3), torch.tensor([True, False]))


def test_labels_wrong_shape(arcface) -> None:
    with pytest.raises(ValueError, match=r"labels must have shape \(N,\), got \(2, 1\)"):
        arcface(torch.randn(2, 3), torch.tensor([[0], [1]]))
    with pytest.raises(ValueError, match="expected N = 2, got 3"):
        arcface(torch.randn(2, 3), torch.tensor([0, 1, 2]))


def test_labels_not_a_tensor(arcface) -> None:
    with pytest.raises(TypeError, match="labels must be a torch.Tensor, got list"):
        arcface(torch.randn(2, 3), [0, 1])


# ----------------------------------------------------------------------- embeddings
def test_embeddings_wrong_dimension(arcface) -> None:
    with pytest.raises(ValueError, match=r"embedding_dim = 3.*got shape \(2, 4\)"):
        arcface(torch.randn(2, 4), torch.tensor([0, 1]))


def test_embeddings_wrong_rank(arcface) -> None:
    with pytest.raises(ValueError, match=r"shape \(N, D\), got \(2, 3, 1\)"):
        arcface(torch.randn(2, 3, 1), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match=r"got \(3,\)"):
        arcface(torch.randn(3), torch.tensor([0]))


def test_embeddings_non_finite(arcface) -> None:
    x = torch.randn(3, 3)
    x[1, 2] = float("nan")
    with pytest.raises(ValueError, match=r"non-finite .* in 1 row"):
        arcface(x, torch.tensor([0, 1, 2]))
    x[1, 2] = float("inf")
    with pytest.raises(ValueError, match="non-finite"):
        arcface.logits(x)


def test_embeddings_integer_dtype(arcface) -> None:
    with pytest.raises(TypeError, match="floating dtype, got torch.int64"):
        arcface(torch.ones(2, 3, dtype=torch.long), torch.tensor([0, 1]))


def test_empty_batch(arcface) -> None:
    with pytest.raises(ValueError, match="empty batch"):
        arcface(torch.randn(0, 3), torch.tensor([], dtype=torch.long))


# ------------------------------------------------------------------- the functions
def test_checked_batch_returns_int64_labels_and_keeps_the_values():
    embeddings = torch.randn(3, 4)
    for dtype in (torch.int8, torch.int16, torch.int32, torch.uint8, torch.int64):
        labels = checked_batch(embeddings, torch.tensor([2, 0, 1], dtype=dtype), 4, 3)
        assert labels.dtype == torch.int64 and labels.tolist() == [2, 0, 1]


def test_step_labels_without_a_shard_is_checked_batch():
    embeddings = torch.randn(2, 4)
    labels = step_labels(embeddings, torch.tensor([1, 0], dtype=torch.int32), 4, 2, None)
    assert labels.dtype == torch.int64 and labels.tolist() == [1, 0]
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 1\].*got 2"):
        step_labels(embeddings, torch.tensor([2, 0]), 4, 2, None)
    with pytest.raises(ValueError, match=r"embedding_dim = 5.*got shape \(2, 4\)"):
        step_labels(embeddings, torch.tensor([1, 0]), 5, 2, None)


@pytest.mark.parametrize(
    ("embeddings", "labels", "error", "text"),
    [
        ([[0.0, 1.0]], torch.tensor([0]), TypeError, "embeddings must be a torch.Tensor"),
        (torch.randn(2, 4), torch.tensor([0.0, 1.0]), TypeError, "labels must have an integer"),
        (torch.randn(2, 4), torch.tensor([0, 1, 1]), ValueError, "expected N = 2, got 3"),
        (torch.randn(2, 3), torch.tensor([0, 1]), ValueError, r"embedding_dim = 4"),
    ],
)
def test_checked_batch_names_the_bad_argument(embeddings, labels, error, text):
    with pytest.raises(error, match=text):
        checked_batch(embeddings, labels, 4, 2)
