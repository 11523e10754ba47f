"""IJB-B/C 1:1 and 1:N, checked against insightface's eval_ijbc.py / ijb_1n.py protocol restated
below by hand (their per-template loops, scikit-learn's ROC and their nearest-FPR pick, their
top-k and heap threshold), on random features and on a small IJB-layout folder built from ORL
faces in ../shared/data (known templates, media, pairs, and landmarks from a known transform)."""

from __future__ import annotations

import heapq
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from marginface.cli import main
from marginface.data.ijb import embed_ijb_images, evaluate_ijb, read_ijb_layout
from marginface.evaluation.ijb import (
    IJB_FAR_TARGETS,
    ijb_identification,
    ijb_image_features,
    ijb_verification,
    template_features,
    template_pair_scores,
)

cv2 = pytest.importorskip("cv2")
sklearn_metrics = pytest.importorskip("sklearn.metrics")
PIL = pytest.importorskip("PIL.Image")

FIXTURE_RUN = Path(__file__).resolve().parents[1] / "fixtures" / "run_v1"


# ------------------------------------------------------------ the protocol, restated by hand
def hand_image_features(img_feats, faceness, flip=True, norm=True, det=True):
    """eval_ijbc.py: img_feats holds [as-is | flipped] side by side."""
    half = img_feats.shape[1] // 2
    x = img_feats[:, :half] + img_feats[:, half:] if flip else img_feats[:, :half]
    if not norm:
        x = x / np.sqrt(np.sum(x**2, -1, keepdims=True))
    if det:
        x = x * faceness[:, np.newaxis]
    return x


def hand_templates(img_feats, templates, medias):
    unique_templates = np.unique(templates)
    template_feats = np.zeros((len(unique_templates), img_feats.shape[1]))
    for count, uqt in enumerate(unique_templates):
        (ind_t,) = np.where(templates == uqt)
        face_feats = img_feats[ind_t]
        face_medias = medias[ind_t]
        unique_medias, counts = np.unique(face_medias, return_counts=True)
        media_feats = []
        for u, ct in zip(unique_medias, counts, strict=True):
            (ind_m,) = np.where(face_medias == u)
            if ct == 1:
                media_feats += [face_feats[ind_m]]
            else:
                media_feats += [np.mean(face_feats[ind_m], axis=0, keepdims=True)]
        template_feats[count] = np.sum(np.array(media_feats), axis=0)
    norms = np.sqrt(np.sum(template_feats**2, -1, keepdims=True))
    return template_feats / norms, unique_templates


def hand_scores(template_feats, unique_templates, p1, p2, batchsize=7):
    template2id = np.zeros((max(unique_templates) + 1, 1), dtype=int)
    for count, uqt in enumerate(unique_templates):
        template2id[uqt] = count
    score = np.zeros((len(p1),))
    total = np.array(range(len(p1)))
    for s in [total[i : i + batchsize] for i in range(0, len(p1), batchsize)]:
        feat1 = template_feats[template2id[p1[s]]]
        feat2 = template_feats[template2id[p2[s]]]
        score[s] = np.sum(feat1 * feat2, -1).flatten()
    return score


def hand_tar_at_far(label, score, x_labels):
    fpr, tpr, _ = sklearn_metrics.roc_curve(label, score)
    fpr, tpr = np.flipud(fpr), np.flipud(tpr)
    row = {}
    for x in x_labels:
        _, min_index = min(list(zip(abs(fpr - x), range(len(fpr)), strict=True)))
        row[x] = tpr[min_index]
    return row


def hand_conservative(label, score, x_labels):
    fpr, tpr, _ = sklearn_metrics.roc_curve(label, score, drop_intermediate=False)
    impostors = int((np.asarray(label) == 0).sum())
    return {x: (tpr[fpr <= x].max() if impostors * x >= 1 else None) for x in x_labels}


