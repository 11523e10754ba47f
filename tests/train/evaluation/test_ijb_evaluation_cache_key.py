"""ijb_results with a cache and no cache_key keys the cache by the weights' fingerprint: the
same weights read it back, other weights embed again."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from marginface.data.ijb import read_ijb_layout
from marginface.train.evaluation.ijb_evaluation import ijb_results


class _Pooled(nn.Module):
    def __init__(self, seed: int) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        self.weight = nn.Parameter(torch.randn(3 * 7 * 7, 6, generator=generator))
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return nn.functional.avg_pool2d(x, 16).reshape(x.shape[0], -1) @ self.weight


def test_the_weights_key_the_cache_when_no_key_is_given(ijb_folder, tmp_path):
    layout = read_ijb_layout(ijb_folder[0], "IJBC")
    cache = tmp_path / "f.npz"
    first = _Pooled(0)
    result = ijb_results(first, layout, device="cpu", batch_size=32, cache=cache)
    assert first.calls == 2  # one batch, as it is and mirrored
    same = _Pooled(0)
    again = ijb_results(same, layout, device="cpu", batch_size=32, cache=cache)
    assert same.calls == 0  # read back
    assert again is not None and result is not None
    np.testing.assert_array_equal(again.scores, result.scores)
    other = _Pooled(1)
    ijb_results(other, layout, device="cpu", batch_size=32, cache=cache)
    assert other.calls == 2  # other weights: embedded again
