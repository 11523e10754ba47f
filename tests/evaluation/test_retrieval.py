"""Leave-one-out precision@1 and MAP@R against a brute-force loop."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from marginface.evaluation import retrieval_metrics
from marginface.evaluation.retrieval import _top_neighbours


def brute_force(embeddings: np.ndarray, labels: np.ndarray) -> tuple[float, float]:
    """Musgrave et al.'s definitions, one query at a time, with sorted() and Python loops."""
    unit = embeddings / np.linalg.norm(embeddings, axis=1, keepdims=True)
    p1, map_r = [], []
    for q in range(len(labels)):
        r = int(np.sum(labels == labels[q])) - 1
        if r == 0:
            continue
        others = [j for j in range(len(labels)) if j != q]
        ranked = sorted(others, key=lambda j: (-float(unit[q] @ unit[j]), j))
        relevant = [labels[j] == labels[q] for j in ranked[:r]]
        p1.append(float(relevant[0]))
        hits, total = 0, 0.0
        for i, rel in enumerate(relevant, start=1):
            if rel:
                hits += 1
                total += hits / i
        map_r.append(total / r)
    return float(np.mean(p1)), float(np.mean(map_r))


@pytest.mark.parametrize("seed", range(5))
def test_matches_brute_force(seed: int) -> None:
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 6, size=80)
    labels[0] = 99  # a singleton class: a distractor only, not a query
    centers = rng.normal(size=(100, 4))
    embeddings = centers[labels] * rng.uniform(0.0, 1.5) + rng.normal(size=(80, 4))
    result = retrieval_metrics(embeddings, labels, chunk_size=7)
    p1, map_r = brute_force(embeddings, labels)
    assert result["precision_at_1"] == pytest.approx(p1, abs=1e-12)
    assert result["map_at_r"] == pytest.approx(map_r, abs=1e-12)
    assert result["num_queries"] == 79


@pytest.mark.parametrize("seed", range(3))
def test_ties_are_broken_by_index_like_brute_force(seed: int) -> None:
    # axis vectors ±e_i: every cosine is exactly -1, 0 or 1, so ties are everywhere
    rng = np.random.default_rng(seed)
    embeddings = np.concatenate([np.eye(3), -np.eye(3)])[rng.integers(0, 6, size=60)]
    labels = rng.integers(0, 3, size=60)
    result = retrieval_metrics(embeddings, labels, chunk_size=16)
    p1, map_r = brute_force(embeddings, labels)
    assert result["precision_at_1"] == pytest.approx(p1, abs=1e-12)
    assert result["map_at_r"] == pytest.approx(map_r, abs=1e-12)


def test_top_neighbours_equals_stable_sort() -> None:
    generator = torch.Generator().manual_seed(0)
    sims = torch.randint(0, 4, (50, 40), generator=generator).double()  # many ties
    for k in (1, 5, 39, 40):
        expected = torch.sort(sims, dim=1, descending=True, stable=True).indices[:, :k]
        torch.testing.assert_close(_top_neighbours(sims, k), expected)


def test_chunk_size_and_tensor_input_do_not_change_the_result() -> None:
    rng = np.random.default_rng(0)
    embeddings, labels = rng.normal(size=(50, 3)), rng.integers(0, 4, size=50)
    whole = retrieval_metrics(embeddings, labels)
    chunked = retrieval_metrics(
        torch.from_numpy(embeddings), torch.from_numpy(labels), chunk_size=3
    )
    assert whole == pytest.approx(chunked)


def test_separated_classes_score_one_and_map_penalises_late_hits() -> None:
    labels = np.repeat(np.arange(3), 5)
    embeddings = np.eye(3)[labels] + 0.01 * np.random.default_rng(0).normal(size=(15, 3))
    assert retrieval_metrics(embeddings, labels) == {
        "precision_at_1": 1.0,
        "map_at_r": 1.0,
        "num_queries": 15,
    }
    # query 0 (class 0, R = 1) finds its match second: P@1 = 0, MAP@R = 0 (only rank 1 counts)
    line = np.array([[1.0, 0.0], [0.0, 1.0], [0.9, 0.1], [0.1, 0.9]])
    result = retrieval_metrics(line, np.array([0, 1, 1, 0]))
    assert result["precision_at_1"] == 0.0 and result["map_at_r"] == 0.0


@pytest.mark.parametrize(
    ("embeddings", "labels", "error", "match"),
    [
        (np.zeros((3, 2)), np.array([0, 1, 2]), ValueError, "two or more samples"),
        (np.zeros((1, 2)), np.array([0]), ValueError, "at least 2 row"),
        (np.zeros((3, 2)), np.array([0, 1]), ValueError, "labels must have length 3"),
        (np.zeros((3, 2)), np.array([0.0, 1.0, 1.0]), TypeError, "integer dtype"),
        (np.full((3, 2), np.nan), np.array([0, 1, 1]), ValueError, "non-finite"),
        (np.zeros(3), np.array([0, 1, 1]), ValueError, r"shape \(N, D\)"),
    ],
)
def test_bad_input(embeddings, labels, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        retrieval_metrics(embeddings, labels)
