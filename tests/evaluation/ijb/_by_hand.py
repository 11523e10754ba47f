"""insightface's IJB-B/C protocol restated by hand (eval_ijbc.py's per-template loops,
scikit-learn's ROC and their nearest-FPR pick, ijb_1n.py's top-k and heap threshold, NIST's
open-set TPIR), and random features in templates and media to check ours against it."""

from __future__ import annotations

import heapq
import math

import numpy as np
import pytest

sklearn_metrics = pytest.importorskip("sklearn.metrics")


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


def random_protocol(seed=0, dim=24, subjects=30):
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
