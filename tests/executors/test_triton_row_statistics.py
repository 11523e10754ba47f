"""The Triton kernel of the ``"above_threshold"`` row statistics (NPCFace's hard negatives,
:mod:`marginface.executors.triton_row_statistics`).

The kernel against the sums restated here in float64 (``S_i = Σ_{j≠y_i} [c_ij > τ_i] c_ij``,
``H_i = Σ_{j≠y_i} [c_ij > τ_i]``, ``c`` max-pooled over the sub-centers) over several tiles,
chunks and sub-centers, with rows whose target lies outside the classes, a threshold above every
cosine and one below; NPCFace's loss with the kernel against the PyTorch statistics pass, on the
custom operators and on the autograd Function (the sharded head's path), with and without a
Partial FC sample. Under Triton's interpreter on the CPU (``conftest.py``); compiled on CUDA.
"""

from __future__ import annotations

import copy
import importlib
from types import ModuleType

import pytest
import torch

import marginface
from marginface.executors.chunked import chunked_margin_cross_entropy, gemm_dtype
from marginface.executors.chunked_function import ChunkedMarginCrossEntropy

from ._compare import DEVICE, relative_error

pytest.importorskip("triton")

GAP = 1e-4
"""Smallest distance between a threshold and any cosine of its row in the kernel test, far
above the float32 (and bf16-input, float32-accumulated) error of a cosine, so that the strict
``>`` cannot flip between the kernel and the float64 reference."""


@pytest.fixture(scope="module")
def statistics(kernels: ModuleType) -> ModuleType:
    """The statistics kernel module (built as ``kernels`` is: compiled or interpreted)."""
    return importlib.import_module("marginface.executors.triton_row_statistics")


