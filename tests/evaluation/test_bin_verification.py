"""insightface's .bin protocol, checked against the protocol of insightface's
``recognition/arcface_torch/eval/verification.py`` restated below by hand (loops over every
threshold, scikit-learn's KFold, SciPy's interpolation): never marginface's code."""

from __future__ import annotations

import numpy as np
import pytest

from marginface.evaluation import (
    ACCURACY_THRESHOLDS,
    VAL_THRESHOLDS,
    bin_verification_metrics,
    kfold_folds,
    threshold_at_far,
)

sklearn_model_selection = pytest.importorskip("sklearn.model_selection")
sklearn_preprocessing = pytest.importorskip("sklearn.preprocessing")
interpolate = pytest.importorskip("scipy.interpolate")


# ------------------------------------------------------------ the protocol, restated by hand
def _accuracy(threshold, dist, issame):
    predict = np.less(dist, threshold)
    tp = np.sum(predict & issame)
    tn = np.sum(~predict & ~issame)
    return float(tp + tn) / dist.size


def _val_far(threshold, dist, issame):
    predict = np.less(dist, threshold)
    val = np.sum(predict & issame) / np.sum(issame)
    far = np.sum(predict & ~issame) / np.sum(~issame)
    return float(val), float(far)


def _slinear_spline(far, thresholds, target):
    """What ``interp1d(far, thresholds, kind="slinear")`` built up to SciPy 1.8: the degree-1
    B-spline with knots ``[far_0, far..., far_last]`` and coefficients ``thresholds`` (its
    special case for k = 1), defined with repeated FARs too."""
    order = np.argsort(far, kind="mergesort")
    x, y = far[order], thresholds[order]
    spline = interpolate.BSpline(np.r_[x[0], x, x[-1]], y, 1)
    return float(spline(target))


def insightface_reference(embeddings, flipped, issame, nfolds=10, far_target=1e-3):
    xnorm = np.mean(
        [np.linalg.norm(row) for row in embeddings] + [np.linalg.norm(row) for row in flipped]
    )
    x = sklearn_preprocessing.normalize(embeddings + flipped)
    dist = np.sum(np.square(np.subtract(x[0::2], x[1::2])), 1)
    indices = np.arange(len(issame))
    kfold = sklearn_model_selection.KFold(n_splits=nfolds, shuffle=False)
    thresholds = np.arange(0, 4, 0.01)
    accuracy, best = [], []
    for train, test in kfold.split(indices):
        acc_train = [_accuracy(t, dist[train], issame[train]) for t in thresholds]
        index = int(np.argmax(acc_train))
        best.append(thresholds[index])
        accuracy.append(_accuracy(thresholds[index], dist[test], issame[test]))
    thresholds = np.arange(0, 4, 0.001)
    val, far = [], []
    for train, test in kfold.split(indices):
        far_train = np.array([_val_far(t, dist[train], issame[train])[1] for t in thresholds])
        if np.max(far_train) >= far_target:
            threshold = _slinear_spline(far_train, thresholds, far_target)
        else:
            threshold = 0.0
        v, f = _val_far(threshold, dist[test], issame[test])
        val.append(v)
        far.append(f)
    return {
        "accuracy": np.mean(accuracy),
        "accuracy_std": np.std(accuracy),
        "threshold": np.mean(best),
        "xnorm": xnorm,
        "val": np.mean(val),
        "val_std": np.std(val),
        "far": np.mean(far),
    }


def _clustered(num_pairs, dim, noise, seed):
    """Embeddings of pairs like a network's: identities plus noise (float32), and flips."""
    rng = np.random.default_rng(seed)
    same = rng.random(num_pairs) < 0.5
    centers = rng.standard_normal((2 * num_pairs, dim))
    first = centers[0::2]
    second = np.where(same[:, None], first, centers[1::2])
    base = np.empty((2 * num_pairs, dim))
    base[0::2], base[1::2] = first, second
    scale = rng.uniform(5, 30, size=(2 * num_pairs, 1))  # unnormalized, like a backbone's
    embeddings = (scale * (base + noise * rng.standard_normal(base.shape))).astype(np.float32)
    flipped = (scale * (base + noise * rng.standard_normal(base.shape))).astype(np.float32)
    return embeddings.astype(np.float64), flipped.astype(np.float64), same


