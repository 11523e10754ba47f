"""MV-AM-Softmax's ``conditional="easy"`` (SV-X-Softmax's easy margin) on the Triton kernels:
the target is computed in PyTorch around the kernels' ``"mv"`` rule, so the option reaches them
unchanged; two training steps against the dense path (CUDA, or Triton's interpreter on CPU)."""

from __future__ import annotations

import copy
from collections import Counter

import pytest
import torch

from ._compare import backward_launcher, relative_error
from .test_triton import make_case, run


@pytest.mark.parametrize("options", [{"conditional": "easy"}, {"conditional": "easy", "t": 0.3}])
def test_the_easy_margin_on_the_kernels_matches_dense(options: dict, launches: Counter) -> None:
    margin, k, x, weight, labels, upstream = make_case("mv-am-softmax", torch.float32, **options)
    assert margin.conditional == "easy"
    dense_margin, triton_margin = margin, copy.deepcopy(margin)
    for step in range(2):
        expected = run("dense", dense_margin, k, x, weight, labels, upstream)
        actual = run("triton", triton_margin, k, x, weight, labels, upstream)
        for what, a, e in zip(("loss", "∂x", "∂W"), actual, expected, strict=True):
            assert relative_error(a, e) <= 1e-5, (step, what, relative_error(a, e))
        x = x - 0.5 * actual[1]
    assert launches[backward_launcher()] == 2
