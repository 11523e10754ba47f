"""head/centers.py: the class centers' shape and draw, their cosines (max-pooled over
sub-centers, restated by hand), and the refusal to shard without torch.distributed (the
sharded signature check runs under torchrun in tests/distributed/test_sharded_head.py)."""

from __future__ import annotations

import math

import pytest
import torch

import marginface
from marginface.head.centers import (
    CENTER_STD,
    center_cosine,
    create_shard,
    new_centers,
    reset_centers,
)


def test_new_centers_are_class_major_rows_of_the_given_dtype():
    weight = new_centers(5, 3, 4, device=None, dtype=torch.float64)
    assert isinstance(weight, torch.nn.Parameter) and weight.requires_grad
    assert tuple(weight.shape) == (15, 4) and weight.dtype == torch.float64


def test_reset_centers_draws_a_normal_of_the_centers_std():
    torch.manual_seed(0)
    weight = new_centers(2000, 1, 50, device=None, dtype=torch.float64)
    reset_centers(weight.data)
    values = weight.detach().reshape(-1)
    assert abs(float(values.mean())) < 5 * CENTER_STD / math.sqrt(values.numel())  # 5σ of the mean
    assert abs(float(values.std()) / CENTER_STD - 1) < 0.01  # 100k draws: ±0.5 % at 2σ
    assert CENTER_STD == 0.01


def _cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


@pytest.mark.parametrize("k", [1, 3])
def test_center_cosine_is_the_best_sub_center_by_hand(k):
    generator = torch.Generator().manual_seed(k)
    x = torch.randn(4, 6, generator=generator, dtype=torch.float64)
    weight = torch.randn(5 * k, 6, generator=generator, dtype=torch.float64)
    got = center_cosine(x, weight, k)
    assert tuple(got.shape) == (4, 5) and got.dtype == torch.float64
    for i, row in enumerate(x.tolist()):
        for j in range(5):
            best = max(_cosine(row, weight[j * k + s].tolist()) for s in range(k))
            assert abs(float(got[i, j]) - best) < 1e-12


def test_center_cosine_runs_in_float32_for_half_inputs_even_under_autocast():
    x = torch.randn(3, 8).to(torch.bfloat16)
    weight = torch.randn(4, 8).to(torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = center_cosine(x, weight, 1)
    assert got.dtype == torch.float32
    expected = (
        torch.nn.functional.normalize(x.float(), dim=1)
        @ torch.nn.functional.normalize(weight.float(), dim=1).T
    )
    torch.testing.assert_close(got, expected)


def test_a_process_group_without_torch_distributed_is_a_clear_error():
    with pytest.raises(ValueError, match="torch.distributed is not initialized"):
        marginface.ArcFaceLoss(10, 3, process_group=object())
    with pytest.raises(ValueError, match="process_group=None"):
        create_shard(object(), 10, ())
