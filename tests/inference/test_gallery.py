"""Gallery in memory: templates are normalised sums, add/remove, the search's open-set
decision, and 1:N metrics through the IJB scoring with unknown probes as non-mated."""

from __future__ import annotations

import numpy as np
import pytest

from marginface.evaluation.ijb import ijb_identification
from marginface.inference.gallery import Gallery
from marginface.models.description import ModelDescription


def _unit(rows):
    rows = np.asarray(rows, np.float32)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def _gallery(dim=8, threshold=None):
    description = ModelDescription(architecture="r18", embedding_dim=dim, threshold=threshold)
    return Gallery(description, index_kind="exact")


def test_templates_are_the_normalised_mean_and_add_remove_touch_only_their_rows():
    rng = np.random.default_rng(0)
    rows = _unit(rng.normal(size=(6, 8)))
    gallery = _gallery()
    gallery.add(["b", "a", "b", "a", "c", "b"], rows)
    assert gallery.identities == ["a", "b", "c"] and list(gallery.counts) == [2, 3, 1]
    mean_b = rows[[0, 2, 5]].mean(axis=0)
    np.testing.assert_allclose(gallery.templates[1], mean_b / np.linalg.norm(mean_b), atol=1e-6)
    before = gallery.sums.copy()
    gallery.add(["c"], rows[:1])
    np.testing.assert_array_equal(gallery.sums[:2], before[:2])
    gallery.remove(["a"])
    assert gallery.identities == ["b", "c"]
    with pytest.raises(ValueError, match=r"identity 'z' is not in the gallery"):
        gallery.remove(["b", "z"])
    assert gallery.identities == ["b", "c"]  # nothing removed
    with pytest.raises(ValueError, match=r"holds 8-D templates, these embeddings are 4-D"):
        gallery.add(["d"], _unit(rng.normal(size=(1, 4))))


def test_search_decides_open_set_at_the_threshold():
    gallery = _gallery(dim=3, threshold=0.9)
    gallery.add(["x", "y"], _unit([[1, 0, 0], [0, 1, 0]]))
    near, far = _unit([[1, 0.1, 0]]), _unit([[1, 1, 1]])
    results = gallery.search(np.concatenate([near, far]), ["p", "q"], k=2)
    assert (results[0].identity, results[0].accepted) == ("x", True)
    assert (results[1].identity, results[1].accepted) == (None, False)  # cos 0.577 < 0.9
    assert [m[0] for m in results[0].matches] == ["x", "y"]
    no_threshold = _gallery(dim=3)
    no_threshold.add(["x"], near)
    assert no_threshold.search(far, ["q"])[0].identity == "x"
    with pytest.raises(ValueError, match=r"the gallery is empty"):
        _gallery(dim=3).search(far, ["q"])


def test_identification_is_the_ijb_scoring_with_unknown_probes_non_mated():
    rng = np.random.default_rng(1)
    centers = _unit(rng.normal(size=(10, 16)))
    gallery = _gallery(dim=16)
    gallery.add([f"id{i}" for i in range(6)], centers[:6])  # ids 6..9 are not enrolled
    truth = rng.integers(0, 10, 200)
    probes = _unit(centers[truth] + 0.3 * rng.normal(size=(200, 16)))
    names = [f"id{i}" for i in truth]
    got = gallery.identification(probes, names)
    expected = ijb_identification(
        probes, np.where(truth < 6, truth, 100 + truth), gallery.templates, np.arange(6)
    )
    assert got.rank == expected.rank and got.tpir_at_fpir == expected.tpir_at_fpir
    assert (got.num_mated, got.num_non_mated) == (int((truth < 6).sum()), int((truth >= 6).sum()))
