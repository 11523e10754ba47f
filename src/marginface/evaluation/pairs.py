"""Verification pairs: the pair set, their cosine scores, and balanced random pairs for datasets
without any."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .arrays import ArrayLike, as_embeddings, to_numpy
from .closed_set import _normalize

__all__ = ["NUM_FOLDS", "PairSet", "pair_scores", "sample_pairs"]

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


@dataclass(frozen=True)
class PairSet:
    """Verification pairs over the images of an :class:`ImageSet`.

    Attributes:
        index: ``int64[P, 2]``, row indices into the image set.
        same: ``bool[P]``, True for a genuine (same identity) pair.
        fold: ``int64[P]``, the cross-validation fold of each pair (all 0 if there are none).
    """

    index: np.ndarray
    same: np.ndarray
    fold: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    def __post_init__(self) -> None:
        if self.index.ndim != 2 or self.index.shape[1] != 2:
            raise ValueError(f"index must have shape (P, 2), got {self.index.shape}")
        if self.same.shape != (self.index.shape[0],):
            raise ValueError(
                f"same must have shape ({self.index.shape[0]},), got {self.same.shape}"
            )
        if self.fold.size == 0:
            object.__setattr__(self, "fold", np.zeros(self.index.shape[0], dtype=np.int64))

    def __len__(self) -> int:
        return int(self.index.shape[0])


def sample_pairs(
    labels: np.ndarray, num_pairs: int, seed: int = 0, *, num_folds: int = 10
) -> PairSet:
    """Draw ``num_pairs`` distinct pairs, half genuine and half impostor, in ``num_folds`` folds.

    Genuine pairs: an identity with at least two images drawn uniformly, then two distinct
    images of it. Impostor pairs: two distinct identities drawn uniformly, one image of each.
    Duplicate pairs (in either order) are redrawn. The result is always balanced:
    ``num_pairs // 2`` of each kind, or fewer of both when the identities cannot supply that many
    distinct genuine pairs (``sum_k n_k (n_k - 1) / 2`` for identities with ``n_k`` images).
    Folds are assigned round-robin within the genuine and within the impostor pairs, so each fold
    is balanced (as LFW's View 2). Folds are *not*
    identity-disjoint: with a threshold as the only fitted quantity this does not leak.

    Args:
        labels: ``int[N]`` identity of each image.
        num_pairs: total pairs wanted (>= 2).
        seed: NumPy generator seed.
        num_folds: number of folds (>= 1). Default: 10.

    Returns:
        A :class:`PairSet` with ``index`` sorted by fold, genuine pairs first within a fold.

    Raises:
        ValueError: ``num_pairs < 2``, ``num_folds < 1``, or fewer than two identities / no
            identity with two images.
    """
    labels = np.asarray(labels)
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise TypeError(
            f"labels must have an integer dtype and shape (N,), got {labels.dtype} {labels.shape}"
        )
    if isinstance(num_pairs, bool) or not isinstance(num_pairs, (int, np.integer)):
        raise TypeError(f"num_pairs must be an integer, got {num_pairs!r}")
    if num_pairs < 2:
        raise ValueError(f"num_pairs must be >= 2, got {num_pairs}")
    if num_folds < 1:
        raise ValueError(f"num_folds must be >= 1, got {num_folds}")
    identities, inverse = np.unique(labels, return_inverse=True)
    members = [np.flatnonzero(inverse == k) for k in range(len(identities))]
    with_pairs = [m for m in members if len(m) >= 2]
    if len(identities) < 2 or not with_pairs:
        raise ValueError(
            "sampling verification pairs needs at least two identities and one identity with "
            f"two images; got {len(identities)} identities, {len(with_pairs)} with two images"
        )
    rng = np.random.default_rng(seed)
    half = num_pairs // 2
    max_genuine = sum(len(m) * (len(m) - 1) // 2 for m in with_pairs)

    def draw(count: int, genuine: bool, limit: int) -> list[tuple[int, int]]:
        chosen: set[tuple[int, int]] = set()
        target = min(count, limit)
        attempts = 0
        while len(chosen) < target and attempts < 50 * target + 100:
            attempts += 1
            if genuine:
                group = with_pairs[rng.integers(len(with_pairs))]
                a, b = rng.choice(group, size=2, replace=False)
            else:
                i, j = rng.choice(len(members), size=2, replace=False)
                a, b = rng.choice(members[i]), rng.choice(members[j])
            chosen.add((int(min(a, b)), int(max(a, b))))
        ordered = sorted(chosen)
        return [ordered[i] for i in rng.permutation(len(ordered))]

    genuine_pairs = draw(half, True, max_genuine)
    impostor_pairs = draw(len(genuine_pairs), False, len(labels) * len(labels))
    rows, same, fold = [], [], []
    for k in range(num_folds):
        for pairs, is_same in ((genuine_pairs, True), (impostor_pairs, False)):
            for pair in pairs[k::num_folds]:
                rows.append(pair)
                same.append(is_same)
                fold.append(k)
    return PairSet(
        index=np.asarray(rows, dtype=np.int64).reshape(-1, 2),
        same=np.asarray(same, dtype=bool),
        fold=np.asarray(fold, dtype=np.int64),
    )
