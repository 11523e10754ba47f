"""A step on the Triton kernels (the GPU's default path) reads no tensor value back to the host
once the value checks are off (``marginface._validation.set_value_checks``), so that on a GPU
the host can queue a step while the device runs the previous one; with them on, it reads once
(the batch's joint check). The softmax and the one-vs-all kernels (which read the learned bias
on the device), float32 and bfloat16."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

import marginface
from marginface._validation import set_value_checks
from tests._host_reads import counted_reads

from ._compare import DEVICE

pytest.importorskip("triton")


@pytest.mark.parametrize("name", ["arcface", "sphereface2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_no_read_without_value_checks(name: str, dtype: torch.dtype, launches: Counter) -> None:
    torch.manual_seed(0)
    head = marginface.create_loss(
        name, num_classes=70, embedding_dim=16, impl="chunked", kernels="triton",
        chunk_size=32, dtype=dtype, device=DEVICE,
    )  # fmt: skip
    x = torch.randn(6, 16, device=DEVICE).to(dtype).requires_grad_(True)
    labels = torch.tensor([0, 69, 5, 5, 40, 33], device=DEVICE)
    with counted_reads() as checked:
        head(x, labels).backward()
    assert checked == ["tolist"]
    previous = set_value_checks(False)
    try:
        with counted_reads() as unchecked:
            head(x, labels).backward()
    finally:
        set_value_checks(previous)
    assert unchecked == []
    assert sum(launches.values()) > 0  # the step did run on the kernels