def hand_1n_insightface(query_feats, gallery_feats, mask, fars=(0.01, 0.1)):
    query_num, gallery_num = query_feats.shape[0], gallery_feats.shape[0]
    similarity = np.dot(query_feats, gallery_feats.T)
    top_inds = np.argsort(-similarity, kind="stable")
    ranks = {k: np.mean([mask[i] in top_inds[i, :k] for i in range(query_num)]) for k in (1, 5)}
    required_topk = [math.ceil(query_num * x) for x in fars]
    top_sims = similarity.copy()
    pos_sims = []
    for i in range(query_num):
        pos_sims.append(top_sims[i, mask[i]])
        top_sims[i, mask[i]] = -2.0
    pos_sims = np.array(pos_sims)
    neg_sims = top_sims[np.where(top_sims > -2.0)]
    assert len(neg_sims) == query_num * gallery_num - query_num
    neg_sims = heapq.nlargest(max(required_topk), neg_sims)
    tpir = {
        far: np.sum(pos_sims > neg_sims[pos - 1]) / query_num
        for far, pos in zip(fars, required_topk, strict=True)
    }
    return ranks, tpir


def hand_1n_open_set(query_feats, query_ids, gallery_feats, gallery_ids, fpir):
    """NIST's open-set TPIR at FPIR: the smallest threshold letting at most a fraction fpir of
    the non-mated probes' best scores exceed it; a mated probe counts when its mate is first
    and above it."""
    similarity = query_feats @ gallery_feats.T
    gallery_ids = list(gallery_ids)
    mated = [i for i, s in enumerate(query_ids) if s in gallery_ids]
    non_mated = [i for i, s in enumerate(query_ids) if s not in gallery_ids]
    best = sorted((similarity[i].max() for i in non_mated), reverse=True)
    candidates = [-np.inf, *best]
    threshold = min(t for t in candidates if sum(b > t for b in best) <= fpir * len(best) + 1e-9)
    hits = 0
    for i in mated:
        mate = gallery_ids.index(query_ids[i])
        first = similarity[i].max() == similarity[i, mate]
        hits += bool(first and similarity[i, mate] > threshold)
    return hits / len(mated)


# ------------------------------------------------------------------------ random features
def _random_protocol(seed=0, dim=24, subjects=30):
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((subjects, dim))
    templates, medias, subject_of_template = [], [], {}
    tid, mid = 100, 5000
    for subject in range(subjects):
        for _ in range(3):  # three templates per subject
            subject_of_template[tid] = subject
            for _ in range(rng.integers(1, 4)):  # media
                for _ in range(rng.integers(1, 4)):  # frames
                    templates.append(tid)
                    medias.append(mid)
                mid += rng.integers(1, 3)
            tid += rng.integers(1, 4)
    templates, medias = np.array(templates), np.array(medias)
    subject_of_image = np.array([subject_of_template[t] for t in templates])
    n = templates.shape[0]
    as_is = 10 * (centers[subject_of_image] + 1.3 * rng.standard_normal((n, dim)))
    flipped = as_is + 3 * rng.standard_normal((n, dim))
    faceness = rng.uniform(0.5, 1.0, size=n)
    ids = np.array(sorted(subject_of_template))
    p1, p2 = np.triu_indices(ids.shape[0], 1)
    p1, p2 = ids[p1], ids[p2]
    label = np.array(
        [subject_of_template[a] == subject_of_template[b] for a, b in zip(p1, p2, strict=True)]
    )
    return (
        as_is,
        flipped,
        faceness,
        templates,
        medias,
        p1,
        p2,
        label.astype(int),
        subject_of_template,
    )


