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
  >= 0.94 and every other face of the photo is <= 0.92 — the truth is then unambiguous.
  dlib-resnet-v1's unit embeddings are close for anyone (two people's median cosine 0.85), so
  the two thresholds come from the single-face photos themselves (printed): 0.94 is above
  99.9 % of the cosines of a photo to another person's mean, 0.92 below 99.5 % of the cosines
  of a photo to its own person's mean (leave-one-out). Identities with no single-face photo
  cannot be checked.

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
SUBJECT_MIN = 0.94  # cosine to the identity's mean: the subject (above 99.9 % of impostors)
OTHER_MAX = 0.92  # every other face at most this: not the subject (below 99.5 % of genuines)
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


RULES = ("largest", "central", "subject")


def calibration(references: dict[str, list[np.ndarray]]) -> None:
    """The cosines the identity truth's thresholds rest on: each single-face photo against its
    own person's mean (without it) and against another person's mean (people with >= 3
    single-face photos; the other person drawn with a fixed seed)."""
    people = [p for p, found in references.items() if len(found) >= 3]
    means = {}
    for person in people:
        mean = np.mean(references[person], axis=0)
        means[person] = mean / np.linalg.norm(mean)
    rng = np.random.default_rng(0)
    genuine, impostor = [], []
    for person in people:
        rows = np.asarray(references[person])
        for k in range(len(rows)):
            mean = np.delete(rows, k, axis=0).mean(axis=0)
            genuine.append(float(rows[k] @ mean / np.linalg.norm(mean)))
        other = people[int(rng.integers(len(people)))]
        if other != person:
            impostor.extend((rows @ means[other]).tolist())
    g, i = np.asarray(genuine), np.asarray(impostor)
    print(
        f"calibration on {len(people)} people: own-mean cosine of {len(g)} photos, quantiles "
        f"0.5/1/5/50 %: {' / '.join(f'{v:.3f}' for v in np.percentile(g, [0.5, 1, 5, 50]))}; "
        f"another person's mean, {len(i)} photos, 50/99/99.9 %: "
        f"{' / '.join(f'{v:.3f}' for v in np.percentile(i, [50, 99, 99.9]))}, max {i.max():.3f}"
    )


def variants(faces, shape) -> dict[str, int]:
    """Ablations of the subject score (each term left out), for the report only."""
    from marginface.data.face_photos import subject_scores

    boxes = faces.boxes.astype(np.float64)
    h, w = shape[:2]
    clipped = np.stack(
        [
            np.clip(boxes[:, 0], 0, w),
            np.clip(boxes[:, 1], 0, h),
            np.clip(boxes[:, 2], 0, w),
            np.clip(boxes[:, 3], 0, h),
        ],
        axis=1,
    )
    visible = (clipped[:, 2] - clipped[:, 0]) * (clipped[:, 3] - clipped[:, 1])
    area = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    inside = visible / np.maximum(area, 1e-12)
    size = np.sqrt(visible) / max(np.sqrt(visible).max(), 1e-12)
    middle = (clipped[:, :2] + clipped[:, 2:]) / 2
    centre = 1 - np.hypot(middle[:, 0] - w / 2, middle[:, 1] - h / 2) / (np.hypot(w, h) / 2)
    full = subject_scores(faces, shape)
    assert np.allclose(full, size * inside * np.clip(centre, 0, 1))
    return {
        "subject without inside": int(np.argmax(size * centre)),
        "subject without size": int(np.argmax(inside * centre)),
        "largest visible area": int(np.argmax(visible)),
    }


WINDOW = 190  # the shifted frames' side (LFW's photos are 250 x 250)
OFFSETS = [(x, y) for x in (0, 30, 60) for y in (0, 30, 60) if (x, y) != (30, 30)]


def shifted(det, starts, truth: dict[int, int], names: list[str]) -> None:
    """The same photos framed off their subject: each photo seen through the 8 windows of
    190 x 190 px whose offsets are 0, 30 or 60 px on each axis (all but the centred one), its
    boxes moved with the window. A face less than half inside a window is dropped (a detector
    would miss it or cut it); windows that drop the subject, or keep one face only, are left
    out. A simulation on the boxes (no new detection): the subject is now up to 42 px from the
    frame's centre, as in a photo not centred on its subject."""
    from marginface.data.face_photos import select_faces
    from marginface.detect import Faces

    right = dict.fromkeys(names, 0)
    total = 0
    for i, k in truth.items():
        boxes = det["boxes"][starts[i] : starts[i + 1]].astype(np.float64)
        for ox, oy in OFFSETS:
            moved = boxes - [ox, oy, ox, oy]
            clipped = np.clip(moved, 0, WINDOW)
            visible = (clipped[:, 2] - clipped[:, 0]) * (clipped[:, 3] - clipped[:, 1])
            area = (moved[:, 2] - moved[:, 0]) * (moved[:, 3] - moved[:, 1])
            kept = np.flatnonzero(visible >= 0.5 * area)
            if k not in kept or len(kept) < 2:
                continue
            faces = Faces(
                moved[kept].astype(np.float32),
                det["scores"][starts[i] : starts[i + 1]][kept],
                det["landmarks"][starts[i] : starts[i + 1]][kept],
            )
            subject = int(np.flatnonzero(kept == k)[0])
            shape = (WINDOW, WINDOW, 3)
            total += 1
            for rule in RULES:
                right[rule] += select_faces(faces, shape, rule)[0] == subject
            for rule, pick in variants(faces, shape).items():
                right[rule] += pick == subject
    print(
        f"\nshifted frames (geometric truth's photos, {WINDOW} px windows off the centre): "
        f"{total} views with >= 2 faces"
    )
    print("| rule | subject picked | share |")
    print("| --- | ---: | ---: |")
    for rule in names:
        print(f"| {rule} | {right[rule]}/{total} | {100 * right[rule] / max(total, 1):.1f} % |")


