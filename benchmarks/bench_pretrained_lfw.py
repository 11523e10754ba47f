"""LFW View 2 (10 folds) with dlib's face recognition ResNet v1, two ways, on the same photos:

* **marginface**: the raw LFW photo → MTCNN (marginface.detect, the most central face) → dlib's
  face chip reproduced from MTCNN's five landmarks (:func:`marginface.data.face_chip.dlib_chip`,
  150 px, padding 0.25) → ``FaceModel("dlib-resnet-v1")`` (marginface's port of the network);
* **dlib**: the same decoded pixels → dlib's HOG detector (one upsampling, the face nearest the
  centre) → its 5-point shape predictor → ``dlib.get_face_chip`` → dlib's own
  ``compute_face_descriptor`` (no jitter).

Each photo is decoded once with Pillow and the same ``uint8`` array goes to both (dlib's JPEG
decoder and Pillow's differ). A photo where a detector finds no face is embedded from a
fallback: for marginface the chip of the median landmarks of the photos where MTCNN found one
(LFW's deep-funneled photos are centred), for dlib the shape predictor run on the median box of
the photos where HOG found one. The accuracy is insightface's/LFW's protocol: for each fold, the
best threshold of the other nine folds (``marginface.evaluation.verification.kfold_accuracy``).

Usage (docs/benchmarks.md)::

    python benchmarks/bench_pretrained_lfw.py --data-dir ../shared/data --work /tmp/lfw-bench \\
        [--pipelines marginface,marginface-flip,dlib] [--limit-pairs N] [--out result.json]

``marginface-flip`` is the same chips with the flip test (each chip's embedding summed with its
mirror's, then normalised); the chips are kept in ``WORK/marginface_chips.npz`` and reused.
"""

from __future__ import annotations

import argparse
import json
import tarfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

from marginface.data.lfw import read_lfw_pairs
from marginface.evaluation.verification import kfold_accuracy

ARCHIVE = "lfw/lfw-deepfunneled.tar.gz"


def _name(person: str, number: int) -> str:
    return f"{person}/{person}_{number:04d}.jpg"


def extract(data_dir: Path, work: Path, names: set[str]) -> Path:
    """The photos ``names`` extracted (once) under ``work/photos``."""
    root = work / "photos"
    missing = {n for n in names if not (root / n).is_file()}
    if missing:
        with tarfile.open(data_dir / ARCHIVE) as archive:
            for member in archive:
                parts = member.name.split("/", 1)
                if len(parts) == 2 and parts[1] in missing and member.isfile():
                    target = root / parts[1]
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(archive.extractfile(member).read())
    return root


def read_rgb(path: Path) -> np.ndarray:
    with Image.open(path) as image:
        return np.asarray(image.convert("RGB"))


def marginface_embeddings(
    photos: list[np.ndarray], *, flip: bool = False, cache: Path | None = None
) -> tuple[np.ndarray, int, float]:
    """``float32[N, 128]`` unit rows, the photos without a face, seconds. ``flip``: the sum of
    the chip's and its mirror's embeddings, normalised (the flip test). ``cache``: the chips
    and misses kept in / read from this ``.npz`` (detection is the slow part)."""
    from marginface.data.face_chip import dlib_chip
    from marginface.data.face_photos import select_faces
    from marginface.detect.choice import load_detector

    start = time.perf_counter()
    if cache is not None and cache.is_file():
        with np.load(cache) as saved:
            chips, misses = saved["chips"], int(saved["misses"])
        return _embed_chips(chips, flip), misses, time.perf_counter() - start
    detector = load_detector("mtcnn")
    landmarks: list[np.ndarray | None] = []
    for begin in range(0, len(photos), 32):
        for image, faces in zip(
            photos[begin : begin + 32], detector.detect(photos[begin : begin + 32]), strict=True
        ):
            chosen = select_faces(faces, image.shape, "central")
            landmarks.append(faces.landmarks[chosen[0]].astype(np.float64) if chosen else None)
    found = [points for points in landmarks if points is not None]
    median = np.median(np.stack(found), axis=0)
    misses = sum(points is None for points in landmarks)
    chips = np.stack(
        [
            dlib_chip(image, median if points is None else points)
            for image, points in zip(photos, landmarks, strict=True)
        ]
    )
    if cache is not None:
        np.savez(cache, chips=chips, misses=misses)
    return _embed_chips(chips, flip), misses, time.perf_counter() - start