# ------------------------------------------------------------------------------- the tests
@pytest.mark.parametrize(("num_pairs", "noise", "seed"), [(600, 1.0, 0), (613, 1.6, 1)])
def test_bin_metrics_equal_insightface_protocol(num_pairs, noise, seed):
    embeddings, flipped, same = _clustered(num_pairs, 16, noise, seed)
    ours = bin_verification_metrics(embeddings, same, flipped=flipped)
    reference = insightface_reference(embeddings, flipped, same)
    assert 0.6 < reference["accuracy"] < 0.99  # neither trivial nor perfect
    assert ours.accuracy == reference["accuracy"]
    assert ours.accuracy_std == pytest.approx(reference["accuracy_std"], abs=1e-15)
    assert ours.threshold == pytest.approx(reference["threshold"], abs=1e-15)
    assert ours.xnorm == pytest.approx(reference["xnorm"], rel=1e-12)
    assert ours.val == pytest.approx(reference["val"], abs=1e-15)
    assert ours.val_std == pytest.approx(reference["val_std"], abs=1e-15)
    assert ours.far == pytest.approx(reference["far"], abs=1e-15)
    assert ours.as_dict()["val@far=1e-03"] == ours.val


def test_ties_keep_the_first_best_threshold_and_reject_equal_distances():
    # distances only 0 (same vector), 1 (cos 1/2) and 2 (orthogonal): every threshold in
    # (0, 1] scores alike on the training folds; the first best, 0.01, must win
    u = np.array([1.0, 0.0])
    v = np.array([0.5, np.sqrt(3.0) / 2.0])
    w = np.array([0.0, 1.0])
    rows, same = [], []
    for p in range(40):
        kind = p % 4
        partner = {0: u, 1: u, 2: v, 3: w}[kind]
        rows += [u, partner]
        same.append(kind < 2)
    embeddings = np.array(rows)
    flipped = embeddings.copy()
    same = np.array(same)
    ours = bin_verification_metrics(embeddings, same, flipped=flipped)
    reference = insightface_reference(embeddings, flipped, same)
    assert ours.accuracy == reference["accuracy"]
    assert ours.threshold == pytest.approx(reference["threshold"], abs=1e-15)
    assert np.allclose(ours.fold_thresholds, 0.01)


def test_threshold_at_far_is_scipy_slinear_without_repeats():
    rng = np.random.default_rng(3)
    far = np.cumsum(rng.uniform(0.01, 0.2, size=30))
    far = (far - far[0]) / (far[-1] - far[0])
    thresholds = np.sort(rng.uniform(0, 4, size=30))
    for target in (1e-3, 0.05, 0.5, far[7], 1.0):
        expected = float(interpolate.interp1d(far, thresholds, kind="slinear")(target))
        assert threshold_at_far(far, thresholds, target) == pytest.approx(expected, abs=1e-12)


def test_threshold_at_far_with_repeated_fars():
    # the FAR curve insightface's calculate_val meets: flat runs (recent SciPy refuses it)
    far = np.array([0.0, 0.0, 0.0, 0.0005, 0.0005, 0.002, 0.002, 0.01, 0.01, 0.01])
    thresholds = np.arange(10) * 0.1
    with pytest.raises(ValueError, match="duplicates"):
        interpolate.interp1d(far, thresholds, kind="slinear")
    # between the last threshold of FAR 0.0005 (0.4) and the first of FAR 0.002 (0.5)
    assert threshold_at_far(far, thresholds, 1e-3) == pytest.approx(0.4 + 0.1 / 3.0)
    assert threshold_at_far(far, thresholds, 1e-3) == pytest.approx(
        _slinear_spline(far, thresholds, 1e-3)
    )
    assert threshold_at_far(far, thresholds, 0.002) == pytest.approx(0.6)  # a run: its last
    # the curve's maximum reached by a run: its first threshold (SciPy's spline evaluates this
    # degenerate end, repeated end knots, to 0; insightface's sets never reach it: FAR 1e-3 is
    # far below the maximum FAR, 1)
    assert threshold_at_far(far, thresholds, 0.01) == pytest.approx(0.7)
    assert threshold_at_far(far, thresholds, 0.02) == 0.0  # never reached: insightface's 0
    for target in (0.0, 0.002, 0.0001, 0.005, 0.009):
        assert threshold_at_far(far, thresholds, target) == pytest.approx(
            _slinear_spline(far, thresholds, target)
        )


