"""``norm_crop(..., alignment="insightface")`` (marginface.data.align.insightface_similarity):
insightface's IJB crops to 0 grey levels, against its arithmetic restated here: ``eval_ijbc.py``
builds its 112×112 template in float32 as the 96×112 table plus 8 in x (other sizes: scaled as
``face_align.estimate_norm`` scales, ``· ratio``, ``+ 8·ratio`` in x for multiples of 128) and
scikit-image's ``SimilarityTransform.estimate`` (Umeyama 1991, eqs. 38-43) runs on the float32
landmarks: means, centring, covariance, determinant, SVD and rank in float32; ``d`` and the
matrix ``T`` in float64."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
from tests._face_fixtures import lfw_jpegs, lfw_rgb

from marginface.data.align import (
    ARCFACE_TEMPLATE,
    insightface_similarity,
    insightface_template,
    norm_crop,
)

__all__ = ["lfw_jpegs", "lfw_rgb"]  # fixtures

# face_align's arcface_dst
ARCFACE_DST = np.array(
    [[38.2946, 51.6963], [73.5318, 51.5014], [56.0252, 71.7366], [41.5493, 92.3655],
     [70.7299, 92.2041]], dtype=np.float32,
)  # fmt: skip


def _eval_ijbc_template():
    """eval_ijbc.py's ``Embedding.src``: the 96×112 table in float32, then 8 added to x."""
    src = np.array(
        [[30.2946, 51.6963], [65.5318, 51.5014], [48.0252, 71.7366], [33.5493, 92.3655],
         [62.7299, 92.2041]], dtype=np.float32,
    )  # fmt: skip
    src[:, 0] += 8.0
    return src


def _estimate_norm(lmk, image_size=112):
    """eval_ijbc.py's template (scaled as insightface's estimate_norm scales its own for other
    sizes) with scikit-image's Umeyama, step by step."""
    if image_size % 112 == 0:
        ratio, diff_x = float(image_size) / 112.0, 0
    else:
        ratio = float(image_size) / 128.0
        diff_x = 8.0 * ratio
    dst = _eval_ijbc_template() * ratio
    dst[:, 0] += diff_x
    return _umeyama_float32(lmk, dst)


def _umeyama_float32(lmk, dst):
    """scikit-image's SimilarityTransform.estimate(lmk, dst) on float32 points, step by step."""
    src = lmk
    num, dim = src.shape
    src_mean, dst_mean = src.mean(axis=0), dst.mean(axis=0)
    src_demean, dst_demean = src - src_mean, dst - dst_mean
    A = dst_demean.T @ src_demean / num  # eq. 38
    d = np.ones((dim,), dtype=np.float64)  # eq. 39
    if np.linalg.det(A) < 0:
        d[dim - 1] = -1
    T = np.eye(dim + 1, dtype=np.float64)
    U, S, V = np.linalg.svd(A)
    rank = np.linalg.matrix_rank(A)  # eqs. 40, 43
    if rank == dim - 1:
        if np.linalg.det(U) * np.linalg.det(V) > 0:
            T[:dim, :dim] = U @ V
        else:
            T[:dim, :dim] = U @ np.diag([1.0, -1.0]) @ V
    else:
        T[:dim, :dim] = U @ np.diag(d) @ V
    scale = 1.0 / src_demean.var(axis=0).sum() * (S @ d)  # eq. 42
    T[:dim, dim] = dst_mean - scale * (T[:dim, :dim] @ src_mean.T)  # eq. 41
    T[:dim, :dim] *= scale
    return T[:2, :]


def _landmark_sets(count, seed=0):
    """Faces of 60..140 px, turned up to ±30°, placed in a 250×250 photo, float32 as
    insightface reads its landmark files."""
    rng = np.random.default_rng(seed)
    for _ in range(count):
        angle = rng.uniform(-0.5, 0.5)
        rotation = np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
        points = (ARCFACE_DST - 56) @ rotation.T * rng.uniform(0.6, 1.4) + rng.uniform(90, 160, 2)
        yield (points + rng.normal(0, 1.5, (5, 2))).astype(np.float32)


