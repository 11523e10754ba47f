"""The public L2 normalization the plots and the metrics share."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from marginface.evaluation import cosine_to_centers, l2_normalize


def test_rows_have_unit_norm_and_keep_their_direction():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(6, 4)) * rng.uniform(0.1, 50.0, size=(6, 1))
    unit = l2_normalize(x)
    assert unit.dtype == np.float64 and unit.shape == x.shape
    np.testing.assert_allclose(np.linalg.norm(unit, axis=1), 1.0, rtol=1e-12)
    np.testing.assert_allclose(unit * np.linalg.norm(x, axis=1, keepdims=True), x, rtol=1e-12)


def test_zero_row_stays_zero_and_tensors_are_accepted():
    x = torch.tensor([[3.0, 4.0], [0.0, 0.0]])
    np.testing.assert_allclose(l2_normalize(x), [[0.6, 0.8], [0.0, 0.0]], rtol=1e-7)


def test_agrees_with_cosine_to_centers():
    rng = np.random.default_rng(1)
    x, w = rng.normal(size=(5, 3)), rng.normal(size=(4, 3))
    np.testing.assert_allclose(l2_normalize(x) @ l2_normalize(w).T, cosine_to_centers(x, w))


@pytest.mark.parametrize(
    ("bad", "error", "match"),
    [
        (np.ones(3), ValueError, r"shape \(N, D\)"),
        (np.array([[1.0, np.nan]]), ValueError, "non-finite"),
        ("rows", TypeError, "torch.Tensor or a numpy.ndarray"),
        (np.array([["a", "b"]]), TypeError, "real numbers"),
    ],
)
def test_bad_input_is_named(bad, error, match):
    with pytest.raises(error, match=match):
        l2_normalize(bad)
