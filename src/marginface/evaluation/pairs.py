"""Verification pairs: their cosine scores, and balanced random pairs for datasets without any."""

from __future__ import annotations

import numpy as np

from ..data.pairs import sample_pairs as _sample_pairs
from .arrays import ArrayLike, as_embeddings, to_numpy
from .closed_set import _normalize

__all__ = ["NUM_FOLDS", "pair_scores", "sample_pairs"]

# one implementation of pair sampling, shared with the dataset loaders
sample_pairs = _sample_pairs

NUM_FOLDS = 10
"""Cross-validation folds of the LFW protocol, used by :func:`sample_pairs`."""


def pair_scores(embeddings: ArrayLike, index: ArrayLike) -> np.ndarray:
    r"""Cosine similarity of each pair: ``s_p = x_a^\top x_b / (\|x_a\|\,\|x_b\|)``.

    Args:
        embeddings: ``[N, D]`` (tensor or array; not necessarily normalized; a zero row scores 0).
        index: ``int[P, 2]``, row indices ``(a, b)`` into ``embeddings`` (e.g. ``PairSet.index``).

    Returns:
        ``float64[P]`` in [-1, 1]; higher means "more likely the same identity".
    """
    x = _normalize(as_embeddings("embeddings", embeddings))  # (N, D)
    pairs = to_numpy("index", index)
    if pairs.dtype == np.bool_ or not np.issubdtype(pairs.dtype, np.integer):
        raise TypeError(f"index must have an integer dtype, got {pairs.dtype}")
    if pairs.ndim != 2 or pairs.shape[1] != 2:
        raise ValueError(f"index must have shape (P, 2), got {pairs.shape}")
    if pairs.size and (pairs.min() < 0 or pairs.max() >= x.shape[0]):
        bad = int(pairs.min()) if pairs.min() < 0 else int(pairs.max())
        raise ValueError(f"index must lie in [0, {x.shape[0] - 1}] (rows of embeddings), got {bad}")
    scores = np.einsum("pd,pd->p", x[pairs[:, 0]], x[pairs[:, 1]])  # (P,)
    return np.clip(scores, -1.0, 1.0)


def _decode_triangular(p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unordered pair number ``p = j(j-1)/2 + i`` (``0 <= i < j``) back to ``(i, j)``."""
    j = np.floor((1.0 + np.sqrt(1.0 + 8.0 * p.astype(np.float64))) / 2.0).astype(np.int64)
    j -= (j * (j - 1) // 2) > p  # fix float rounding on either side
    j += ((j + 1) * j // 2) <= p
    return p - j * (j - 1) // 2, j


def _genuine_pairs(labels: np.ndarray, count: int, rng: np.random.Generator) -> np.ndarray:
    """``count`` distinct same-class pairs, uniform over all of them: ``int64[count, 2]``."""
    order = np.argsort(labels, kind="stable")  # members of each class, contiguous
    _, starts, sizes = np.unique(labels[order], return_index=True, return_counts=True)
    per_class = sizes * (sizes - 1) // 2  # (K,) genuine pairs per class
    total = int(per_class.sum())
    if total < count:
        raise ValueError(
            f"num_pairs asks for {count} genuine pairs but labels allow only {total} "
            "(too few samples per class)"
        )
    chosen = np.sort(rng.choice(total, size=count, replace=False))  # pair numbers
    offsets = np.concatenate(([0], np.cumsum(per_class)))  # (K + 1,)
    cls = np.searchsorted(offsets, chosen, side="right") - 1  # (count,)
    i, j = _decode_triangular(chosen - offsets[cls])
    return np.stack([order[starts[cls] + i], order[starts[cls] + j]], axis=1)


def _impostor_pairs(labels: np.ndarray, count: int, rng: np.random.Generator) -> np.ndarray:
    """``count`` distinct different-class pairs, uniform (by rejection): ``int64[count, 2]``."""
    n = labels.shape[0]
    _, sizes = np.unique(labels, return_counts=True)
    total = n * (n - 1) // 2 - int((sizes * (sizes - 1) // 2).sum())
    if total < count:
        raise ValueError(
            f"num_pairs asks for {count} impostor pairs but labels allow only {total} "
            "(too few classes)"
        )
    found: set[tuple[int, int]] = set()
    result: list[tuple[int, int]] = []
    while len(result) < count:
        draw = max(2 * (count - len(result)), 64)
        a = rng.integers(0, n, size=draw)
        b = rng.integers(0, n, size=draw)
        for x, y in zip(a.tolist(), b.tolist(), strict=True):
            if labels[x] == labels[y]:
                continue
            key = (min(x, y), max(x, y))
            if key not in found:
                found.add(key)
                result.append(key)
                if len(result) == count:
                    break
    return np.asarray(result, dtype=np.int64).reshape(count, 2)
