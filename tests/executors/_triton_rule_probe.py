"""A test-only Triton kernel that evaluates the chunked kernels' non-target rule
(``triton_rules._nontarget``) on a tile of given cosines and stores ``g(c)`` and ``g'(c)``,
so that ``tests/executors/test_triton_rules.py`` can check each rule entry by entry.

Imported only after the ``kernels`` fixture (tests/executors/conftest.py) has imported the kernel
module, i.e. under ``TRITON_INTERPRET=1`` on a machine without CUDA.
"""

# ruff: noqa: N803

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from marginface.executors.kernel_options import NonTargetRule
from marginface.executors.triton_kernels import _row_vectors
from marginface.executors.triton_rules import _nontarget


@triton.jit
def _rule_probe_kernel(
    cos_ptr,
    label_ptr,
    scale_ptr,
    threshold_ptr,
    t_ptr,
    const_ptr,
    value_ptr,
    slope_ptr,
    rows_total,
    cols_total,
    RULE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    rows = tl.arange(0, BLOCK_N)
    cols = tl.arange(0, BLOCK_C)
    row_ok = rows < rows_total
    where = rows[:, None] * cols_total + cols[None, :]
    ok = row_ok[:, None] & (cols[None, :] < cols_total)
    cos = tl.load(cos_ptr + where, mask=ok, other=0.0)
    threshold = tl.load(threshold_ptr + rows, mask=row_ok, other=2.0)
    t = tl.load(t_ptr + rows, mask=row_ok, other=0.0)
    p0 = tl.load(const_ptr)
    p1 = tl.load(const_ptr + 1)
    value, slope = _nontarget(cos, threshold, t, p0, p1, RULE)
    tl.store(value_ptr + where, value, mask=ok)
    tl.store(slope_ptr + where, slope, mask=ok)


def evaluate_rule(cosine: Tensor, rule: NonTargetRule) -> tuple[Tensor, Tensor]:
    """``(g(c), g'(c))`` of the kernels' ``rule`` on ``cosine`` (``Tensor[N, c]`` float32,
    ``N, c <= 64``), as the chunked kernels compute them."""
    n, c = cosine.shape
    labels = torch.zeros(n, dtype=torch.int64, device=cosine.device)
    scale = torch.ones(n, dtype=torch.float32, device=cosine.device)
    labels, scale, threshold, t, constants = _row_vectors(labels, scale, rule)
    value = torch.empty_like(cosine)
    slope = torch.empty_like(cosine)
    block_n = triton.next_power_of_2(max(n, 16))
    block_c = triton.next_power_of_2(max(c, 16))
    _rule_probe_kernel[(1,)](
        cosine.contiguous(), labels, scale, threshold, t, constants, value, slope, n, c,
        RULE=rule.name, BLOCK_N=block_n, BLOCK_C=block_c,
    )  # fmt: skip
    return value, slope
