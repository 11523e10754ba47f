"""Gallery in memory: templates are normalised sums, add/remove, the search's open-set
decision, and its 1:N metrics (rank-k, TPIR at FPIR with unknown probes as non-mated) checked
against answers known by construction and against a plain-Python restatement of the
definitions, never against the IJB scoring code the gallery calls."""

from __future__ import annotations

import math

import numpy as np
import pytest

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


# ------------------------------------------------------------------ 1:N identification
D = 32
FILLER = D - 1  # a dimension no template uses: it sets a probe's norm without a score


def _probe(scores: dict[int, float]) -> np.ndarray:
    """A unit probe whose cosine to the one-hot template of dimension ``j`` is ``scores[j]``
    (0 elsewhere): the scores on their dimensions, the rest of the norm on :data:`FILLER`."""
    row = np.zeros(D, np.float64)
    for j, score in scores.items():
        row[j] = score
    row[FILLER] = math.sqrt(1.0 - sum(v * v for v in scores.values()))
    return row


def test_identification_metrics_of_probes_whose_answers_are_known():
    """Six enrolled identities, templates e_0 .. e_5. Ten mated probes: six whose mate is the
    best template (scores 0.95 .. 0.60), four with 1, 2, 4 and 5 templates strictly better.
    Twenty probes of four identities not enrolled, best scores 0.88, 0.82, 0.65 and seventeen
    below 0.5.

    rank-k = mated probes with fewer than k better templates / 10: rank-1 6/10, rank-5 9/10
    (all but the one with 5 better), rank-10 10/10. TPIR at FPIR f: the threshold lets at most
    ⌊20·f⌋ non-mated best scores exceed it: f = 0.01, 0 of them, threshold 0.88, so rank-1
    probes above it: 0.95, 0.90 (2/10); f = 0.1, 2 of them, threshold 0.65 (the third best):
    0.95, 0.90, 0.85, 0.80, 0.70 (5/10); the probe at 0.68 is above it but not rank-1."""
    gallery = _gallery(dim=D)
    gallery.add([f"id{i}" for i in range(6)], np.eye(D, dtype=np.float32)[:6])
    mated = [(m, _probe({m: s})) for m, s in enumerate((0.95, 0.90, 0.85, 0.80, 0.70, 0.60))]
    mated += [
        (0, _probe({0: 0.68, 1: 0.70})),  # 1 better
        (2, _probe({2: 0.40, 3: 0.50, 4: 0.55})),  # 2 better
        (5, _probe({5: 0.30, 0: 0.35, 1: 0.35, 2: 0.35, 3: 0.35})),  # 4 better
        (1, _probe({1: 0.20, 0: 0.25, 2: 0.25, 3: 0.25, 4: 0.25, 5: 0.25})),  # 5 better
    ]
    best_non_mated = [0.88, 0.82, 0.65] + [0.10 + 0.02 * i for i in range(17)]  # <= 0.42
    non_mated = [_probe({i % 6: score}) for i, score in enumerate(best_non_mated)]
    probes = np.stack([row for _, row in mated] + non_mated).astype(np.float32)
    names = [f"id{m}" for m, _ in mated] + [f"stranger{i % 4}" for i in range(20)]

    got = gallery.identification(probes, names)
    assert got.rank == {1: 0.6, 5: 0.9, 10: 1.0}
    assert got.tpir_at_fpir == {0.01: 0.2, 0.1: 0.5}
    assert (got.num_mated, got.num_non_mated, got.num_gallery) == (10, 20, 6)
    fewer = gallery.identification(probes, names, fpir_targets=(0.05, 0.5))
    # 0.05: ⌊1⌋ = 1 allowed, threshold 0.82: 0.95, 0.90, 0.85 (3/10); 0.5: 10 allowed, the
    # threshold is the 11th best non-mated score, 0.10 + 0.02·9 = 0.28: all six rank-1 probes
    assert fewer.tpir_at_fpir == {0.05: 0.3, 0.5: 0.6}


def _identification_by_hand(probes, names, enrolled, ranks=(1, 5, 10), fpirs=(0.01, 0.1)):
    """The definitions restated in plain Python: a template is the normalised mean of its
    identity's embeddings; a mated probe's rank counts the templates strictly more similar than
    its mate; the threshold at FPIR f lets at most ⌊f·n⌋ of the n non-mated probes' best scores
    exceed it; TPIR counts mated probes whose mate is the best and above the threshold."""

    def unit(v):
        norm = math.sqrt(sum(x * x for x in v))
        return [x / norm for x in v]

    templates = {}
    for name, rows in enrolled.items():
        mean = [sum(column) / len(rows) for column in zip(*rows, strict=True)]
        templates[name] = unit(mean)
    better, mate_scores, best_non_mated = [], [], []
    for row, name in zip(probes, names, strict=True):
        scores = {t: sum(a * b for a, b in zip(row, v, strict=True)) for t, v in templates.items()}
        if name in templates:
            better.append(sum(1 for s in scores.values() if s > scores[name]))
            mate_scores.append(scores[name])
        else:
            best_non_mated.append(max(scores.values()))
    rank = {k: sum(1 for h in better if h < k) / len(better) for k in ranks}
    ordered = sorted(best_non_mated, reverse=True)
    tpir = {}
    for f in fpirs:
        allowed = math.floor(f * len(ordered) + 1e-9)
        threshold = ordered[allowed] if allowed < len(ordered) else -math.inf
        hits = sum(1 for h, s in zip(better, mate_scores, strict=True) if h == 0 and s > threshold)
        tpir[f] = hits / len(better)
    return rank, tpir, len(better), len(best_non_mated)


def test_identification_equals_the_definitions_restated_on_noisy_probes():
    rng = np.random.default_rng(1)
    centers = _unit(rng.normal(size=(10, 16)))
    enrolled = {}  # ids 0..5, two noisy embeddings each; ids 6..9 are not enrolled
    gallery = _gallery(dim=16)
    for i in range(6):
        rows = _unit(centers[[i, i]] + 0.2 * rng.normal(size=(2, 16)))
        enrolled[f"id{i}"] = rows.astype(np.float64).tolist()
        gallery.add([f"id{i}", f"id{i}"], rows)
    truth = rng.integers(0, 10, 300)
    probes = _unit(centers[truth] + 0.45 * rng.normal(size=(300, 16)))
    names = [f"id{i}" for i in truth]
    rank, tpir, mated, non_mated = _identification_by_hand(
        probes.astype(np.float64).tolist(), names, enrolled
    )
    got = gallery.identification(probes, names)
    assert (got.num_mated, got.num_non_mated) == (mated, non_mated)
    assert got.rank == pytest.approx(rank) and got.tpir_at_fpir == pytest.approx(tpir)
    assert 0 < rank[1] < rank[5] <= 1  # not a trivial problem: some probes miss
    assert 0 < tpir[0.01] < tpir[0.1] < rank[1]
