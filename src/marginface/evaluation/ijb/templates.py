"""IJB-B / IJB-C features: each image's, each template's (media pooling) and a pair's score, as
insightface's ``recognition/arcface_torch/eval_ijbc.py`` computes them, on features of any size.

Image features (:func:`ijb_image_features`), from each image's embedding ``e_i`` and its
left-right flip's ``f_i`` (``float[N, D]`` each) and the detector's face score ``q_i``:

* flip test: ``x_i = e_i + f_i`` (insightface's "F2"); without it ``x_i = e_i``;
* norm score (default on): ``x_i`` keeps its norm; off: ``x_i / ‖x_i‖``;
* detector score (default on): ``x_i · q_i``; off: ``x_i``.

Template features (:func:`template_features`): the mean of ``x_i`` over each media (a video's
frames, or one still image) of a template, summed over the template's media, L2-normalized.
Pair scores (:func:`template_pair_scores`) are dot products of template features. The metrics
of the scores are :mod:`marginface.evaluation.ijb.metrics`.
"""

from __future__ import annotations

import numpy as np
import torch

from ..arrays import (
    ArrayLike,
    as_embeddings,
    as_float_vector,
    as_int_vector,
    to_numpy,
)

__all__ = ["ijb_image_features", "template_features", "template_pair_scores"]

_CHUNK_ROWS = 1 << 16
"""Image rows converted to float64 at a time by :func:`template_features`."""


def ijb_image_features(
    embeddings: ArrayLike,
    flipped: ArrayLike | None = None,
    face_scores: ArrayLike | None = None,
    *,
    flip: bool = True,
    norm_score: bool = True,
    detector_score: bool = True,
) -> np.ndarray:
    """Per-image features ``x_i`` entering the template pooling (module docstring).

    Args:
        embeddings: ``[N, D]`` embeddings of the aligned images (not normalized).
        flipped: ``[N, D]`` of the flipped images (needed when ``flip``).
        face_scores: ``float[N]`` detector scores (needed when ``detector_score``).
        flip: add the flipped image's embedding (insightface default: on).
        norm_score: keep each feature's norm (default: on); off normalizes it first.
        detector_score: weight by the detector score (default: on).

    Returns:
        ``float64[N, D]``.
    """
    x = as_embeddings("embeddings", embeddings)
    if flip:
        if flipped is None:
            raise ValueError("flipped must be given when flip=True (or pass flip=False)")
        f = as_embeddings("flipped", flipped)
        if f.shape != x.shape:
            raise ValueError(f"flipped must have the shape of embeddings {x.shape}, got {f.shape}")
        x = x + f
    if not norm_score:
        norms = np.sqrt(np.einsum("nd,nd->n", x, x))[:, None]
        x = x / np.where(norms == 0.0, 1.0, norms)
    if detector_score:
        if face_scores is None:
            raise ValueError("face_scores must be given when detector_score=True")
        q = as_float_vector("face_scores", face_scores, length=x.shape[0])
        x = x * q[:, None]
    return x


def template_features(
    features: ArrayLike, templates: ArrayLike, medias: ArrayLike
) -> tuple[np.ndarray, np.ndarray]:
    r"""Template features: mean over each media, sum over the template's media, L2-normalized.

    .. math:: t_T = \frac{\sum_{m \in T} \bar x_m}{\|\sum_{m \in T} \bar x_m\|}, \quad
              \bar x_m = \frac{1}{|m|} \sum_{i \in m} x_i

    (a media is identified by ``(template, media id)``, as insightface groups media within a
    template). A zero sum stays zero.

    Args:
        features: ``float[N, D]`` image features (:func:`ijb_image_features`).
        templates: ``int[N]`` template id of each image.
        medias: ``int[N]`` media id of each image.

    Returns:
        ``(template_ids, features)``: ``int64[T]`` sorted distinct template ids and
        ``float64[T, D]``.
    """
    x = _feature_matrix("features", features)  # (N, D), float32 or float64, not copied
    t = as_int_vector("templates", templates, length=x.shape[0])
    m = as_int_vector("medias", medias, length=x.shape[0])
    order = np.lexsort((m, t))  # images grouped by (template, media), (N,)
    t_sorted, m_sorted = t[order], m[order]
    new_media = np.r_[True, (t_sorted[1:] != t_sorted[:-1]) | (m_sorted[1:] != m_sorted[:-1])]
    starts = np.flatnonzero(new_media)  # (M,) first sorted row of each media
    counts = np.diff(np.r_[starts, x.shape[0]])  # (M,)
    media_of_image = np.empty(x.shape[0], dtype=np.int64)
    media_of_image[order] = np.cumsum(new_media) - 1  # (N,) media of each image
    media_sum = torch.zeros((starts.shape[0], x.shape[1]), dtype=torch.float64)  # (M, D)
    # float64 sums over chunks of rows in file order (no N × D float64 copy); within a media
    # the images are added in file order, as the stable sort keeps them
    for lo in range(0, x.shape[0], _CHUNK_ROWS):
        hi = min(lo + _CHUNK_ROWS, x.shape[0])
        block = torch.from_numpy(np.ascontiguousarray(x[lo:hi])).to(torch.float64)  # (rows, D)
        media_sum.index_add_(0, torch.from_numpy(media_of_image[lo:hi]), block)
    media_mean = media_sum / torch.from_numpy(counts)[:, None]  # (M, D)
    media_template = t_sorted[starts]  # (M,) non-decreasing
    new_template = np.r_[True, media_template[1:] != media_template[:-1]]
    template_ids = media_template[new_template]  # (T,)
    template_of_media = torch.from_numpy(np.cumsum(new_template) - 1)  # (M,)
    pooled = torch.zeros((template_ids.shape[0], x.shape[1]), dtype=torch.float64)
    pooled = pooled.index_add_(0, template_of_media, media_mean).numpy()  # (T, D)
    norms = np.sqrt(np.einsum("td,td->t", pooled, pooled))[:, None]
    return template_ids, pooled / np.where(norms == 0.0, 1.0, norms)


