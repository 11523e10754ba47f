"""Which face of a photo with several is its subject? The face-choice rules of
:func:`marginface.data.face_photos.select_faces` (``largest``, ``central``, ``subject``)
measured on LFW's deep-funneled photos where MTCNN finds more than one face.

    nice -n 10 env PYTHONPATH=src python benchmarks/bench_face_choice.py \\
        --detections /tmp/lfw_mtcnn.npz --embeddings /tmp/lfw_dlib.npz

Step 1 (``--detections``, cached): MTCNN (marginface.detect, facenet-pytorch's weights and
defaults) on all 13,233 photos of ``../shared/data/lfw/lfw-deepfunneled.tar.gz``; boxes,
scores and landmarks saved. Step 2 (``--embeddings``, cached): dlib-resnet-v1 embeddings of
every face of the multi-face photos and of up to 8 single-face photos per identity.

Two ground truths of "the subject" (the person the photo is filed under):

* **geometric**: deep funnelling centres each photo on its subject, so the subject is the
  face whose box holds the photo's centre (125, 125). Photos where no box or more than one box
  holds it are left out (ambiguous). This truth favours ``central`` by construction.
* **identity** (independent of geometry): the face whose dlib-resnet-v1 embedding is nearest
  (cosine) the mean embedding of the same person's single-face photos, counted only when it is
  >= 0.6 (the subject) and every other face of the photo is < 0.5 (not the subject) — the
  truth is then unambiguous. Identities with one photo cannot be checked.

Prints, per truth, how many photos each rule gets right, and the photos where the rules
disagree; then the machine and its load.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import tarfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_decode import machine_lines

ARCHIVE = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "lfw"
SUBJECT_MIN = 0.6  # cosine to the identity's mean: the subject
OTHER_MAX = 0.5  # every other face below this: not the subject
REFERENCES = 8  # single-face photos per identity averaged into its reference


def lfw_photos(wanted: set[str] | None = None):
    """``(name, uint8[250, 250, 3])`` of LFW's photos in archive order (only ``wanted``)."""
    with tarfile.open(ARCHIVE / "lfw-deepfunneled.tar.gz") as tar:
        for member in tar:
            if not (member.isfile() and member.name.endswith(".jpg")):
                continue
            if wanted is not None and member.name not in wanted:
                continue
            data = tar.extractfile(member).read()
            yield member.name, np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def detect_all(path: Path) -> dict[str, np.ndarray]:
    """MTCNN on every photo (cached at ``path``): names, per-face photo index, boxes, scores,
    landmarks."""
    if path.is_file():
        with np.load(path) as data:
            return {k: data[k] for k in data.files}
    from marginface.detect import MTCNN

    detector = MTCNN()
    names, owner, boxes, scores, landmarks = [], [], [], [], []
    batch: list[tuple[str, np.ndarray]] = []
    start = time.perf_counter()

    def flush() -> None:
        found = detector.detect([image for _, image in batch])
        for (name, _), faces in zip(batch, found, strict=True):
            names.append(name)
            owner.extend([len(names) - 1] * faces.count)
            boxes.append(faces.boxes.reshape(-1, 4))
            scores.append(faces.scores.reshape(-1))
            landmarks.append(faces.landmarks.reshape(-1, 5, 2))
        batch.clear()
        if len(names) % 1024 < 16:
            print(f"... {len(names)} photos, {time.perf_counter() - start:.0f} s", file=sys.stderr)

    for item in lfw_photos():
        batch.append(item)
        if len(batch) == 16:
            flush()
    if batch:
        flush()
    result = {
        "names": np.asarray(names),
        "owner": np.asarray(owner, np.int64),
        "boxes": np.concatenate(boxes).astype(np.float32),
        "scores": np.concatenate(scores).astype(np.float32),
        "landmarks": np.concatenate(landmarks).astype(np.float32),
    }
    np.savez(path, **result)
    return result


def identity(name: str) -> str:
    return name.split("/")[-2]


def embed_faces(path: Path, det: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """dlib-resnet-v1 embeddings (dlib chips of 150 px) of every face of the multi-face photos
    and of every face of up to :data:`REFERENCES` single-face photos per identity of those
    photos (cached at ``path``): ``face`` (index into the detections), ``embedding``."""
    if path.is_file():
        with np.load(path) as data:
            return {k: data[k] for k in data.files}
    from marginface.data.face_crops import cut_face
    from marginface.inference import FaceModel

    counts = np.bincount(det["owner"], minlength=len(det["names"]))
    multi = {int(i) for i in np.flatnonzero(counts > 1)}
    people = {identity(str(det["names"][i])) for i in multi}
    single: dict[str, list[int]] = {}
    for i in np.flatnonzero(counts == 1):
        person = identity(str(det["names"][i]))
        if person in people and len(single.setdefault(person, [])) < REFERENCES:
            single[person].append(int(i))
    photos = multi | {i for found in single.values() for i in found}
    faces_of: dict[int, list[int]] = {}
    for face, photo in enumerate(det["owner"]):
        if int(photo) in photos:
            faces_of.setdefault(int(photo), []).append(face)
    model = FaceModel("dlib-resnet-v1")
    side = model.description.side
    index_of = {str(det["names"][i]): i for i in photos}
    faces, crops = [], []
    for name, image in lfw_photos(set(index_of)):
        for face in faces_of[index_of[name]]:
            crop = cut_face(
                image, det["landmarks"][face], det["boxes"][face], crop="dlib-chip", size=side
            )
            faces.append(face)
            crops.append(crop)
    embeddings = np.concatenate(
        [model.embed(list(crops[i : i + 64])) for i in range(0, len(crops), 64)]
    )
    result = {"face": np.asarray(faces, np.int64), "embedding": embeddings.astype(np.float32)}
    np.savez(path, **result)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--detections", type=Path, required=True, help="cache of step 1 (.npz)")
    parser.add_argument("--embeddings", type=Path, help="cache of step 2 (.npz); none: skip")
    parser.add_argument("--detect-only", action="store_true", help="stop after step 1")
    args = parser.parse_args()
    load_before = os.getloadavg()
    det = detect_all(args.detections)
    if args.detect_only:
        print(f"{len(det['names'])} photos, {len(det['boxes'])} faces")
        return
    report(det, embed_faces(args.embeddings, det) if args.embeddings else None)
    print("\n".join(machine_lines(load_before, os.getloadavg(), " ".join(sys.argv))))


def report(det: dict[str, np.ndarray], emb: dict[str, np.ndarray] | None) -> None:
    raise NotImplementedError


if __name__ == "__main__":
    main()