@pytest.mark.parametrize(
    ("flip", "norm", "det"),
    [(True, True, True), (False, True, True), (True, False, True), (True, True, False)],
)
def test_1_to_1_equals_the_protocol_restated(flip, norm, det):
    as_is, flipped, faceness, templates, medias, p1, p2, label, _ = _random_protocol()
    x = ijb_image_features(as_is, flipped, faceness, flip=flip, norm_score=norm, detector_score=det)
    ids, pooled = template_features(x, templates, medias)
    scores = template_pair_scores(ids, pooled, p1, p2, block=16)
    hand_x = hand_image_features(
        np.hstack([as_is, flipped]), faceness, flip=flip, norm=norm, det=det
    )
    hand_feats, hand_ids = hand_templates(hand_x, templates, medias)
    expected = hand_scores(hand_feats, hand_ids, p1, p2)
    np.testing.assert_array_equal(ids, hand_ids)
    np.testing.assert_allclose(pooled, hand_feats, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(scores, expected, rtol=1e-12, atol=1e-13)
    single = template_pair_scores(ids, pooled, p1, p2, block=16, precision="float32")
    np.testing.assert_allclose(single, expected, atol=1e-6)
    # the metrics on the hand-made scores (ours and theirs would round differently apart)
    metrics = ijb_verification(expected, label == 1)
    targets = [1e-3, 1e-2, 1e-1]
    assert metrics.tar_at_far == pytest.approx(hand_tar_at_far(label, expected, IJB_FAR_TARGETS))
    conservative = hand_conservative(label, expected, targets)
    for t in targets:
        assert metrics.tar_at_far_conservative[t] == pytest.approx(conservative[t])
    assert metrics.tar_at_far_conservative[1e-6] is None  # 3600-odd impostor pairs
    assert 0.3 < metrics.tar_at_far[1e-2] < 1.0


def test_pooling_in_small_chunks_and_float32(monkeypatch):
    import marginface.evaluation.ijb as ijb

    as_is, flipped, faceness, templates, medias, *_ = _random_protocol(3)
    x = ijb_image_features(as_is, flipped, faceness).astype(np.float32)
    monkeypatch.setattr(ijb, "_CHUNK_ROWS", 5)
    ids, pooled = template_features(x, templates, medias)
    hand_feats, hand_ids = hand_templates(x.astype(np.float64), templates, medias)
    np.testing.assert_array_equal(ids, hand_ids)
    np.testing.assert_allclose(pooled, hand_feats, rtol=1e-12, atol=1e-13)


def test_the_nearest_point_rule_on_ties_and_collinear_points():
    # scores with ties and equal steps (scikit-learn drops the collinear middle points)
    rng = np.random.default_rng(1)
    scores = np.round(rng.standard_normal(4000), 1)
    label = (rng.random(4000) < 0.3).astype(int)
    scores[label == 1] += 1.0
    ours = ijb_verification(scores, label == 1, (1e-3, 3e-3, 0.01, 0.05, 0.1, 0.5))
    expected = hand_tar_at_far(label, scores, (1e-3, 3e-3, 0.01, 0.05, 0.1, 0.5))
    assert ours.tar_at_far == pytest.approx(expected)


def test_1_to_n_equals_the_protocol_restated():
    as_is, flipped, faceness, templates, medias, *_, subject_of_template = _random_protocol(2)
    x = ijb_image_features(as_is, flipped, faceness)
    ids, pooled = template_features(x, templates, medias)
    subjects = np.array([subject_of_template[t] for t in ids])
    first = np.array([np.flatnonzero(subjects == s)[0] for s in range(30)])  # gallery rows
    probes = np.setdiff1d(np.arange(ids.shape[0]), first)
    # insightface's rule: gallery of every subject (G1 ∪ G2), every probe mated
    result = ijb_identification(
        pooled[probes], subjects[probes], pooled[first], subjects[first], rule="insightface"
    )
    mask = [int(np.flatnonzero(subjects[first] == s)[0]) for s in subjects[probes]]
    ranks, tpir = hand_1n_insightface(pooled[probes], pooled[first], mask)
    assert result.rank[1] == pytest.approx(ranks[1]) and result.rank[5] == pytest.approx(ranks[5])
    assert result.tpir_at_fpir == pytest.approx(tpir)
    # open set: a gallery of half the subjects (G1), the same probes
    half = first[:15]
    open_set = ijb_identification(pooled[probes], subjects[probes], pooled[half], subjects[half])
    assert (open_set.num_mated, open_set.num_non_mated) == (30, 30)
    for fpir in (0.01, 0.1, 0.3):
        expected = hand_1n_open_set(
            pooled[probes], subjects[probes], pooled[half], subjects[half], fpir
        )
        got = ijb_identification(
            pooled[probes], subjects[probes], pooled[half], subjects[half], fpir_targets=(fpir,)
        )
        assert got.tpir_at_fpir[fpir] == pytest.approx(expected)


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="flipped must be given"):
        ijb_image_features(np.ones((3, 4)), None, np.ones(3))
    with pytest.raises(ValueError, match="face_scores must have length 3"):
        ijb_image_features(np.ones((3, 4)), np.ones((3, 4)), np.ones(2))
    with pytest.raises(ValueError, match="first names template 7, which has no image"):
        template_pair_scores(np.array([1, 2]), np.eye(2), np.array([7]), np.array([1]))
    with pytest.raises(ValueError, match="each subject once"):
        ijb_identification(np.eye(2), [1, 2], np.eye(2), [1, 1])
    with pytest.raises(ValueError, match="rule must be"):
        ijb_identification(np.eye(2), [1, 2], np.eye(2), [1, 2], rule="nist")


