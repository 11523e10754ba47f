"""How close marginface's dlib chip (MTCNN landmarks + MTCNN_DLIB_TEMPLATE) comes to dlib's own
(HOG detector + 5-point shape predictor + ``get_face_chip``), on LFW photos outside the fit set.

    PYTHONPATH=src nice -n 10 python benchmarks/bench_dlib_chip.py --photos 500 --seed 0

The photos: ``--photos`` drawn (``--seed``) from the LFW identities after the first 300 (the
fit set of fit_dlib_chip_template.py), each decoded once with Pillow and given to both
pipelines. Per photo where dlib finds a face (nearest the centre) and MTCNN a face overlapping
it (IoU >= 0.3):

- dlib's chip: ``dlib.get_face_chip(photo, shape, 150, 0.25)``;
- marginface's: ``dlib_chip(photo, mtcnn_landmarks)``;
- the sampler floor: ``cv2.warpAffine`` with dlib's own chip map (``chip_pixel_map`` of dlib's
  chip details), i.e. the difference OpenCV's sampling alone makes.

Printed, as medians and 95th percentiles over the photos (5th percentiles for the cosines):
the mean absolute difference from dlib's chip (grey levels, over pixels and RGB channels);
the landmark-position error (dlib's five shape points in marginface's chip against in dlib's,
mean Euclidean distance, chip pixels; also MTCNN's own five points); the same for the chip with
equal least-squares weights instead of MTCNN_DLIB_WEIGHTS, and with equal weights fitted
landmarks → template (residual in chip pixels, as norm_crop fits) instead; the cosine
and Euclidean distance between dlib's 128-D descriptors (``face_recognition_model_v1``'s
``compute_face_descriptor`` on the 150×150 chip) of dlib's chip and of the other chip. dlib
calls two faces the same person below a Euclidean distance of 0.6.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_decode import machine_lines
from dlib_chip_common import (
    DlibPipeline,
    dlib_model,
    eval_names,
    lfw_names,
    matching_landmarks,
    read_photos,
)
from marginface.data.align import similarity_transform
from marginface.data.face_chip import (
    chip_pixel_map,
    dlib_chip,
    dlib_chip_matrix,
    dlib_chip_template,
)
from marginface.detect import MTCNN

SIZE, PADDING = 150, 0.25


def alternative_matrix(landmarks: np.ndarray) -> np.ndarray:
    """The chip map when the similarity is fitted landmarks → template with equal weights
    (residual in the chip frame, as norm_crop fits), then inverted; the pixel map as dlib's."""
    forward = similarity_transform(landmarks, dlib_chip_template(SIZE, PADDING))  # image -> q
    inverse = np.linalg.inv(np.vstack([forward, [0.0, 0.0, 1.0]]))[:2]  # q -> image
    centre = inverse[:, :2] @ np.full(2, SIZE / 2.0) + inverse[:, 2]
    scale = float(np.hypot(inverse[0, 0], inverse[1, 0]))
    angle = float(np.arctan2(inverse[1, 0], inverse[0, 0]))
    return chip_pixel_map(centre, scale, angle, SIZE)


def in_chip(matrix: np.ndarray, points: np.ndarray) -> np.ndarray:
    """Image points in the chip pixels of a chip pixel -> image map."""
    return (points - matrix[:, 2]) @ np.linalg.inv(matrix[:, :2]).T


