"""Gallery.open_set: the confusion of known and unknown probes at the threshold, counted on
hand-made embeddings, and FNIR at FPIR restated from the open-set rule where the non-mated
probes support it."""

from __future__ import annotations

import math

import numpy as np
import pytest

from marginface.inference.gallery import Gallery
from marginface.models.description import ModelDescription


def _unit(rows):
    rows = np.asarray(rows, np.float64)
    return (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)


def _gallery(threshold=None) -> Gallery:
    """Identities a, b, c with templates along the first three axes of 4-D space."""
    description = ModelDescription(architecture="r18", embedding_dim=4, threshold=threshold)
    gallery = Gallery(description, index_kind="exact")
    gallery.add(["a", "b", "c"], np.eye(4, dtype=np.float32)[:3])
    return gallery


def _probe(cosine: float, axis: int) -> list[float]:
    """A unit vector of cosine ``cosine`` to template ``axis``, 0.1 to the two others (the
    rest along the fourth axis)."""
    vector = [0.1, 0.1, 0.1, math.sqrt(1.0 - cosine**2 - 0.02)]
    vector[axis] = cosine
    return vector


def test_counts_at_the_calibrated_threshold():
    gallery = _gallery(threshold=0.6)
    probes = _unit(
        [
            _probe(0.9, 0),  # a, best a, 0.9: accepted right
            _probe(0.7, 1),  # b, best b, 0.7: accepted right
            _probe(0.5, 2),  # c, best c, 0.5: rejected (rank-1 though)
            _probe(0.8, 0),  # b, best a, 0.8: accepted wrong
            _probe(0.65, 1),  # stranger, best b 0.65: accepted (a false positive)
            _probe(0.58, 2),  # stranger, best c 0.58: rejected
            _probe(0.59, 0),  # stranger: rejected
        ]
    )
    truth = ["a", "b", "c", "b", "zed", "yan", "zed"]
    report = gallery.open_set(probes, truth)
    assert report.threshold == 0.6  # the description's
    assert (report.mated, report.rank1) == (4, 3)
    assert (report.accepted_right, report.accepted_wrong, report.rejected_mated) == (2, 1, 1)
    assert (report.non_mated, report.rejected_non_mated, report.accepted_non_mated) == (3, 2, 1)
    assert report.fnir == 2 / 4 and report.fpir == 1 / 3
    assert report.fnir_at_fpir == {0.01: None, 0.1: None}  # 3 strangers support neither
    # the same decisions as search at that threshold
    results = gallery.search(probes, [str(i) for i in range(7)], k=1)
    assert [r.identity for r in results] == ["a", "b", None, "a", "b", None, None]
    # another threshold: everything above 0.55 accepted
    lower = gallery.open_set(probes, truth, threshold=0.55)
    assert (lower.accepted_right, lower.accepted_wrong, lower.rejected_mated) == (2, 1, 1)
    assert lower.accepted_non_mated == 3


def test_fnir_at_fpir_is_the_open_set_rule_where_supported():
    rng = np.random.default_rng(0)
    gallery = _gallery()
    drawn = rng.integers(0, 3, 60)  # each mated probe: its template plus noise
    mated_rows = _unit(np.eye(4)[drawn] + 0.6 * rng.normal(size=(60, 4)))
    strangers = _unit(rng.normal(size=(100, 4)))
    probes = np.r_[mated_rows, strangers]
    mated_ids = [gallery.identities[i] for i in drawn]
    truth = mated_ids + [f"s{i}" for i in range(100)]
    report = gallery.open_set(probes, truth, threshold=0.5)
    assert report.fnir_at_fpir[0.01] is None  # 0.01 * 100 = 1 < 10 false alarms
    # restated: at most floor(0.1 * 100) = 10 strangers' best scores above t
    similarity = probes.astype(np.float64) @ gallery.templates.T.astype(np.float64)
    best_stranger = np.sort(similarity[60:].max(axis=1))[::-1]
    t = best_stranger[10]
    own = np.array([gallery.identities.index(name) for name in mated_ids])
    mate = similarity[np.arange(60), own]
    first = (similarity[:60] > mate[:, None]).sum(axis=1) == 0
    assert report.fnir_at_fpir[0.1] == pytest.approx(1 - np.mean(first & (mate > t)))
    # the confusion, restated
    best = similarity.argmax(axis=1)
    score = similarity.max(axis=1)
    assert report.rank1 == int(np.sum(best[:60] == own)) < 60  # the noise misleads some
    assert report.accepted_right == int(np.sum((best[:60] == own) & (score[:60] >= 0.5)))
    assert report.accepted_non_mated == int(np.sum(score[60:] >= 0.5))


def test_truth_naming_no_gallery_identity_is_one_line():
    gallery = _gallery(threshold=0.5)
    probes = _unit([_probe(0.9, 0), _probe(0.9, 1)])
    with pytest.raises(ValueError) as error:
        gallery.open_set(probes, ["x", "y"])
    message = str(error.value)
    assert len(message.splitlines()) == 1
    assert message.startswith("none of the probes' 2 identities ('x', 'y') is in the gallery")
    with pytest.raises(ValueError, match="1 probe identities for 2 probes"):
        gallery.open_set(probes, ["a"])
    with pytest.raises(ValueError, match="the gallery holds 4-D templates, the probes are 3-D"):
        gallery.open_set(np.ones((2, 3), np.float32), ["a", "b"])