# ------------------------------------------------------------ the IJB folder (conftest.py)
def _projection_embedder(dim=37):
    """A fixed "backbone": 8×8 average pooling then a random projection, any size D."""
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(3 * 14 * 14, dim, generator=generator, dtype=torch.float64)

    def embed(x: torch.Tensor) -> torch.Tensor:
        pooled = torch.nn.functional.avg_pool2d(x.double(), 8).reshape(x.shape[0], -1)
        return pooled @ weight

    return embed


def test_layout_alignment_and_cache(ijb_folder, tmp_path):
    root, originals = ijb_folder
    layout = read_ijb_layout(root, "IJBC")
    assert len(layout.names) == 32 and layout.pair_label.sum() == 8
    assert set(layout.galleries) == {"G1", "G2"} and layout.probes[0].shape == (8,)
    crops = []
    embed = _projection_embedder()

    def recording(x):
        crops.append(x)
        return embed(x)

    embeddings, flipped = embed_ijb_images(
        layout, recording, batch_size=16, cache=tmp_path / "f.npz"
    )
    assert embeddings.shape == (32, 37) and flipped.shape == (32, 37)
    # the aligned crop is the face the loose crop was made from (the known transform undone)
    first = ((crops[0][0].permute(1, 2, 0).numpy() * 0.5 + 0.5) * 255).round()
    original = originals[layout.names[0]].astype(np.float64)
    assert np.abs(first - original)[8:-8, 8:-8].mean() < 6.0

    # a second evaluation reads the cache and embeds nothing
    def refuse(x):
        raise AssertionError("embedded again")

    again, again_flipped = embed_ijb_images(layout, refuse, cache=tmp_path / "f.npz")
    np.testing.assert_array_equal(again, embeddings)
    np.testing.assert_array_equal(again_flipped, flipped)


def test_ijb_folder_end_to_end_equals_the_protocol_restated(ijb_folder):
    root, _ = ijb_folder
    layout = read_ijb_layout(root, "IJBC")
    embeddings, flipped = embed_ijb_images(layout, _projection_embedder(), batch_size=8, workers=2)
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


def test_layout_errors_are_clear(ijb_folder, tmp_path):
    root, _ = ijb_folder
    with pytest.raises(ValueError, match="target must be one of IJBB, IJBC"):
        read_ijb_layout(root, "IJBA")
    broken = tmp_path / "IJBC"
    shutil.copytree(root, broken)
    (broken / "meta" / "ijbc_template_pair_label.txt").unlink()
    with pytest.raises(FileNotFoundError, match="missing template pair file"):
        read_ijb_layout(broken, "IJBC")
    shutil.copy(root / "meta" / "ijbc_template_pair_label.txt", broken / "meta")
    (broken / "loose_crop" / "3.jpg").write_bytes(b"not a jpeg")
    layout = read_ijb_layout(broken, "IJBC")
    for workers in (0, 2):  # a worker's failure arrives as one line, not a traceback
        with pytest.raises(ValueError, match=r"3\.jpg: missing or unreadable$"):
            embed_ijb_images(layout, _projection_embedder(), batch_size=4, workers=workers)