def summary(label: str, values: list[float], low: bool = False) -> str:
    v = np.asarray(values)
    q = 5 if low else 95
    return (
        f"| {label} | {np.median(v):.4f} | {np.percentile(v, q):.4f} (p{q}) | "
        f"{v.min():.4f} .. {v.max():.4f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--photos", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    import cv2
    import dlib

    load_before = os.getloadavg()
    start = time.perf_counter()
    names = eval_names(lfw_names(), args.photos, args.seed)
    photos = read_photos(names)
    pipe = DlibPipeline(SIZE, PADDING)
    detector = MTCNN()
    net = dlib.face_recognition_model_v1(dlib_model("dlib_face_recognition_resnet_model_v1.dat"))
    rows = {
        k: [] for k in ("pix", "pix_equal", "pix_floor", "lm", "lm_equal", "lm_alt", "lm_mtcnn")
    }
    chips = {k: [] for k in ("dlib", "ours", "equal", "floor")}
    skipped = {"no dlib face": 0, "no matching MTCNN face": 0}
    flags = cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP
    for i in range(0, len(names), 32):
        chunk = names[i : i + 32]
        found = detector.detect([photos[n] for n in chunk])
        for name, faces in zip(chunk, found, strict=True):
            photo = photos[name]
            got = pipe.face(photo)
            if got is None:
                skipped["no dlib face"] += 1
                continue
            face, shape = got
            landmarks = matching_landmarks(faces, face.box)
            if landmarks is None:
                skipped["no matching MTCNN face"] += 1
                continue
            e_dlib = face.pixel_map()
            e_ours = dlib_chip_matrix(landmarks, SIZE, PADDING)
            e_equal = dlib_chip_matrix(landmarks, SIZE, PADDING, weights=np.ones(5))
            made = {
                "dlib": dlib.get_face_chip(photo, shape, SIZE, PADDING),
                "ours": dlib_chip(photo, landmarks, SIZE, PADDING),
                "equal": cv2.warpAffine(photo, e_equal, (SIZE, SIZE), flags=flags),
                "floor": cv2.warpAffine(photo, e_dlib, (SIZE, SIZE), flags=flags),
            }
            for key, chip in made.items():
                chips[key].append(chip)
            for key, chip in (("pix", "ours"), ("pix_equal", "equal"), ("pix_floor", "floor")):
                difference = made[chip].astype(int) - made["dlib"]
                rows[key].append(float(np.abs(difference).mean()))
            truth = in_chip(e_dlib, face.parts)
            for key, matrix in (
                ("lm", e_ours),
                ("lm_equal", e_equal),
                ("lm_alt", alternative_matrix(landmarks)),
            ):
                distances = np.linalg.norm(in_chip(matrix, face.parts) - truth, axis=1)
                rows[key].append(float(distances.mean()))
            distances = np.linalg.norm(
                in_chip(e_ours, landmarks) - in_chip(e_dlib, landmarks), axis=1
            )
            rows["lm_mtcnn"].append(float(distances.mean()))

    def descriptors(key: str) -> np.ndarray:
        return np.array([np.asarray(d) for d in net.compute_face_descriptor(chips[key])])

    described = {key: descriptors(key) for key in chips}

    def cosines(key: str) -> list[float]:
        a, b = described["dlib"], described[key]
        return list((a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1))

    def distances(key: str) -> list[float]:
        return list(np.linalg.norm(described["dlib"] - described[key], axis=1))

    elapsed = time.perf_counter() - start
    print(
        f"{len(names)} LFW photos (seed {args.seed}, identities after the first 300); "
        f"compared {len(chips['ours'])}; skipped {skipped}; {elapsed:.0f} s\n"
    )
    print("| against dlib's chip | median | tail | range |")
    print("|---|---|---|---|")
    print(summary("mean abs. grey-level difference, ours", rows["pix"]))
    print(summary("... ours with equal weights", rows["pix_equal"]))
    print(summary("... OpenCV with dlib's own map (sampler floor)", rows["pix_floor"]))
    print(summary("dlib's 5 points' position error, ours, px (mean of 5)", rows["lm"]))
    print(summary("... ours with equal weights", rows["lm_equal"]))
    print(summary("... equal weights, fit landmarks → template", rows["lm_alt"]))
    print(summary("MTCNN's 5 points' position error, ours, px (mean of 5)", rows["lm_mtcnn"]))
    print(summary("cosine of dlib's descriptors, ours", cosines("ours"), True))
    print(summary("... ours with equal weights", cosines("equal"), True))
    print(summary("... OpenCV with dlib's own map", cosines("floor"), True))
    print(summary("Euclidean distance of dlib's descriptors, ours", distances("ours")))
    print(summary("... ours with equal weights", distances("equal")))
    print(summary("... OpenCV with dlib's own map", distances("floor")))
    print()
    command = (
        "PYTHONPATH=src nice -n 10 python benchmarks/bench_dlib_chip.py "
        f"--photos {args.photos} --seed {args.seed}"
    )
    for line in machine_lines(load_before, os.getloadavg(), command):
        print(line)


if __name__ == "__main__":
    main()
