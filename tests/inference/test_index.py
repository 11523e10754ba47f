"""TemplateIndex: FAISS's exact index equals a NumPy matmul's ranking; the approximate ones
report their recall against it; without FAISS, exact search in torch."""

from __future__ import annotations

import numpy as np
import pytest

from marginface.inference.index import TemplateIndex, exact_search, have_faiss

needs_faiss = pytest.mark.skipif(not have_faiss(), reason="faiss-cpu (the search extra)")


def _unit(count: int, dim: int = 32, seed: int = 0) -> np.ndarray:
    rows = np.random.default_rng(seed).normal(size=(count, dim)).astype(np.float32)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def _numpy_top(templates, queries, k):
    """The definition restated: inner products in float64, sorted."""
    scores = queries.astype(np.float64) @ templates.astype(np.float64).T
    order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(scores, order, axis=1), order


@pytest.mark.parametrize("use_faiss", [False, pytest.param(True, marks=needs_faiss)])
def test_exact_search_is_the_matmul_ranking(use_faiss):
    templates, queries = _unit(500), _unit(40, seed=1)
    index = TemplateIndex(templates, kind="exact", use_faiss=use_faiss)
    assert index.backend == ("faiss" if use_faiss else "torch") and index.recall_at_10 is None
    scores, indices = index.search(queries, 7)
    expected_scores, expected = _numpy_top(templates, queries, 7)
    # float32 dot products of unit 32-D vectors: error <= 32 * 2^-24 per term; ties are absent
    np.testing.assert_allclose(scores, expected_scores, atol=32 * 2.0**-23)
    np.testing.assert_array_equal(indices, expected)


@needs_faiss
@pytest.mark.parametrize("kind", ["hnsw", "ivf"])
def test_approximate_indexes_measure_their_recall(kind):
    templates = _unit(3000)
    index = TemplateIndex(templates, kind=kind, sample=200)
    assert index.kind == kind and index.recall_at_10 is not None
    assert 0.8 <= index.recall_at_10 <= 1.0
    queries = templates[:50] + 0.01 * _unit(50, seed=2)
    _, indices = index.search(queries, 1)
    assert np.mean(indices[:, 0] == np.arange(50)) >= 0.9  # near-copies find their source


@needs_faiss
def test_auto_is_exact_up_to_the_size_then_hnsw():
    templates = _unit(300)
    assert TemplateIndex(templates, approximate_above=300).kind == "exact"
    assert TemplateIndex(templates, approximate_above=299, sample=50).kind == "hnsw"


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match=r"kind must be one of auto, exact, hnsw, ivf, got 'lsh'"):
        TemplateIndex(_unit(5), kind="lsh")
    with pytest.raises(ValueError, match=r"templates must be a non-empty \(G, D\) array"):
        TemplateIndex(np.empty((0, 4), np.float32))
    with pytest.raises(ValueError, match=r"an approximate index \(hnsw\) needs FAISS"):
        TemplateIndex(_unit(5), kind="hnsw", use_faiss=False)
    index = TemplateIndex(_unit(5), use_faiss=False)
    with pytest.raises(ValueError, match=r"k must be an int >= 1, got 0"):
        index.search(_unit(1), 0)
    with pytest.raises(ValueError, match=r"queries must be \(Q, 32\), got shape \(1, 8\)"):
        index.search(_unit(1, dim=8), 1)
    assert index.search(_unit(2), 50)[1].shape == (2, 5)  # k cut to the gallery's size
    assert exact_search(_unit(5), np.empty((0, 32), np.float32), 3)[0].shape == (0, 3)