def _embed_chips(chips: np.ndarray, flip: bool) -> np.ndarray:
    import torch

    from marginface.inference import FaceModel

    model = FaceModel("dlib-resnet-v1", batch_size=64, flip=flip)
    pixels = torch.from_numpy(chips).permute(0, 3, 1, 2).contiguous()  # (N, 3, 150, 150)
    return model.embed_pixels(pixels).numpy()


def dlib_embeddings(photos: list[np.ndarray]) -> tuple[np.ndarray, int, float]:
    """dlib's own pipeline: ``float32[N, 128]`` unit rows, the photos without a face, seconds."""
    import dlib

    from marginface.models.catalogue import find_pretrained, pretrained_file

    folder = pretrained_file(find_pretrained("dlib-resnet-v1")).parent
    start = time.perf_counter()
    detector = dlib.get_frontal_face_detector()
    predictor = dlib.shape_predictor(str(folder / "shape_predictor_5_face_landmarks.dat"))
    network = dlib.face_recognition_model_v1(
        str(folder / "dlib_face_recognition_resnet_model_v1.dat")
    )
    boxes: list[dlib.rectangle | None] = []
    for image in photos:
        found = detector(image, 1)
        if len(found) == 0:
            boxes.append(None)
            continue
        centre = np.array([image.shape[1], image.shape[0]]) / 2
        distances = [
            np.sum(
                (np.array([(r.left() + r.right()) / 2, (r.top() + r.bottom()) / 2]) - centre) ** 2
            )
            for r in found
        ]
        boxes.append(found[int(np.argmin(distances))])
    known = np.array([[r.left(), r.top(), r.right(), r.bottom()] for r in boxes if r is not None])
    median = dlib.rectangle(*(int(np.round(v)) for v in np.median(known, axis=0)))
    misses = sum(r is None for r in boxes)
    out = []
    for image, box in zip(photos, boxes, strict=True):
        shape = predictor(image, median if box is None else box)
        chip = dlib.get_face_chip(image, shape, size=150, padding=0.25)
        vector = np.asarray(network.compute_face_descriptor(chip), dtype=np.float64)
        out.append(vector / np.linalg.norm(vector))
    return np.stack(out).astype(np.float32), misses, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, default=Path("../shared/data"))
    parser.add_argument("--work", type=Path, default=Path("/tmp/lfw-bench"))
    parser.add_argument("--pipelines", default="marginface,dlib")
    parser.add_argument("--limit-pairs", type=int, default=None, help="first N pairs per fold")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    pairs = read_lfw_pairs(args.data_dir / "lfw" / "pairs.txt")
    if args.limit_pairs:
        kept, count = [], {}
        for pair in pairs:
            key = (pair.fold, pair.same)
            if count.get(key, 0) < args.limit_pairs // 2:
                kept.append(pair)
                count[key] = count.get(key, 0) + 1
        pairs = kept
    names = sorted({_name(*p.first) for p in pairs} | {_name(*p.second) for p in pairs})
    root = extract(args.data_dir, args.work, set(names))
    photos = [read_rgb(root / name) for name in names]
    index = {name: i for i, name in enumerate(names)}
    first = np.array([index[_name(*p.first)] for p in pairs])
    second = np.array([index[_name(*p.second)] for p in pairs])
    same = np.array([p.same for p in pairs])
    folds = np.array([p.fold for p in pairs])
    result: dict[str, object] = {"pairs": len(pairs), "photos": len(names)}
    for pipeline in args.pipelines.split(","):
        if pipeline.startswith("marginface"):
            cache = args.work / "marginface_chips.npz"
            flip = pipeline == "marginface-flip"
            embeddings, misses, seconds = marginface_embeddings(photos, flip=flip, cache=cache)
        else:
            embeddings, misses, seconds = dlib_embeddings(photos)
        scores = np.sum(embeddings[first] * embeddings[second], axis=1)
        accuracies, thresholds = kfold_accuracy(scores, same, folds)
        result[pipeline] = {
            "accuracy_mean": float(accuracies.mean()),
            "accuracy_std": float(accuracies.std()),
            "fold_accuracies": accuracies.tolist(),
            "thresholds": thresholds.tolist(),
            "no_face": misses,
            "seconds": seconds,
        }
        np.save(args.work / f"{pipeline}_embeddings.npy", embeddings)
        print(
            f"{pipeline}: {100 * accuracies.mean():.2f} +- {100 * accuracies.std():.2f} % "
            f"({misses} photos without a face, {seconds:.0f} s)",
            flush=True,
        )
    text = json.dumps(result, indent=2)
    if args.out is not None:
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