@pytest.mark.parametrize("size", [112, 224, 128])
def test_zero_grey_levels_from_insightface(lfw_rgb, size):
    moved = 0
    for k, lmk in enumerate(_landmark_sets(60)):
        image = lfw_rgb[k % len(lfw_rgb)]
        expected = cv2.warpAffine(image, _estimate_norm(lmk, size), (size, size), borderValue=0.0)
        np.testing.assert_allclose(insightface_similarity(lmk, size), _estimate_norm(lmk, size),
                                   rtol=0, atol=1e-12)  # fmt: skip
        crop = norm_crop(image, lmk, size, alignment="insightface")
        assert np.array_equal(crop, expected), f"landmark set {k}"
        float64 = norm_crop(image, lmk, size)
        assert np.abs(float64.astype(int) - expected).max() <= 1  # the default: within 1 level
        moved += not np.array_equal(float64, expected)
    assert moved >= 1  # the float64 estimate does move pixels: the option is not a no-op


def test_the_rank_one_branch_and_bad_values():
    # collinear landmarks: the covariance has rank 1 (scikit-image's eq. 43 branch)
    line = np.stack([np.linspace(80, 170, 5), np.linspace(100, 130, 5)], axis=1).astype(np.float32)
    np.testing.assert_allclose(insightface_similarity(line), _estimate_norm(line), atol=1e-12)
    with pytest.raises(ValueError, match="degenerate"):
        insightface_similarity(np.full((5, 2), 3.0))
    with pytest.raises(ValueError, match="alignment must be one of"):
        norm_crop(np.zeros((50, 50, 3), np.uint8), line, alignment="float32")
    with pytest.raises(ValueError, match="image_size must be a multiple of 112 or 128"):
        insightface_similarity(line, 100)


def test_the_template_is_eval_ijbc_s_float32_construction():
    """At 112: float32(62.7299) + 8 = 70.72990417 for the right mouth corner's x, where
    face_align's arcface_dst holds float32(70.7299) = 70.72989655; every other coordinate is the
    same float32. Other sizes: the 112 template scaled (and shifted 8·size/128 for 128s)."""
    template = insightface_template(112)
    assert template.dtype == np.float32
    assert np.array_equal(template, _eval_ijbc_template())
    assert template[4, 0] == np.float32(62.7299) + np.float32(8.0) != np.float32(70.7299)
    same = np.ones((5, 2), dtype=bool)
    same[4, 0] = False
    assert np.array_equal(template[same], ARCFACE_TEMPLATE[same])
    assert np.array_equal(insightface_template(224), _eval_ijbc_template() * np.float32(2.0))
    expected_256 = _eval_ijbc_template() * np.float32(2.0)
    expected_256[:, 0] += np.float32(16.0)
    assert np.array_equal(insightface_template(256), expected_256)
    with pytest.raises(ValueError, match="image_size must be a multiple of 112 or 128"):
        insightface_template(100)


def test_the_crops_differ_from_arcface_dst_s_in_some_pixels(lfw_rgb):
    """The one coordinate's 7.6e-6 px moves some pixels of some crops by one grey level: the
    template is not a no-op change (the eval_ijbc.py crops are not face_align's)."""
    moved = 0
    for k, lmk in enumerate(_landmark_sets(30, seed=3)):
        image = lfw_rgb[k % len(lfw_rgb)]
        ours = norm_crop(image, lmk, alignment="insightface")
        matrix = _umeyama_float32(lmk, ARCFACE_DST.copy())  # face_align.estimate_norm's, at 112
        face_align = cv2.warpAffine(image, matrix, (112, 112), borderValue=0.0)
        assert np.abs(ours.astype(int) - face_align).max() <= 1
        moved += not np.array_equal(ours, face_align)
    assert moved >= 1
