"""Fit MTCNN_DLIB_TEMPLATE (src/marginface/data/face_chip.py): where MTCNN's five landmarks
fall in dlib's face chip frame, on LFW.

    PYTHONPATH=src nice -n 10 python benchmarks/fit_dlib_chip_template.py

For every photo of the fit set (the 300 alphabetically first identities of
lfw-deepfunneled, 648 photos; bench_dlib_chip.py evaluates on other identities), decoded once
with Pillow:

1. dlib: HOG detector (upsampled once; the detection nearest the photo's centre), 5-point
   shape predictor, ``get_face_chip_details(shape, 150, 0.25)`` → dlib's similarity ``T``
   from its chip frame to the photo (centre, scale, angle of the chip rectangle).
2. marginface's MTCNN (facenet-pytorch's weights): the face whose box overlaps dlib's most
   (IoU >= 0.3).
3. MTCNN's landmarks through ``T⁻¹`` into the chip frame ``q``, then into dlib's unit face
   square: ``u = q · (1 + 2·padding) / size - padding``.

The template is the coordinate-wise median of ``u`` over the photos (robust to the odd
mislocated landmark; the mean is printed beside it). Then the least-squares weights
(MTCNN_DLIB_WEIGHTS): eyes 1, nose and mouth each from {0, 0.1, 0.25, 0.5, 1}, the pair whose
chips put dlib's own five shape points nearest where dlib's chip has them (mean distance over
the fit photos, chip pixels). Also printed: the spread (median absolute
deviation, in chip pixels at size 150), the template at size 150 / padding 0.25, its
difference from the module's constant, and, for comparison, the same five points read off
dlib's 68-point mean face (eye centres as the means of the six eye-contour points, nose tip
point 30, mouth corners 48 and 54; ``get_face_chip_details``'s 68-point branch).
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dlib_chip_common import (
    DlibPipeline,
    fit_names,
    lfw_names,
    matching_landmarks,
    read_photos,
)
from marginface.data.face_chip import MTCNN_DLIB_WEIGHTS, dlib_chip_matrix, dlib_chip_template
from marginface.detect import MTCNN

POINTS = ("left eye", "right eye", "nose tip", "left mouth", "right mouth")

# dlib's 68-point mean face (get_face_chip_details), only the points used below, by iBUG index.
MEAN68 = {
    30: (0.490127, 0.515625),
    36: (0.121737, 0.216423),
    37: (0.187122, 0.178758),
    38: (0.265825, 0.179852),
    39: (0.334606, 0.231733),
    40: (0.260918, 0.245099),
    41: (0.182743, 0.244077),
    42: (0.645647, 0.231733),
    43: (0.714428, 0.179852),
    44: (0.793132, 0.178758),
    45: (0.858516, 0.216423),
    46: (0.79751, 0.244077),
    47: (0.719335, 0.245099),
    48: (0.254149, 0.780233),
    54: (0.726104, 0.780233),
}


def mean68_template() -> np.ndarray:
    """MTCNN's five points read off dlib's 68-point mean face, unit square, float64[5, 2]."""
    eye_left = np.mean([MEAN68[i] for i in range(36, 42)], axis=0)
    eye_right = np.mean([MEAN68[i] for i in range(42, 48)], axis=0)
    return np.array([eye_left, eye_right, MEAN68[30], MEAN68[48], MEAN68[54]])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=150)
    parser.add_argument("--padding", type=float, default=0.25)
    args = parser.parse_args()
    size, padding = args.size, args.padding

    start = time.perf_counter()
    names = fit_names(lfw_names())
    photos = read_photos(names)
    dlib_pipe = DlibPipeline(size, padding)
    detector = MTCNN()
    units, pairs, skipped = [], [], {"no dlib face": 0, "no matching MTCNN face": 0}
    for i in range(0, len(names), 32):
        chunk = names[i : i + 32]
        found = detector.detect([photos[n] for n in chunk])
        for name, faces in zip(chunk, found, strict=True):
            got = dlib_pipe.face(photos[name])
            if got is None:
                skipped["no dlib face"] += 1
                continue
            face, _ = got
            landmarks = matching_landmarks(faces, face.box)
            if landmarks is None:
                skipped["no matching MTCNN face"] += 1
                continue
            q = face.frame_of(landmarks, size)
            units.append(q * (1 + 2 * padding) / size - padding)
            pairs.append((landmarks, face))
    units = np.stack(units)  # [N, 5, 2]
    median = np.median(units, axis=0)
    mean = units.mean(axis=0)
    mad = np.median(np.abs(units - median), axis=0) * size / (1 + 2 * padding)

    print(f"fit set: {len(names)} photos of the first 300 LFW identities; used {len(units)}")
    print(f"skipped: {skipped}; {time.perf_counter() - start:.0f} s")
    np.set_printoptions(precision=6, suppress=True)
    print("\nMTCNN_DLIB_TEMPLATE (median, unit face square):")
    for point, row in zip(POINTS, median, strict=True):
        print(f"        [{row[0]:.6f}, {row[1]:.6f}],  # {point}")
    print("\nmean - median (unit square):\n", mean - median)
    print(f"\nmedian absolute deviation, chip pixels (size {size}, padding {padding}):\n", mad)
    print(f"\ntemplate in the chip frame (size {size}, padding {padding}):")
    print(size * (padding + median) / (1 + 2 * padding))
    print("\nthe module's constant minus this fit, chip pixels:")
    print(dlib_chip_template(size, padding) - size * (padding + median) / (1 + 2 * padding))
    print("\n68-point mean face's points minus this fit, chip pixels:")
    print((mean68_template() - median) * size / (1 + 2 * padding))

    print("\nMTCNN_DLIB_WEIGHTS: mean distance (chip px) of dlib's 5 points, our chip vs dlib's")
    best = None
    for nose, mouth in itertools.product(WEIGHT_GRID, WEIGHT_GRID):
        weights = [1.0, 1.0, nose, mouth, mouth]
        errors = [
            part_error(face, landmarks, median, weights, size, padding) for landmarks, face in pairs
        ]
        mean_error = float(np.mean(errors))
        print(
            f"  nose {nose:<4} mouth {mouth:<4}: mean {mean_error:.3f}, median "
            f"{np.median(errors):.3f}, p95 {np.percentile(errors, 95):.3f}"
        )
        if best is None or mean_error < best[0]:
            best = (mean_error, weights)
    print(f"chosen (least mean): {best[1]}; the module's: {MTCNN_DLIB_WEIGHTS.tolist()}")


WEIGHT_GRID = (0.0, 0.1, 0.25, 0.5, 1.0)


def part_error(face, landmarks, unit, weights, size, padding) -> float:
    """Mean distance, in chip pixels, between dlib's five shape points in the chip made from
    MTCNN's ``landmarks`` (template ``unit``, ``weights``) and in dlib's own chip."""
    ours = dlib_chip_matrix(landmarks, size, padding, template=unit, weights=weights)
    theirs = face.pixel_map()

    def in_chip(matrix: np.ndarray) -> np.ndarray:
        return (face.parts - matrix[:, 2]) @ np.linalg.inv(matrix[:, :2]).T

    return float(np.linalg.norm(in_chip(ours) - in_chip(theirs), axis=1).mean())


if __name__ == "__main__":
    main()
