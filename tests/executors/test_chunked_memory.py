"""What keeps the chunked executor's memory small (docs/fused.md "Memory"): one workspace per
pass instead of one allocation per chunk, a default chunk bounded in bytes, no sympy import."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

import marginface
from marginface.executors.chunked import (
    DEFAULT_CHUNK_BYTES,
    MIN_DEFAULT_CHUNK,
    PROJECTION_BLOCK,
    default_chunk_size,
)


def test_default_chunk_size_bounds_the_bytes_of_a_chunk() -> None:
    assert default_chunk_size(512) == 8192
    assert default_chunk_size(4096) == 1024
    assert default_chunk_size(512, sub_centers=4) == 2048
    assert default_chunk_size(512, bytes_per_logit=6) == 5461  # a bf16 weight
    assert default_chunk_size(1) == DEFAULT_CHUNK_BYTES // 4
    assert default_chunk_size(10**7) == MIN_DEFAULT_CHUNK
    for rows in (1, 7, 512, 3000, 32768):  # above, the 64-class minimum exceeds the bound
        for per_logit in (4, 6, 8):
            assert rows * default_chunk_size(rows, 1, per_logit) * per_logit <= DEFAULT_CHUNK_BYTES


def test_the_default_chunk_counts_a_partial_fc_samples_rows() -> None:
    """A Partial FC sample holds each chunk's gathered weight rows and their gradient, ``2·D``
    values per class besides its logits: float32, N = D = 512, 2730 classes instead of 8192
    (a bf16 weight: 2·512·2 bytes per class beside a bf16 GEMM's 6 bytes per logit, 3276
    instead of 5461); an explicit chunk size wins. ``x`` is in the compute dtype, float32."""
    from marginface.executors.chunk_plan import chunk_size_for

    for dtype, plain, sampled in ((torch.float32, 8192, 2730), (torch.bfloat16, 5461, 3276)):
        x = torch.zeros(512, 512)
        weight = torch.zeros(10_000, 512, dtype=dtype)
        sample = torch.arange(100)
        assert chunk_size_for(x, weight, 1, None, None) == plain, dtype
        assert chunk_size_for(x, weight, 1, sample, None) == sampled, dtype
        assert chunk_size_for(x, weight, 1, sample, 64) == 64


def allocations(dtype: torch.dtype, n: int, d: int, c: int, chunk: int) -> list[int]:
    """Bytes of every tensor allocated during the second training step (ArcFace)."""
    head = marginface.create_loss("arcface", c, d, impl="chunked", chunk_size=chunk, dtype=dtype)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(n, d, generator=generator).to(dtype).requires_grad_(True)
    labels = torch.randint(0, c, (n,), generator=generator)
    head(x, labels).backward()
    head.zero_grad(set_to_none=True)
    x.grad = None
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        head(x, labels).backward()
    leaves = ("aten::empty", "aten::empty_strided")  # empty_like etc. report their child too
    return [e.cpu_memory_usage for e in prof.events() if e.name in leaves]


@pytest.mark.parametrize(
    ("dtype", "expected"),
    [
        (torch.float32, 2),  # one float32 workspace per pass (forward, backward)
        (torch.bfloat16, 5),  # float32: weight norms, forward, backward; bf16: forward, backward
    ],
)
def test_the_chunk_loop_allocates_its_logits_once_per_pass(
    dtype: torch.dtype, expected: int
) -> None:
    n, d, c, chunk = 64, 16, 1000, 100  # 10 chunks
    sizes = allocations(dtype, n, d, c, chunk)
    weight_bytes = c * d * dtype.itemsize
    assert weight_bytes in sizes  # the weight's gradient, allocated once
    workspace = [s for s in sizes if s != weight_bytes and s >= n * chunk * dtype.itemsize]
    assert len(workspace) == expected, sizes
    assert max(workspace) <= n * chunk * 4
    others = [s for s in sizes if s != weight_bytes and s not in workspace]
    assert max(others) <= PROJECTION_BLOCK * d * 4  # nothing else of size N×chunk


def test_backward_does_not_import_sympy() -> None:
    """torch.autograd.grad with grad_outputs imports sympy (~35 MB resident); every loss's
    chunked backward gets by without it."""
    code = (
        "import sys, torch, marginface\n"
        "for name in marginface.list_losses():\n"
        "    options = {'seed': 0} if name == 'elasticface' else {}\n"
        "    head = marginface.create_loss(name, 50, 8, impl='chunked', chunk_size=16, **options)\n"
        "    x = (torch.randn(6, 8) * 8).requires_grad_(True)\n"
        "    head(x, torch.randint(0, 50, (6,))).backward()\n"
        "    assert 'sympy' not in sys.modules, name\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_row_dot_equals_the_row_sums_of_the_product(dtype: torch.dtype) -> None:
    """``_row_dot``: blocks of ROW_DOT_BLOCK rows in half precision (a partial last block
    included), one batched GEMM in float32; both the row sums of the float64 product."""
    from marginface.executors.chunk_workspace import ROW_DOT_BLOCK, _row_dot

    rows = 2 * ROW_DOT_BLOCK + 37
    a, b = torch.randn(rows, 64).to(dtype), torch.randn(rows, 64).to(dtype)
    expected = (a.double() * b.double()).sum(1)
    got = _row_dot(a, b)
    assert got.dtype == dtype and got.shape == (rows,)
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2  # bf16: the result's own rounding
    torch.testing.assert_close(got.double(), expected, rtol=tolerance, atol=tolerance * 8)
