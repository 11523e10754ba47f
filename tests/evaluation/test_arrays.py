"""evaluation/arrays.py: tensors or arrays in, NumPy out, and each bad value named."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from marginface.evaluation.arrays import (
    as_bool_vector,
    as_embeddings,
    as_float_vector,
    as_int_vector,
    to_numpy,
)


def test_to_numpy_detaches_tensors_widens_half_and_keeps_arrays():
    grad = torch.ones(2, requires_grad=True)
    assert to_numpy("x", grad * 2).tolist() == [2.0, 2.0]
    assert to_numpy("x", torch.ones(2, dtype=torch.bfloat16)).dtype == np.float32
    array = np.zeros(3)
    assert to_numpy("x", array) is array
    assert to_numpy("x", [1, 2]).tolist() == [1, 2]
    with pytest.raises(TypeError, match="scores must be a torch.Tensor or a numpy.ndarray, got"):
        to_numpy("scores", "0.5")


def test_as_embeddings_is_float64_and_names_each_fault():
    out = as_embeddings("probes", np.ones((2, 3), np.float32))
    assert out.dtype == np.float64 and out.shape == (2, 3)
    with pytest.raises(ValueError, match=r"probes must have shape \(N, D\), got \(3,\)"):
        as_embeddings("probes", np.ones(3))
    with pytest.raises(ValueError, match=r"at least 2 row\(s\), got shape \(1, 3\)"):
        as_embeddings("probes", np.ones((1, 3)), min_rows=2)
    bad = np.ones((3, 2))
    bad[1, 0] = np.nan
    with pytest.raises(ValueError, match=r"probes contains non-finite .* in 1 row"):
        as_embeddings("probes", bad)
    with pytest.raises(TypeError, match="probes must hold real numbers, got dtype <U1"):
        as_embeddings("probes", np.array([["a"]]))


def test_vectors_check_dtype_shape_length_and_values():
    assert as_float_vector("s", [1, 2]).dtype == np.float64
    with pytest.raises(TypeError, match="s must hold real numbers, got dtype bool"):
        as_float_vector("s", np.array([True]))
    with pytest.raises(ValueError, match="s must have length 3, got 2"):
        as_float_vector("s", [1.0, 2.0], length=3)
    with pytest.raises(ValueError, match="s contains non-finite"):
        as_float_vector("s", [1.0, np.inf])
    assert as_int_vector("ids", np.array([3, 1], np.int32)).dtype == np.int64
    with pytest.raises(TypeError, match="ids must have an integer dtype, got float64"):
        as_int_vector("ids", [1.0])
    with pytest.raises(ValueError, match=r"ids must have shape \(N,\), got \(1, 1\)"):
        as_int_vector("ids", [[1]])
    assert as_bool_vector("same", [1, 0, 1]).tolist() == [True, False, True]
    with pytest.raises(ValueError, match="same must hold only 0 and 1 .* got 2"):
        as_bool_vector("same", [0, 2])
    with pytest.raises(TypeError, match="same must be boolean .* got dtype float64"):
        as_bool_vector("same", [0.0, 1.0])