def _thresholds(cos: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per row, the midpoint between its 5th and 6th largest non-target cosines (rows 0 and 1:
    above and below every cosine)."""
    classes = cos.shape[1]
    mask = torch.zeros_like(cos, dtype=torch.bool)
    inside = (labels >= 0) & (labels < classes)
    mask[inside.nonzero().flatten(), labels[inside]] = True
    ranked = cos.masked_fill(mask, -torch.inf).sort(dim=1, descending=True).values
    threshold = (ranked[:, 4] + ranked[:, 5]) / 2
    threshold[0], threshold[1] = 1.5, -1.5
    return threshold


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("k", [1, 3])
def test_kernel_matches_the_sums_restated_in_float64(
    statistics: ModuleType, kernels: ModuleType, dtype: torch.dtype, k: int
) -> None:
    n, dim, classes, chunk = 37, 40, 70, 32  # 3 row blocks, 3 chunks (2 tiles each), 3 D blocks
    generator = torch.Generator().manual_seed(k)
    x_hat = torch.nn.functional.normalize(torch.randn(n, dim, generator=generator), dim=1)
    weight = torch.randn(classes * k, dim, generator=generator)
    x_hat, weight = x_hat.to(dtype), weight.to(dtype)
    inv_norms = 1.0 / weight.float().norm(dim=1)  # (C·K,) float32
    labels = torch.randint(0, classes, (n,), generator=generator)
    labels[2], labels[3], labels[4] = -1, classes + 3, classes - 1  # no target, no target, last
    pooled = x_hat.double() @ (weight.double() * inv_norms.double().unsqueeze(1)).t()  # (N, C·K)
    cos = pooled.view(n, classes, k).amax(dim=2)  # (N, C), float64
    threshold = _thresholds(cos, labels)
    mask = torch.zeros_like(cos, dtype=torch.bool)
    inside = (labels >= 0) & (labels < classes)
    mask[inside.nonzero().flatten(), labels[inside]] = True
    distance = (cos - threshold[:, None]).abs().masked_fill(mask, torch.inf)
    assert distance.min() > GAP  # the test's own precondition: no cosine at a threshold
    hard = (cos > threshold[:, None]) & ~mask
    expected = torch.stack([torch.where(hard, cos, 0.0).sum(dim=1), hard.double().sum(dim=1)])
    assert expected[1, 0] == 0 and expected[1, 1] == classes - 1  # τ above / below everything
    assert (expected[1, 2:] == 5).all()  # the other rows: 5 above the midpoint

    sums = statistics.above_threshold_sums(
        x_hat.to(DEVICE), weight.to(DEVICE), inv_norms.to(DEVICE), labels.to(DEVICE),
        threshold.to(DEVICE), sub_centers=k, chunk_size=chunk,
        blocks=kernels.Blocks(n=16, c=16, d=16),
    )  # fmt: skip
    assert sums.shape == (2, n) and sums.dtype == torch.float32
    assert torch.equal(sums[1].cpu().double(), expected[1])  # counts exact
    assert (sums[0].cpu().double() - expected[0]).abs().max() <= 1e-5


def test_threshold_shape_is_checked(statistics: ModuleType) -> None:
    x_hat, weight = torch.randn(4, 16, device=DEVICE), torch.randn(6, 16, device=DEVICE)
    labels = torch.zeros(4, dtype=torch.long, device=DEVICE)
    with pytest.raises(ValueError, match=r"threshold must have shape \(4,\), got \(4, 1\)"):
        statistics.above_threshold_sums(
            x_hat, weight, torch.ones(6, device=DEVICE), labels, torch.zeros(4, 1, device=DEVICE),
            sub_centers=1, chunk_size=8,
        )  # fmt: skip


N, C, D, CHUNK = 24, 80, 32, 32


def _case(seed: int = 0):
    loss = marginface.create_loss("npcface", C, D, scale=30.0)
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(N, D, generator=generator) * 8
    weight = torch.randn(C, D, generator=generator)
    labels = torch.randint(0, C, (N,), generator=generator)
    upstream = torch.rand(N, generator=generator)
    return loss.margin.to(DEVICE), x.to(DEVICE), weight.to(DEVICE), labels.to(DEVICE), upstream


def _run(path: str, kernels: str, margin, x, weight, labels, upstream, sample=None):
    """``(loss, ∂x, ∂W)`` of NPCFace on the custom operators (``"fused"``) or the autograd
    Function (``"function"``), ``kernels`` ``"triton"`` or ``"torch"``."""
    x = x.clone().requires_grad_(True)
    weight = weight.clone().requires_grad_(True)
    if path == "fused":
        loss = chunked_margin_cross_entropy(
            x, weight, labels, margin, chunk_size=CHUNK, kernels=kernels, sampled_classes=sample
        )
    else:
        loss = ChunkedMarginCrossEntropy.apply(
            x, weight, labels, labels, margin, 1, CHUNK, gemm_dtype(x, weight),
            kernels == "triton", None, sample, None, (True, True), (), None,
        )  # fmt: skip
    (loss * upstream.to(loss.device)).sum().backward()
    return loss.detach(), x.grad, weight.grad


@pytest.mark.parametrize("sampled", [False, True])
@pytest.mark.parametrize("path", ["fused", "function"])
def test_npcface_on_the_kernel_matches_the_torch_statistics_pass(
    statistics: ModuleType, monkeypatch: pytest.MonkeyPatch, path: str, sampled: bool
) -> None:
    """Two steps of NPCFace (its hard-negative statistics moving with the embeddings), the
    statistics kernel launched once per step (per chunk of a sample), against PyTorch ops."""
    calls = []
    original = statistics.above_threshold_sums
    monkeypatch.setattr(
        statistics, "above_threshold_sums", lambda *a, **kw: calls.append(1) or original(*a, **kw)
    )
    margin, x, weight, labels, upstream = _case()
    sample = None
    if sampled:  # Partial FC: the batch's classes and 30 others, labels as sample positions
        sample = torch.unique(torch.cat([labels, torch.randperm(C)[:30].to(DEVICE)]))
        labels = torch.searchsorted(sample, labels)
    torch_margin, triton_margin = margin, copy.deepcopy(margin)
    for step in range(2):
        expected = _run(path, "torch", torch_margin, x, weight, labels, upstream, sample)
        before = len(calls)
        actual = _run(path, "triton", triton_margin, x, weight, labels, upstream, sample)
        launches = -(-len(sample) // CHUNK) if sampled else 1
        assert len(calls) - before == launches
        for what, a, e in zip(("loss", "∂x", "∂W"), actual, expected, strict=True):
            assert relative_error(a, e) <= 1e-5, (step, what, relative_error(a, e))
        x = x - 0.5 * actual[1]
