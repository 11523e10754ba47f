"""IJB-C evaluation throughput: template pooling and 1:1 pair scoring at IJB-C's size on
simulated features, marginface (evaluation/ijb/) beside the same steps done as insightface's
eval_ijbc.py does them (its per-template loop and its batched pair loop, restated below), with
the numbers checked equal; and images/s of embedding aligned loose crops (alignment, flip test).

    flock /tmp/marginface-heavy.lock .venv/bin/python benchmarks/bench_ijb.py

Sizes (IJB-C 1:1): 469,375 images, 23,124 templates, 15,658,489 pairs (19,557 genuine), 512-D.
``--scale 0.1`` runs a tenth of everything (a quick check).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from functools import partial
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_decode import machine_lines
from marginface.evaluation.ijb import (
    IJB_FAR_TARGETS,
    ijb_verification,
    template_features,
    template_pair_scores,
)

IMAGES, TEMPLATES, SUBJECTS = 469_375, 23_124, 3_531
GENUINE, IMPOSTOR = 19_557, 15_638_932


def simulate(scale: float, dim: int, noise: float = 6.0, seed: int = 0):
    """Image features (float32, as insightface's img_input_feats), templates, medias, pairs."""
    rng = np.random.default_rng(seed)
    images, templates_n = int(IMAGES * scale), int(TEMPLATES * scale)
    subjects_n = max(2, int(SUBJECTS * scale))
    subject_of_template = rng.integers(0, subjects_n, templates_n)
    template_ids = np.sort(rng.choice(200_000, templates_n, replace=False))  # sparse ids
    template_of_image = np.sort(rng.integers(0, templates_n, images))
    template_of_image[:templates_n] = np.arange(templates_n)  # every template has an image
    media = np.cumsum(rng.random(images) < 0.3)  # runs of frames from one video
    centers = rng.standard_normal((subjects_n, dim), dtype=np.float32)
    subject_of_image = subject_of_template[template_of_image]
    features = centers[subject_of_image]
    features += noise * rng.standard_normal((images, dim), dtype=np.float32)
    genuine_n, impostor_n = int(GENUINE * scale), int(IMPOSTOR * scale)
    by_subject = np.argsort(subject_of_template, kind="stable")
    first = rng.integers(0, templates_n, genuine_n * 4)
    same = by_subject[
        np.searchsorted(subject_of_template[by_subject], subject_of_template[first])
    ]  # another template of the same subject (or itself)
    ok = same != first
    g1, g2 = first[ok][:genuine_n], same[ok][:genuine_n]
    i1 = rng.integers(0, templates_n, impostor_n)
    i2 = rng.integers(0, templates_n, impostor_n)
    p1, p2 = np.r_[g1, i1], np.r_[g2, i2]
    label = (subject_of_template[p1] == subject_of_template[p2]).astype(np.int64)
    return (
        features,
        template_ids[template_of_image],
        media,
        template_ids[p1],
        template_ids[p2],
        label,
    )


# ------------------------------------------------- eval_ijbc.py's steps, restated (not imported)
def insightface_pooling(img_feats, templates, medias):
    unique_templates = np.unique(templates)
    template_feats = np.zeros((len(unique_templates), img_feats.shape[1]))
    for count_template, uqt in enumerate(unique_templates):
        (ind_t,) = np.where(templates == uqt)
        face_norm_feats = img_feats[ind_t]
        face_medias = medias[ind_t]
        unique_medias, unique_media_counts = np.unique(face_medias, return_counts=True)
        media_norm_feats = []
        for u, ct in zip(unique_medias, unique_media_counts, strict=True):
            (ind_m,) = np.where(face_medias == u)
            if ct == 1:
                media_norm_feats += [face_norm_feats[ind_m]]
            else:
                media_norm_feats += [np.mean(face_norm_feats[ind_m], axis=0, keepdims=True)]
        template_feats[count_template] = np.sum(np.array(media_norm_feats), axis=0)
    norms = np.sqrt(np.sum(template_feats**2, -1, keepdims=True))  # sklearn's normalize
    return template_feats / norms, unique_templates


def insightface_scores(template_norm_feats, unique_templates, p1, p2):
    template2id = np.zeros((max(unique_templates) + 1, 1), dtype=int)
    for count_template, uqt in enumerate(unique_templates):
        template2id[uqt] = count_template
    score = np.zeros((len(p1),))
    total_pairs = np.array(range(len(p1)))
    batchsize = 100000
    sublists = [total_pairs[i : i + batchsize] for i in range(0, len(p1), batchsize)]
    for s in sublists:
        feat1 = template_norm_feats[template2id[p1[s]]]
        feat2 = template_norm_feats[template2id[p2[s]]]
        score[s] = np.sum(feat1 * feat2, -1).flatten()
    return score


def timed(function, *args):
    start = time.perf_counter()
    value = function(*args)
    return time.perf_counter() - start, value


def embedding_rate(images: int, batch: int, workers: int, repeats: int) -> list[float]:
    """images/s of embed_ijb_images (read, align, flip test) with iresnet18 on synthetic crops."""
    import tempfile

    import cv2

    from marginface.data.align import ARCFACE_TEMPLATE
    from marginface.data.ijb import IjbLayout
    from marginface.models import create_model
    from marginface.train.evaluation.ijb_embedding import embed_ijb_images, run_embedder

    rng = np.random.default_rng(1)
    with tempfile.TemporaryDirectory() as folder:
        names, marks = [], []
        for k in range(images):
            canvas = rng.integers(0, 256, (160, 160, 3), dtype=np.uint8)
            cv2.imwrite(os.path.join(folder, f"{k}.jpg"), canvas)
            names.append(f"{k}.jpg")
            marks.append(ARCFACE_TEMPLATE * 1.2 + rng.uniform(5, 20, 2))
        layout = IjbLayout(
            image_dir=Path(folder),
            names=names,
            landmarks=np.array(marks, dtype=np.float32),
            face_scores=np.ones(images, np.float32),
            templates=np.arange(images),
            medias=np.arange(images),
            pair_first=np.zeros(1, np.int64),
            pair_second=np.zeros(1, np.int64),
            pair_label=np.zeros(1, bool),
        )
        model = create_model("iresnet18", embedding_dim=512, in_channels=3, image_size=112)
        embed = run_embedder(model, "cpu")
        rates = []
        for _ in range(repeats):
            seconds, _ = timed(
                lambda: embed_ijb_images(layout, embed, batch_size=batch, workers=workers)
            )
            rates.append(images / seconds)
        return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3, help="runs of marginface's steps")
    parser.add_argument("--embed-images", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    features, templates, medias, p1, p2, label = simulate(args.scale, args.dim)
    print(
        f"simulated: {features.shape[0]} images, {np.unique(templates).shape[0]} templates, "
        f"{p1.shape[0]} pairs ({int(label.sum())} genuine), {features.shape[1]}-D"
    )
    pool_times, score_times, score32_times = [], [], []
    for _ in range(args.repeats):
        t, (ids, pooled) = timed(template_features, features, templates, medias)
        pool_times.append(t)
        t, scores = timed(template_pair_scores, ids, pooled, p1, p2)
        score_times.append(t)
        single = partial(template_pair_scores, precision="float32")
        t, scores32 = timed(single, ids, pooled, p1, p2)
        score32_times.append(t)
    t_pool_if, (feats_if, ids_if) = timed(insightface_pooling, features, templates, medias)
    t_score_if, scores_if = timed(insightface_scores, feats_if, ids_if, p1, p2)
    assert np.array_equal(ids, ids_if)
    pooled_gap = float(np.abs(pooled - feats_if).max())
    score_gap = float(np.abs(scores - scores_if).max())
    theirs = ijb_verification(scores_if, label == 1).tar_at_far
    pool_m, score_m = statistics.median(pool_times), statistics.median(score_times)
    print("| step | eval_ijbc.py's way (s) | marginface (s, median) | speed-up |")
    print("|---|---|---|---|")
    print(f"| template pooling | {t_pool_if:.2f} | {pool_m:.2f} | {t_pool_if / pool_m:.1f}x |")
    score32_m = statistics.median(score32_times)
    print(f"| pair scores | {t_score_if:.2f} | {score_m:.2f} | {t_score_if / score_m:.1f}x |")
    print(
        f"| pair scores, precision float32 | {t_score_if:.2f} | {score32_m:.2f} | "
        f"{t_score_if / score32_m:.1f}x |"
    )
    total_if, total = t_pool_if + t_score_if, pool_m + score_m
    print(f"| both | {total_if:.2f} | {total:.2f} | {total_if / total:.1f}x |")
    print(
        f"| both, float32 scores | {total_if:.2f} | {pool_m + score32_m:.2f} | "
        f"{total_if / (pool_m + score32_m):.1f}x |"
    )
    print(
        f"largest difference from eval_ijbc.py's: template features {pooled_gap:.2e}, "
        f"scores {score_gap:.2e}, float32 scores {float(np.abs(scores32 - scores_if).max()):.2e}"
    )
    for label_name, values in (("float64", scores), ("float32", scores32)):
        ours = ijb_verification(values, label == 1).tar_at_far
        same = all(abs(ours[f] - theirs[f]) < 1e-12 for f in IJB_FAR_TARGETS)
        print(
            f"TAR@FAR (1e-6 ... 1e-1), marginface {label_name}: "
            + ", ".join(f"{ours[f]:.4f}" for f in IJB_FAR_TARGETS)
            + (
                " (identical to eval_ijbc.py's way)"
                if same
                else "; eval_ijbc.py's way: "
                + ", ".join(f"{theirs[f]:.4f}" for f in IJB_FAR_TARGETS)
            )
        )
    if args.embed_images:
        for workers in (0, 2):
            rates = embedding_rate(args.embed_images, 64, workers, 3)
            print(
                f"embedding (iresnet18, read + align + flip test, batch 64, {workers} workers): "
                f"{statistics.median(rates):.1f} images/s (median of 3)"
            )
    command = "flock /tmp/marginface-heavy.lock .venv/bin/python benchmarks/bench_ijb.py"
    if args.scale != 1.0:
        command += f" --scale {args.scale}"
    for line in machine_lines(load_before, os.getloadavg(), command):
        print(line)


if __name__ == "__main__":
    main()
