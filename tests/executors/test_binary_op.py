"""executors/fused_op.py's BINARY_OPS: the one-vs-all custom operator's gradients when only one of
its outputs is used (the other's incoming gradient is None), against the formula restated on the
dense cosines; and its fake implementation's shapes (what ``torch.compile`` traces)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from marginface.executors.chunk_loop import target_cosines
from marginface.executors.fused_op import BINARY_OPS

_sums_call, _sums_fake = BINARY_OPS.call, BINARY_OPS.fake

N, C, D, CHUNK = 6, 9, 5, 4  # N != D: a row count taken from the wrong dimension fails
S, POWER, OFFSET, SIGN = 12.0, 2.0, 0.3, -1.0


def _inputs():
    generator = torch.Generator().manual_seed(3)
    x_hat = F.normalize(torch.randn(N, D, generator=generator, dtype=torch.float64), dim=1)
    weight = torch.randn(C, D, generator=generator, dtype=torch.float64)
    labels = torch.randint(0, C, (N,), generator=generator)
    bias = torch.tensor(0.7, dtype=torch.float64)
    return x_hat, weight, labels, bias


def _op(x_hat, weight, labels, bias):
    cos_raw, target_rows = target_cosines(x_hat.detach(), weight.detach(), labels, 1, None)
    sums, cos_target, _ = _sums_call(
        x_hat, weight, labels, target_rows, cos_raw, bias, S, POWER, OFFSET, SIGN, 0.0, False,
        1, CHUNK, "torch", None, compiled=False,
    )  # fmt: skip
    return sums, cos_target


def _reference(x_hat, weight, labels, bias):
    cos = x_hat @ F.normalize(weight, dim=1).t()  # (N, C)
    u = ((cos + 1.0) * 0.5).clamp_min(0.0)
    z = S * (2.0 * u.pow(POWER) - 1.0 + OFFSET) + SIGN * bias
    one_hot = F.one_hot(labels, C).bool()
    sums = torch.where(one_hot, 0.0, F.softplus(z, threshold=1000)).sum(dim=1)
    return sums, cos[one_hot]


@pytest.mark.parametrize("output", ["sums", "cos_target"])
def test_each_output_alone_has_the_formulas_gradient(output):
    upstream = torch.linspace(0.5, 1.5, N, dtype=torch.float64)
    results = []
    for function in (_op, _reference):
        x_hat, weight, labels, bias = (t.clone() for t in _inputs())
        leaves = [x_hat.requires_grad_(True), weight.requires_grad_(True)]
        if output == "sums":
            leaves.append(bias.requires_grad_(True))
        sums, cos_target = function(x_hat, weight, labels, bias)
        used = sums if output == "sums" else cos_target
        results.append(torch.autograd.grad((used * upstream).sum(), leaves))
    for ours, expected in zip(*results, strict=True):
        torch.testing.assert_close(ours, expected, rtol=1e-10, atol=1e-12)


def test_the_fake_implementation_has_the_outputs_shapes():
    x_hat, weight, labels, bias = _inputs()
    cos_raw, target_rows = target_cosines(x_hat, weight, labels, 1, None)
    args = (x_hat, weight, labels, target_rows, cos_raw, bias, S, POWER, OFFSET, SIGN, 0.0)
    real = _sums_call(*args, False, 1, CHUNK, "torch", None, compiled=False)
    fake = _sums_fake(*args, False, 1, CHUNK, "torch", None)
    assert [tuple(t.shape) for t in fake] == [tuple(t.shape) for t in real]
    assert [t.dtype for t in fake] == [t.dtype for t in real]
    sample = torch.tensor([0, 2, 3, 7])
    fake = _sums_fake(*args, False, 1, CHUNK, "torch", sample)
    assert [tuple(t.shape) for t in fake] == [(N,), (N,), (4,)]