def report(det: dict[str, np.ndarray], emb: dict[str, np.ndarray] | None) -> None:
    from marginface.data.face_photos import select_faces
    from marginface.detect import Faces

    shape = (250, 250, 3)
    counts = np.bincount(det["owner"], minlength=len(det["names"]))
    starts = np.concatenate([[0], np.cumsum(counts)])
    multi = np.flatnonzero(counts > 1)
    print(
        f"{len(det['names'])} photos; MTCNN finds no face in {int((counts == 0).sum())}, one "
        f"in {int((counts == 1).sum())}, several in {len(multi)} "
        f"(2: {int((counts == 2).sum())}, 3+: {int((counts >= 3).sum())})"
    )
    by_face = {}
    if emb is not None:
        by_face = dict(zip(emb["face"].tolist(), emb["embedding"], strict=True))
        references: dict[str, list[np.ndarray]] = {}
        for i in np.flatnonzero(counts == 1):
            face = int(starts[i])
            if face in by_face:
                references.setdefault(identity(str(det["names"][i])), []).append(by_face[face])
        calibration(references)
    truths: dict[str, dict[int, int]] = {"geometric": {}, "identity": {}}
    ambiguous = {"geometric": 0, "identity": 0}
    picks: dict[int, dict[str, int]] = {}
    for i in multi:
        faces = Faces(
            det["boxes"][starts[i] : starts[i + 1]],
            det["scores"][starts[i] : starts[i + 1]],
            det["landmarks"][starts[i] : starts[i + 1]],
        )
        picks[int(i)] = {rule: select_faces(faces, shape, rule)[0] for rule in RULES}
        picks[int(i)].update(variants(faces, shape))
        b = faces.boxes
        holds = np.flatnonzero(
            (b[:, 0] <= 125) & (b[:, 2] >= 125) & (b[:, 1] <= 125) & (b[:, 3] >= 125)
        )
        if len(holds) == 1:
            truths["geometric"][int(i)] = int(holds[0])
        else:
            ambiguous["geometric"] += 1
        person = identity(str(det["names"][i]))
        if emb is not None and person in references:
            ref = np.mean(references[person], axis=0)
            ref /= np.linalg.norm(ref)
            cos = np.array([by_face[int(f)] @ ref for f in range(starts[i], starts[i + 1])])
            best = int(np.argmax(cos))
            others = np.delete(cos, best)
            if cos[best] >= SUBJECT_MIN and (others <= OTHER_MAX).all():
                truths["identity"][int(i)] = best
            else:
                ambiguous["identity"] += 1
        elif emb is not None:
            ambiguous["identity"] += 1
    names = [*RULES, "subject without inside", "subject without size", "largest visible area"]
    for truth, table in truths.items():
        if not table:
            continue
        print(
            f"\n{truth} truth: {len(table)} multi-face photos with an unambiguous subject "
            f"({ambiguous[truth]} left out)"
        )
        print("| rule | subject picked | share |")
        print("| --- | ---: | ---: |")
        for rule in names:
            right = sum(picks[i][rule] == k for i, k in table.items())
            print(f"| {rule} | {right}/{len(table)} | {100 * right / len(table):.1f} % |")
        for a, b in (("largest", "subject"), ("central", "subject")):
            only_a = sum(picks[i][a] == k != picks[i][b] for i, k in table.items())
            only_b = sum(picks[i][b] == k != picks[i][a] for i, k in table.items())
            print(f"  {a} right where {b} is wrong: {only_a}; the reverse: {only_b}")
        wrong = [str(det["names"][i]) for i, k in table.items() if picks[i]["subject"] != k][:10]
        print(f"  subject wrong on (first 10): {', '.join(wrong) or '-'}")
    shifted(det, starts, truths["geometric"], names)
    if truths["geometric"] and truths["identity"]:
        both = set(truths["geometric"]) & set(truths["identity"])
        agree = sum(truths["geometric"][i] == truths["identity"][i] for i in both)
        print(f"\nthe two truths agree on {agree}/{len(both)} photos judged by both")


if __name__ == "__main__":
    main()