def _feature_matrix(name: str, value: object) -> np.ndarray:
    """A finite ``float32``/``float64`` ``[N, D]`` array, not copied (IJB-C's 470k × 512)."""
    array = to_numpy(name, value)
    if array.dtype not in (np.float32, np.float64):
        return as_embeddings(name, array)
    if array.ndim != 2 or array.shape[0] < 1 or array.shape[1] < 1:
        raise ValueError(f"{name} must have shape (N, D) with N, D >= 1, got {array.shape}")
    for start in range(0, array.shape[0], 1 << 16):
        if not np.isfinite(array[start : start + (1 << 16)]).all():
            raise ValueError(f"{name} contains non-finite values (NaN or inf)")
    return array


def template_pair_scores(
    template_ids: ArrayLike,
    features: ArrayLike,
    first: ArrayLike,
    second: ArrayLike,
    *,
    block: int = 2048,
    precision: str = "float64",
) -> np.ndarray:
    """Dot products ``⟨t_a, t_b⟩`` of template pairs.

    Pairs are grouped by their first template; each group of ``block`` first templates is one
    matrix product with the templates they meet, so no ``P × D`` copy is made.
    ``precision="float32"`` does the products in single precision (scores within ~1e-7 of
    float64's, the order of the rounding insightface's own float32 pooling already has).

    Args:
        template_ids: ``int[T]`` sorted distinct ids (:func:`template_features`).
        features: ``float[T, D]`` template features.
        first, second: ``int[P]`` template ids of each pair (every id among ``template_ids``).
        block: first templates per matrix product. Default: 2048.
        precision: ``"float64"`` (default) or ``"float32"``.

    Returns:
        ``float64[P]``.
    """
    if precision not in ("float64", "float32"):
        raise ValueError(f"precision must be 'float64' or 'float32', got {precision!r}")
    ids = as_int_vector("template_ids", template_ids)
    f = as_embeddings("features", features).astype(precision, copy=False)
    a = _template_rows(ids, as_int_vector("first", first), "first")
    b = _template_rows(ids, as_int_vector("second", second, length=a.shape[0]), "second")
    scores = np.empty(a.shape[0])
    order = np.argsort(a, kind="stable")  # pairs grouped by first template
    a_sorted = a[order]
    for start in range(0, f.shape[0], block):
        lo, hi = np.searchsorted(a_sorted, [start, start + block])
        if lo == hi:
            continue
        chosen = order[lo:hi]  # pairs whose first template is in [start, start + block)
        columns, inverse = np.unique(b[chosen], return_inverse=True)
        gram = f[start : start + block] @ f[columns].T  # (block, C)
        scores[chosen] = gram[a[chosen] - start, inverse.reshape(-1)]
    return scores


def _template_rows(ids: np.ndarray, wanted: np.ndarray, name: str) -> np.ndarray:
    rows = np.searchsorted(ids, wanted)
    bad = (rows >= ids.shape[0]) | (ids[np.minimum(rows, ids.shape[0] - 1)] != wanted)
    if bad.any():
        raise ValueError(
            f"{name} names template {int(wanted[bad][0])}, which has no image "
            f"({int(bad.sum())} pair(s) affected)"
        )
    return rows
