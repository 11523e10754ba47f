"""Open-set retrieval: leave-one-out precision@1 and MAP@R over cosine similarity."""

from __future__ import annotations

import numpy as np
import torch

from .._validation import check_int
from .arrays import ArrayLike, as_embeddings, as_int_vector
from .closed_set import _normalize

__all__ = ["retrieval_metrics"]


def _top_neighbours(sims: torch.Tensor, k: int) -> torch.Tensor:
    """Column indices of the ``k`` largest entries of each row, by decreasing value and, among
    equal values, increasing index: the first ``k`` of a stable descending sort.

    ``torch.topk`` (fast) picks the candidates; rows where a tie straddles the k-th place (topk
    may have kept a later index) fall back to the full stable sort.

    Args:
        sims: ``Tensor[B, N]``; k: ``1 <= k <= N``.

    Returns:
        ``int64[B, k]``.
    """
    values, index = torch.topk(sims, k, dim=1)  # (B, k), unspecified order among ties
    by_index = torch.argsort(index, dim=1)
    index, values = index.gather(1, by_index), values.gather(1, by_index)
    by_value = torch.sort(values, dim=1, descending=True, stable=True).indices
    index = index.gather(1, by_value)  # (B, k)
    kth = values.amin(dim=1, keepdim=True)  # (B, 1)
    straddles = (sims == kth).sum(dim=1) > (values == kth).sum(dim=1)  # (B,)
    if bool(straddles.any()):
        rows = torch.nonzero(straddles).squeeze(1)
        full = torch.sort(sims[rows], dim=1, descending=True, stable=True).indices[:, :k]
        index[rows] = full
    return index


def retrieval_metrics(
    embeddings: ArrayLike, labels: ArrayLike, *, chunk_size: int = 1024
) -> dict[str, float | int]:
    r"""Leave-one-out retrieval: every sample queries all the others, ranked by cosine.

    For a query ``q`` with ``R_q`` other samples of its class and neighbours ranked by decreasing
    cosine (ties by increasing index):

    .. math::
        \text{P@1}_q = \text{rel}_q(1),\qquad
        \text{MAP@R}_q = \frac{1}{R_q}\sum_{i=1}^{R_q} \text{rel}_q(i)\,
                         \frac{\sum_{k \le i}\text{rel}_q(k)}{i}

    (Musgrave et al., "A Metric Learning Reality Check", 2020), where ``rel_q(i)`` is 1 if the
    ``i``-th neighbour has the query's label. Both are averaged over the queries with
    ``R_q >= 1``; samples alone in their class only serve as distractors.

    Args:
        embeddings: ``[N, D]`` (tensor or array; normalized here).
        labels: ``int[N]`` identity labels.
        chunk_size: queries ranked at once (memory ``chunk_size × N``). Default: 1024.

    Returns:
        ``{"precision_at_1": float, "map_at_r": float, "num_queries": int}``.
    """
    x = torch.from_numpy(_normalize(as_embeddings("embeddings", embeddings, min_rows=2)))
    y_np = as_int_vector("labels", labels, length=x.shape[0])
    chunk = check_int("chunk_size", chunk_size, minimum=1)
    y = torch.from_numpy(y_np)
    _, inverse, counts = np.unique(y_np, return_inverse=True, return_counts=True)
    r_all = torch.from_numpy(counts[inverse] - 1)  # (N,) other samples of the same class
    queries = torch.nonzero(r_all > 0).squeeze(1)
    if queries.numel() == 0:
        raise ValueError("labels must have at least one class with two or more samples")
    precision_sum, map_sum = 0.0, 0.0
    for start in range(0, queries.numel(), chunk):
        rows = queries[start : start + chunk]  # (B,)
        sims = x[rows] @ x.T  # (B, N)
        sims[torch.arange(rows.numel()), rows] = -torch.inf  # leave the query out
        r = r_all[rows]  # (B,)
        max_r = int(r.max())
        ranked = _top_neighbours(sims, max_r)  # (B, max_r)
        relevant = (y[ranked] == y[rows].unsqueeze(1)).double()  # (B, max_r)
        precision_sum += float(relevant[:, 0].sum())
        ranks = torch.arange(1, max_r + 1, dtype=torch.float64)  # (max_r,)
        within_r = ranks.unsqueeze(0) <= r.unsqueeze(1)  # (B, max_r)
        precision_at_i = relevant.cumsum(dim=1) / ranks  # (B, max_r)
        average = (precision_at_i * relevant * within_r).sum(dim=1) / r  # (B,)
        map_sum += float(average.sum())
    n = queries.numel()
    return {"precision_at_1": precision_sum / n, "map_at_r": map_sum / n, "num_queries": int(n)}
