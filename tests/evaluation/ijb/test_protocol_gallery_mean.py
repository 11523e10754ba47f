"""The "mean" 1:N row of ``marginface ijb`` (``evaluation.ijb.protocol._mean_of_galleries``) against
insightface's per-gallery script restated (``recognition/_evaluation_/ijb/ijb_evals.py``,
``run_model_test_1N``): each gallery searched by all ``Q`` probes, the rank-k counts of the two
galleries added and divided by ``Q``; the TPIRs averaged."""

from __future__ import annotations

import numpy as np
import pytest

from marginface.evaluation.ijb import ijb_identification
from marginface.evaluation.ijb.protocol import _mean_of_galleries

FPIRS = (0.1, 0.5)


def _their_hits(query, query_ids, gallery, gallery_ids, k):
    """``evaluation_1N``'s top-k count: probes whose subject is in the gallery and whose mate is
    among the k first of ``argsort(similarity)[::-1]``."""
    similarity = query @ gallery.T
    hits = 0
    for index, query_id in enumerate(query_ids):
        if query_id in gallery_ids:
            mate = np.argwhere(gallery_ids == query_id)[0, 0]
            hits += mate in np.argsort(similarity[index])[::-1][:k]
    return hits


def _data(seed: int):
    """40 subjects, G1 the first 25 (so unequal mated counts), G2 the other 15; probes: 70
    templates of random subjects, noisy copies of their subject's direction (no ties)."""
    rng = np.random.default_rng(seed)
    directions = rng.normal(size=(40, 16))
    probe_ids = rng.integers(0, 40, 70)
    probes = directions[probe_ids] + rng.normal(scale=1.2, size=(70, 16))
    probes /= np.linalg.norm(probes, axis=1, keepdims=True)
    galleries = {}
    for name, ids in (("G1", np.arange(25)), ("G2", np.arange(25, 40))):
        features = directions[ids] + rng.normal(scale=0.5, size=(ids.shape[0], 16))
        galleries[name] = (features / np.linalg.norm(features, axis=1, keepdims=True), ids)
    return probes, probe_ids, galleries


@pytest.mark.parametrize("seed", [0, 1])
def test_the_mean_pools_the_rank_counts_over_the_probes(seed):
    probes, probe_ids, galleries = _data(seed)
    ours = {
        name: ijb_identification(probes, probe_ids, g, ids, fpir_targets=FPIRS)
        for name, (g, ids) in galleries.items()
    }
    assert ours["G1"].num_mated != ours["G2"].num_mated  # unequal: the two rules part
    mean = _mean_of_galleries([ours["G1"], ours["G2"]])
    q = probes.shape[0]
    for k in (1, 5, 10):
        hits = [_their_hits(probes, probe_ids, g, ids, k) for g, ids in galleries.values()]
        assert mean.rank[k] == pytest.approx(sum(hits) / q, abs=1e-15)
    averaged = (ours["G1"].rank[1] + ours["G2"].rank[1]) / 2
    assert mean.rank[1] != pytest.approx(averaged, abs=1e-9)  # not the mean of the rates
    for f in FPIRS:
        expected = (ours["G1"].tpir_at_fpir[f] + ours["G2"].tpir_at_fpir[f]) / 2
        assert mean.tpir_at_fpir[f] == pytest.approx(expected, abs=1e-15)
    assert mean.num_mated == q and mean.num_gallery == 40
    assert "rank-k pooled over the probes" in mean.rule


def test_the_issue_s_counts():
    """35 of 60 mated probes found in G1 and 29 of 63 in G2, 123 probes: 64/123 = 0.52033, where
    the mean of the two rates is 0.52183."""
    from marginface.evaluation.ijb import IdentificationMetrics

    g1 = IdentificationMetrics({1: 35 / 60}, {0.1: 0.2}, "open-set", 60, 63, 100)
    g2 = IdentificationMetrics({1: 29 / 63}, {0.1: 0.4}, "open-set", 63, 60, 90)
    mean = _mean_of_galleries([g1, g2])
    assert mean.rank[1] == 64 / 123
    assert round(mean.rank[1], 5) == 0.52033
    assert mean.tpir_at_fpir[0.1] == pytest.approx(0.3)
