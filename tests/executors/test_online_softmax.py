"""Partial log-sum-exp statistics: exact, mergeable in any order (the shape of an all-reduce)."""

from __future__ import annotations

import torch

from marginface.executors._online_softmax import (
    add_shifted_slice,
    empty_statistics,
    finish_log_sum_exp,
    merge_statistics,
    slice_statistics,
)


def _stats(z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return slice_statistics(z.clone())


def test_merged_slices_equal_logsumexp_in_any_order() -> None:
    z = torch.randn(6, 50, dtype=torch.float64) * 40  # logits of scale ~ s = 64
    extra = torch.randn(6, dtype=torch.float64) * 40
    parts = [_stats(z[:, i : i + 7]) for i in range(0, 50, 7)]
    forward = empty_statistics(6, dtype=torch.float64, device=z.device)
    for part in parts:
        forward = merge_statistics(forward, part)
    backward = parts[-1]
    for part in reversed(parts[:-1]):
        backward = merge_statistics(part, backward)
    expected = torch.logsumexp(torch.cat([z, extra[:, None]], dim=1), dim=1)
    for merged in (forward, backward):
        torch.testing.assert_close(finish_log_sum_exp(merged, extra), expected, rtol=1e-14, atol=0)


def test_all_excluded_slice_is_the_identity() -> None:
    z = torch.randn(3, 4, dtype=torch.float64)
    excluded = torch.full((3, 2), float("-inf"), dtype=torch.float64)
    empty = _stats(excluded)
    assert torch.isneginf(empty[0]).all() and (empty[1] == 0).all()
    merged = merge_statistics(empty, _stats(z))
    torch.testing.assert_close(merged[0] + merged[1].log(), torch.logsumexp(z, dim=1))
    only_extra = finish_log_sum_exp(empty, torch.ones(3, dtype=torch.float64))
    torch.testing.assert_close(only_extra, torch.ones(3, dtype=torch.float64))


def test_shifted_slice_is_exact_and_reports_overflow() -> None:
    first = torch.tensor([[0.0, 60.0, -60.0]])
    second = torch.tensor([[50.0, -100.0, 10.0]])
    stats = _stats(first)
    added = add_shifted_slice(stats, second - stats[0][:, None])
    assert added is not None
    expected = torch.logsumexp(torch.cat([first, second], dim=1), dim=1)
    torch.testing.assert_close(added[0] + added[1].log(), expected, rtol=1e-6, atol=0)
    too_big = torch.tensor([[60.0 + 200.0]])  # exp(200) overflows float32
    assert add_shifted_slice(stats, too_big - stats[0][:, None]) is None
