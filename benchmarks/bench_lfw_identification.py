"""LFW identification end to end (issue 38): rank-1 and open-set TPIR of a model trained here.

The model is the docs' LFW recipe for one test fold (``seed-cnn-bn``, 32x32 grey, ArcFace
s = 30 m = 0.5, D = 128, ``hflip = 0.5``, flip-averaged test embeddings, 10 epochs, identities
with >= 2 images), trained through ``bench_verification.py``'s code path (the same
``TrainConfig`` and ``Trainer``), or an existing run given with ``--run``.

On the test fold's images (the images of its 600 pairs; their identities are disjoint from
training), in the loader's file order (sorted by name, then image number):

* gallery: the first image of every identity with >= 2 test images;
* mated probes: the other images of those identities;
* non-mated probes: the images of identities with exactly one test image (not in the gallery).

Embeddings come from :class:`marginface.FaceModel` opened on the run folder (its description
decides the flip test), fed the loader's 32x32 grey ``uint8`` crops (centre 150 px of the
250 px deep-funneled image). The library's :class:`~marginface.inference.Gallery` scores them
(``Gallery.identification``: the IJB 1:N code, open-set rule). The same numbers are then
recomputed from the top-1 answers of the exact index, once with torch (no FAISS) and once
with FAISS ``IndexFlatIP``: the three must agree.

Usage (from the repository root)::

    PYTHONPATH=src python benchmarks/bench_lfw_identification.py --threads 1
    PYTHONPATH=src python benchmarks/bench_lfw_identification.py --run RUN_FOLDER
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_verification as bv
from bench_decode import machine_lines
from marginface import FaceModel
from marginface.evaluation import pair_scores, verification_metrics
from marginface.inference.gallery import Gallery
from marginface.inference.index import TemplateIndex, have_faiss
from marginface.train import Trainer, load_bundle
from marginface.train.config import load_config

FPIR_TARGETS = (0.01, 0.1)


def recipe_argv(args: argparse.Namespace) -> list[str]:
    """``bench_verification.py``'s arguments for the docs' LFW recipe (ArcFace only)."""
    argv = [
        "--dataset", "lfw", "--folds", str(args.fold), "--losses", "arcface",
        "--epochs", str(args.epochs), "--image-size", "32", "--min-images-per-identity", "2",
        "--augment", "hflip=0.5", "--flip", "--out", str(args.out),
        "--tag", f"lfw_identification_fold{args.fold}",
    ]  # fmt: skip
    if args.threads is not None:
        argv += ["--threads", str(args.threads)]
    return argv


def train(args: argparse.Namespace) -> Path:
    """Train the recipe's ArcFace model for ``args.fold``; returns the run folder."""
    recipe = bv.parse_args(recipe_argv(args))
    config = bv.make_config(recipe, "arcface", args.fold)
    run_dir = args.out / "runs" / f"lfw_identification_fold{args.fold}" / "arcface"
    bundle = load_bundle(config)
    began = time.perf_counter()
    history = Trainer(config, run_dir, bundle=bundle).fit(overwrite=True)
    seconds = time.perf_counter() - began
    print(
        f"trained {run_dir} in {seconds:.0f} s ({len(history)} epochs, "
        f"final loss {history[-1]['loss']:.3f})",
        flush=True,
    )
    return run_dir


