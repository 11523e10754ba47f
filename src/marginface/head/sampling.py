"""Partial FC: the classes one training step computes with (insightface's sampling rule).

A step keeps every class that is a positive anywhere in the (global) batch plus uniformly drawn
negatives, ``⌊sample_rate·c⌋`` classes in all from this process's ``c`` classes; the executors
read the sampled rows of the class centers in place, chunk by chunk.
"""

from __future__ import annotations

import torch
from torch import Tensor


def classes_of_step(
    labels: Tensor, class_range: tuple[int, int], sample_rate: float, device: torch.device
) -> tuple[Tensor, Tensor | None]:
    """Each row's target among the classes this step computes with, and those classes.

    Args:
        labels: ``int64[N]``, global class indices in ``[0, C)``.
        class_range: ``(start, stop)``, the classes this process holds.
        sample_rate: Partial FC's rate in ``(0, 1]``; ``>= 1`` (or a head in eval mode, which
            passes 1.0) keeps every local class.
        device: where the class centers live (the sample is drawn there).

    Returns:
        ``(targets, sampled)``: ``targets`` is ``int64[N]``, each row's local class (``-1``
        where another rank owns it); ``sampled`` is None (every local class) or ``int64[S]``,
        the sorted local class indices of the sample, and ``targets`` are then positions in it.
    """
    start, stop = class_range
    local = labels - start  # (N,)
    owned = (labels >= start) & (labels < stop)
    if sample_rate >= 1.0:
        return torch.where(owned, local, torch.full_like(local, -1)), None
    count = stop - start
    positive = torch.zeros(count, dtype=torch.bool, device=device)
    positive[local[owned].to(positive.device)] = True
    keep = int(sample_rate * count)
    if int(positive.sum()) >= keep:
        selected = positive.nonzero().squeeze(1)  # (S,)
    else:
        score = torch.rand(count, device=device)
        score[positive] = 2.0  # positives first, then uniformly drawn negatives
        selected = score.topk(keep).indices.sort().values  # (S,)
    position = torch.searchsorted(selected, local.clamp(0, max(count - 1, 0)).to(selected))
    targets = torch.where(owned, position.to(local.device), torch.full_like(local, -1))
    return targets, selected


def sampled_centers(weight: Tensor, sampled: Tensor | None, sub_centers: int) -> Tensor:
    """The centers of Partial FC's sample, ``Tensor[S·K, D]`` (a copy: the dense executor's),
    or ``weight`` itself when ``sampled`` is None (every class)."""
    if sampled is None:
        return weight
    d = weight.shape[1]
    return weight.view(-1, sub_centers, d)[sampled].reshape(-1, d)  # (S·K, D)