def test_kfold_folds_are_sklearn_kfold():
    for num_pairs in (10, 12, 605, 6000):
        folds = kfold_folds(num_pairs, 10)
        splits = sklearn_model_selection.KFold(10, shuffle=False).split(np.arange(num_pairs))
        for fold, (_, test) in enumerate(splits):
            assert np.array_equal(np.flatnonzero(folds == fold), test)


def test_grids_are_insightface_grids():
    assert ACCURACY_THRESHOLDS.shape == (400,) and ACCURACY_THRESHOLDS[1] == 0.01
    assert VAL_THRESHOLDS.shape == (4000,) and VAL_THRESHOLDS[-1] == pytest.approx(3.999)


def test_no_flip_uses_the_embeddings_alone():
    embeddings, _, same = _clustered(100, 8, 1.0, 4)
    ours = bin_verification_metrics(embeddings, same)
    reference = insightface_reference(embeddings, np.zeros_like(embeddings), same)
    assert ours.accuracy == reference["accuracy"]
    assert ours.xnorm == pytest.approx(np.linalg.norm(embeddings, axis=1).mean())


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"embeddings": np.ones((21, 4))}, ValueError, "even number of rows"),
        ({"flipped": np.ones((20, 3))}, ValueError, "flipped must have the shape"),
        ({"far_target": 0.0}, ValueError, "far_target"),
        ({"num_folds": 1}, ValueError, "num_folds"),
        ({"same": np.ones(3, dtype=bool)}, ValueError, "same must have length 10"),
    ],
)
def test_bad_arguments_are_named(kwargs, error, match):
    arguments = {"embeddings": np.ones((20, 4)), "same": np.arange(10) % 2 == 0, **kwargs}
    with pytest.raises(error, match=match):
        bin_verification_metrics(**arguments)


def test_bin_metrics_on_real_faces_equal_insightface_protocol():
    """ORL faces (../shared/data), pixels pooled 4×4 as embeddings, flipped images as the flip
    test: 330 pairs (not a multiple of 10) of real images."""
    import io
    import tarfile

    from PIL import Image

    from tests._shared_data import require_shared_file

    path = require_shared_file("orl", "att_faces.tar")
    rng = np.random.default_rng(11)
    with tarfile.open(path) as archive:
        faces = {
            (s, k): np.asarray(
                Image.open(io.BytesIO(archive.extractfile(f"att_faces/s{s}/{k}.pgm").read()))
            ).astype(np.float64)
            for s in range(1, 41)
            for k in range(1, 11)
        }

    def embed(image):
        pooled = image.reshape(28, 4, 23, 4).mean(axis=(1, 3))  # (28, 23)
        return (pooled - pooled.mean()).reshape(-1)

    rows, flips, same = [], [], []
    for p in range(330):
        s = int(rng.integers(1, 41))
        t = s if p % 2 == 0 else int((s + rng.integers(1, 40) - 1) % 40 + 1)
        a, b = rng.choice(10, 2, replace=False) + 1
        for image in (faces[(s, a)], faces[(t, b)]):
            rows.append(embed(image))
            flips.append(embed(image[:, ::-1]))
        same.append(s == t)
    embeddings, flipped, same = np.array(rows), np.array(flips), np.array(same)
    ours = bin_verification_metrics(embeddings, same, flipped=flipped)
    reference = insightface_reference(embeddings, flipped, same)
    assert 0.6 < reference["accuracy"] < 0.99
    assert ours.accuracy == reference["accuracy"]
    assert ours.accuracy_std == pytest.approx(reference["accuracy_std"], abs=1e-15)
    assert ours.threshold == pytest.approx(reference["threshold"], abs=1e-15)
    assert ours.val == pytest.approx(reference["val"], abs=1e-15)
    assert ours.far == pytest.approx(reference["far"], abs=1e-15)