def test_ijb_command(ijb_folder, tmp_path, monkeypatch, capsys):
    root, _ = ijb_folder
    run = tmp_path / "run"
    shutil.copytree(FIXTURE_RUN, run)
    import marginface.data.ijb as ijb_run

    monkeypatch.setattr(ijb_run, "run_embedder", lambda model, device: _projection_embedder())
    assert main(["ijb", str(run), "--data-dir", str(root), "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "ijbc_tar@far=1e-04" in out and "ijbc_G1_rank1" in out
    metrics = json.loads((run / "ijb" / "ijbc_metrics.json").read_text())
    assert (
        json.loads((run / "evaluation.json").read_text())["ijbc_G1+G2_rank1"]
        == metrics["ijbc_G1+G2_rank1"]
    )
    assert (run / "ijb" / "ijbc_roc.png").stat().st_size > 1000
    assert "ijbc_tar@far=1e-04" in (run / "ijb" / "ijbc_report.html").read_text()
    assert (run / "ijb" / "ijbc_features.npz").is_file()
    # a later `marginface evaluate` keeps the IJB numbers beside its own
    assert main(["--quiet", "evaluate", str(run), "--device", "cpu"]) == 0
    evaluated = json.loads((run / "evaluation.json").read_text())
    assert evaluated["ijbc_G1+G2_rank1"] == metrics["ijbc_G1+G2_rank1"]
    assert "accuracy" in evaluated
    # an ablation reuses the cached features and is labelled
    monkeypatch.setattr(ijb_run, "run_embedder", lambda model, device: None)
    assert main(["ijb", str(run), "--data-dir", str(root), "--no-detector-score"]) == 0
    assert (run / "ijb" / "ijbc-nodet_metrics.json").is_file()
    capsys.readouterr()
    assert main(["ijb", str(run), "--data-dir", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err
    assert "no IJB folder" in err and "Traceback" not in err
    # the fixture run's own model takes 8x8 grey digits: one line, no traceback
    monkeypatch.undo()
    status = main(
        ["--quiet", "ijb", str(run), "--data-dir", str(root), "--out", str(tmp_path / "o")]
    )
    err = capsys.readouterr().err
    assert status == 2 and "cannot embed 112x112 RGB face crops" in err
    assert len(err.strip().splitlines()) == 1


def test_ijb_command_on_a_backbone_file(ijb_folder, tmp_path, capsys):
    """``ijb --backbone FILE --model NAME --out DIR``: the file's model embeds the crops (the
    features equal the same model's through the library), no run folder is needed or written."""
    from marginface.data.ijb import run_embedder
    from marginface.models import create_model

    root, _ = ijb_folder
    torch.manual_seed(0)
    model = create_model("mbf", embedding_dim=64, in_channels=3, image_size=112)
    model.eval()
    weights = tmp_path / "backbone.pth"
    torch.save(model.state_dict(), weights)
    out = tmp_path / "out"
    argv = ["--quiet", "ijb", "--backbone", str(weights), "--model", "mbf"]
    argv += ["--embedding-dim", "64", "--data-dir", str(root), "--device", "cpu"]
    assert main([*argv, "--out", str(out)]) == 0
    metrics = json.loads((out / "ijbc_metrics.json").read_text())
    assert not list(tmp_path.glob("**/evaluation.json"))  # no run, no run's evaluation.json
    cached = np.load(out / "ijbc_features.npz")
    layout = read_ijb_layout(root, "IJBC")
    with torch.no_grad():
        expected, expected_flipped = embed_ijb_images(layout, run_embedder(model, "cpu"))
    np.testing.assert_allclose(cached["embeddings"], expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(cached["flipped"], expected_flipped, rtol=1e-5, atol=1e-5)
    result = evaluate_ijb(layout, expected, expected_flipped)
    assert metrics["ijbc_G1_rank1"] == pytest.approx(result.as_dict("ijbc_")["ijbc_G1_rank1"])
    capsys.readouterr()
    for bad, message in [
        (["ijb", "--data-dir", str(root)], "ijb needs RUN, or --backbone"),
        ([*argv], "need --out DIR"),
        ([*argv, "--out", str(out), str(tmp_path)], "leave RUN out"),
        (["ijb", str(tmp_path), "--model", "mbf", "--data-dir", str(root)], "--model goes with"),
    ]:
        assert main(["--quiet", *bad] if bad[0] == "ijb" else bad) == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_insightface_crops_cached_with_the_old_template_are_embedded_again(ijb_folder, tmp_path):
    """The "insightface" crops follow eval_ijbc.py's template now: features cached under the
    key they had before (``KEY|align=insightface``) are not read back for them."""
    root, _ = ijb_folder
    layout = read_ijb_layout(root, "IJBC")
    cache = tmp_path / "f.npz"
    embed = _projection_embedder()
    # the file as the old code left it: written under the old key
    embed_ijb_images(
        layout, embed, cache=cache, cache_key="m|align=insightface", alignment="float64"
    )
    calls = []

    def counting(x):
        calls.append(x.shape[0])
        return embed(x)

    embed_ijb_images(layout, counting, cache=cache, cache_key="m", alignment="insightface")
    assert sum(calls) == 2 * len(layout.names)  # every image and its flip embedded again
    calls.clear()
    embed_ijb_images(layout, counting, cache=cache, cache_key="m", alignment="insightface")
    assert calls == []  # the new key reads back
