"""The whole protocol (:func:`marginface.evaluation.ijb.evaluate_ijb`) on a small IJB-layout
folder built from ORL faces in ../shared/data (``tests/_ijb_folder.py``), against insightface's
protocol restated by hand."""

from __future__ import annotations

import numpy as np
import pytest

from marginface.data.ijb import read_ijb_layout
from marginface.evaluation.ijb import (
    IJB_FAR_TARGETS,
    evaluate_ijb,
)
from marginface.train.evaluation.ijb_embedding import embed_ijb_images
from tests._ijb_folder import projection_embedder
from tests.evaluation.ijb._by_hand import (
    hand_1n_insightface,
    hand_image_features,
    hand_scores,
    hand_tar_at_far,
    hand_templates,
)

cv2 = pytest.importorskip("cv2")
sklearn_metrics = pytest.importorskip("sklearn.metrics")
PIL = pytest.importorskip("PIL.Image")


def test_ijb_folder_end_to_end_equals_the_protocol_restated(ijb_folder):
    root, _ = ijb_folder
    layout = read_ijb_layout(root, "IJBC")
    embeddings, flipped = embed_ijb_images(layout, projection_embedder(), batch_size=8, workers=2)
    result = evaluate_ijb(layout, embeddings, flipped)
    img_feats = np.hstack([embeddings, flipped]).astype(np.float64)
    x = hand_image_features(img_feats, layout.face_scores.astype(np.float64))
    feats, ids = hand_templates(x, layout.templates, layout.medias)
    scores = hand_scores(feats, ids, layout.pair_first, layout.pair_second)
    np.testing.assert_allclose(result.scores, scores, rtol=1e-10, atol=1e-12)
    label = layout.pair_label.astype(int)
    expected = hand_tar_at_far(label, result.scores, IJB_FAR_TARGETS)
    assert result.verification.tar_at_far == pytest.approx(expected)
    # 1:N, insightface's rule on G1 ∪ G2 (the mixed probes are all mated there)
    by_id = {t: k for k, t in enumerate(ids)}
    gallery_t = np.r_[layout.galleries["G1"][0], layout.galleries["G2"][0]]
    gallery_s = np.r_[layout.galleries["G1"][1], layout.galleries["G2"][1]]
    probe_t, probe_s = layout.probes
    mask = [int(np.flatnonzero(gallery_s == s)[0]) for s in probe_s]
    ranks, tpir = hand_1n_insightface(
        feats[[by_id[t] for t in probe_t]], feats[[by_id[t] for t in gallery_t]], mask
    )
    combined = result.identification["G1+G2"]
    assert combined.rank[1] == pytest.approx(ranks[1])
    assert combined.tpir_at_fpir == pytest.approx(tpir)
    assert result.identification["G1"].num_mated == 4
    assert result.identification["G1"].num_non_mated == 4