def split(names: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows of the gallery, mated probes and non-mated probes (``names`` in file order)."""
    count: dict[str, int] = {}
    for name in names:
        count[name] = count.get(name, 0) + 1
    gallery, mated, non_mated, seen = [], [], [], set()
    for row, name in enumerate(names):
        if count[name] == 1:
            non_mated.append(row)
        elif name not in seen:
            seen.add(name)
            gallery.append(row)
        else:
            mated.append(row)
    return (np.asarray(x, np.int64) for x in (gallery, mated, non_mated))  # type: ignore[return-value]


def from_top1(
    scores: np.ndarray, found: np.ndarray, mate: np.ndarray, mated: np.ndarray
) -> dict[str, float]:
    """Rank-1 and open-set TPIR at each FPIR from each probe's best template only.

    ``found``/``scores``: each probe's top-1 template and cosine; ``mate``: the probe's gallery
    row (mated probes); ``mated``: which probes are mated. The FPIR threshold is the
    ``floor(f * n)``-th best non-mated top-1 score (at most that many false alarms), the rule
    of ``ijb_identification``'s open-set branch.
    """
    hit = found[mated] == mate[mated]
    out = {"rank1": float(hit.mean())}
    best_non_mated = np.sort(scores[~mated])[::-1]
    for f in FPIR_TARGETS:
        allowed = math.floor(f * best_non_mated.shape[0] + 1e-9)
        threshold = best_non_mated[allowed] if allowed < best_non_mated.shape[0] else -np.inf
        out[f"tpir@fpir={f:.0e}"] = float(np.mean(hit & (scores[mated] > threshold)))
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, default=None, help="reuse this trained run folder")
    parser.add_argument("--fold", type=int, default=0, help="LFW test fold (training: 0..9)")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", type=Path, default=bv.DEFAULT_OUT)
    args = parser.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    began = time.perf_counter()
    run = args.run if args.run is not None else train(args)

    config = load_config(run / "config.toml")
    bundle = load_bundle(config)
    test = bundle.test
    names = [test.class_names[int(label)] for label in test.labels]
    pixels = torch.from_numpy(np.round(test.images * 255).astype(np.uint8))  # (N, C, S, S)
    model = FaceModel(run)
    start = time.perf_counter()
    embeddings = model.embed(pixels)
    embed_seconds = time.perf_counter() - start
    print(
        f"run {run}: {config.loss} {config.loss_options}, {config.model}, "
        f"{config.image_size} px, flip test {model.flip}; embedded {len(names)} test images "
        f"of fold {config.dataset_options.get('fold')} in {embed_seconds:.1f} s",
        flush=True,
    )
    scores = pair_scores(embeddings, bundle.pairs.index)
    check = verification_metrics(scores, bundle.pairs.same, folds=None)
    print(
        f"cross-check, the fold's 600 pairs from FaceModel's embeddings: accuracy "
        f"{100 * check.accuracy:.2f} ± {100 * check.accuracy_std:.2f} %, AUC {check.auc:.4f}"
    )

    gallery_rows, mated_rows, non_mated_rows = split(names)
    gallery = Gallery(description=model.description, index_kind="exact")
    gallery.add([names[r] for r in gallery_rows], embeddings[gallery_rows])
    probe_rows = np.r_[mated_rows, non_mated_rows]
    probe_names = [names[r] for r in probe_rows]
    metrics = gallery.identification(embeddings[probe_rows], probe_names, fpir_targets=FPIR_TARGETS)
    results = {"Gallery.identification (IJB 1:N code, open-set)": metrics.as_dict()}

    position = {name: i for i, name in enumerate(gallery.identities)}
    mated = np.asarray([name in position for name in probe_names])
    mate = np.asarray([position.get(name, -1) for name in probe_names], np.int64)
    top1 = {}
    backends = [("exact index, torch (no FAISS)", False)]
    if have_faiss():
        backends.append(("exact index, FAISS IndexFlatIP", True))
    for label, use_faiss in backends:
        index = TemplateIndex(gallery.templates, kind="exact", use_faiss=use_faiss)
        best, found = index.search(embeddings[probe_rows], 1)
        top1[label] = (best[:, 0], found[:, 0])
        results[label] = from_top1(best[:, 0], found[:, 0], mate, mated)
    if len(top1) == 2:
        (s_t, f_t), (s_f, f_f) = top1.values()
        print(
            f"torch vs FAISS: same top-1 template for {int((f_t == f_f).sum())} of "
            f"{len(f_t)} probes, largest score difference {float(np.abs(s_t - s_f).max()):.2e}"
        )

    print(
        f"\ngallery {metrics.num_gallery} identities (one image each), "
        f"{metrics.num_mated} mated probes, {metrics.num_non_mated} non-mated probes "
        f"({len(non_mated_rows)} identities with one test image)\n"
    )
    print("| scored by | rank-1 | TPIR @ FPIR 0.01 | TPIR @ FPIR 0.1 |")
    print("| --- | --- | --- | --- |")
    for label, row in results.items():
        print(
            f"| {label} | {100 * row['rank1']:.2f} % | {100 * row['tpir@fpir=1e-02']:.2f} % | "
            f"{100 * row['tpir@fpir=1e-01']:.2f} % |"
        )
    print(f"\nwall {time.perf_counter() - began:.0f} s")
    command = "PYTHONPATH=src python benchmarks/bench_lfw_identification.py " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    for line in machine_lines(load_before, os.getloadavg(), command):
        print(line)


if __name__ == "__main__":
    main()
