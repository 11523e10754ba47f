"""Five-landmark alignment, checked against a least-squares similarity solved here as a linear
system (not Umeyama's SVD) and a bilinear warp written here in NumPy (not OpenCV)."""

from __future__ import annotations

import numpy as np
import pytest

from marginface.cli import main
from marginface.data.align import (
    ARCFACE_TEMPLATE,
    align_folder,
    arcface_template,
    norm_crop,
    read_landmarks,
    similarity_transform,
)

cv2 = pytest.importorskip("cv2")


# ------------------------------------------------------------------ references written here
def least_squares_similarity(source: np.ndarray, target: np.ndarray) -> np.ndarray:
    """``[[a, -b, tx], [b, a, ty]]`` minimizing ``Σ ‖target - M [source; 1]‖²``: linear in
    ``(a, b, tx, ty)``, solved by ``numpy.linalg.lstsq``."""
    rows, rhs = [], []
    for (x, y), (u, v) in zip(source, target, strict=True):
        rows.append([x, -y, 1.0, 0.0])
        rhs.append(u)
        rows.append([y, x, 0.0, 1.0])
        rhs.append(v)
    (a, b, tx, ty), *_ = np.linalg.lstsq(np.array(rows), np.array(rhs), rcond=None)
    return np.array([[a, -b, tx], [b, a, ty]])


def bilinear_warp(image: np.ndarray, matrix: np.ndarray, size: int) -> np.ndarray:
    """Each output pixel ``p`` takes the source at ``M⁻¹ p``, bilinear, zero outside."""
    full = np.vstack([matrix, [0.0, 0.0, 1.0]])
    inverse = np.linalg.inv(full)
    v, u = np.mgrid[0:size, 0:size].astype(np.float64)
    sx = inverse[0, 0] * u + inverse[0, 1] * v + inverse[0, 2]
    sy = inverse[1, 0] * u + inverse[1, 1] * v + inverse[1, 2]
    x0, y0 = np.floor(sx).astype(int), np.floor(sy).astype(int)
    fx, fy = sx - x0, sy - y0
    height, width = image.shape[:2]
    padded = np.zeros((height + 4, width + 4, *image.shape[2:]), dtype=np.float64)
    padded[2:-2, 2:-2] = image

    def at(yy, xx):
        inside = (yy >= -1) & (yy <= height) & (xx >= -1) & (xx <= width)
        value = padded[np.clip(yy, -2, height + 1) + 2, np.clip(xx, -2, width + 1) + 2]
        return np.where(inside[..., None] if image.ndim == 3 else inside, value, 0.0)

    weights = [((1 - fy) * (1 - fx), 0, 0), ((1 - fy) * fx, 0, 1), (fy * (1 - fx), 1, 0)]
    weights.append((fy * fx, 1, 1))
    out = sum(
        (w[..., None] if image.ndim == 3 else w) * at(y0 + dy, x0 + dx) for w, dy, dx in weights
    )
    return out


def smooth_image(height: int, width: int, seed: int) -> np.ndarray:
    """A smooth RGB image (sums of low-frequency waves), ``uint8[H, W, 3]``."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    channels = []
    for _ in range(3):
        value = np.full((height, width), 128.0)
        for _ in range(4):
            fx, fy = rng.uniform(-0.08, 0.08, size=2)
            value += 30 * np.sin(fx * x + fy * y + rng.uniform(0, 6.28))
        channels.append(value)
    return np.clip(np.stack(channels, axis=-1), 0, 255).round().astype(np.uint8)


def _apply(matrix: np.ndarray, points: np.ndarray) -> np.ndarray:
    return points @ matrix[:, :2].T + matrix[:, 2]


# ------------------------------------------------------------------------------- the tests
def test_similarity_is_the_least_squares_similarity():
    rng = np.random.default_rng(0)
    for _ in range(20):
        landmarks = rng.uniform(20, 200, size=(5, 2))
        target = arcface_template(112)
        expected = least_squares_similarity(landmarks, target)
        np.testing.assert_allclose(similarity_transform(landmarks, target), expected, atol=1e-9)


def test_crop_is_the_reference_warp_within_one_grey_level():
    image = smooth_image(250, 230, seed=1)
    rng = np.random.default_rng(2)
    for _ in range(5):
        landmarks = ARCFACE_TEMPLATE * rng.uniform(0.8, 1.6) + rng.uniform(20, 90, size=2)
        landmarks = landmarks + rng.normal(0, 2.0, size=(5, 2))  # a detector's noise
        crop = norm_crop(image, landmarks)
        assert crop.shape == (112, 112, 3) and crop.dtype == np.uint8
        reference = bilinear_warp(image, least_squares_similarity(landmarks, ARCFACE_TEMPLATE), 112)
        assert np.abs(crop.astype(np.float64) - reference).max() <= 1.0


def test_a_known_transform_is_undone():
    face = smooth_image(112, 112, seed=3)
    angle, scale = np.deg2rad(25.0), 1.7
    forward = np.array(
        [
            [scale * np.cos(angle), -scale * np.sin(angle), 60.0],
            [scale * np.sin(angle), scale * np.cos(angle), 30.0],
        ]
    )
    canvas = cv2.warpAffine(face, forward, (320, 320), flags=cv2.INTER_CUBIC)
    landmarks = _apply(forward, ARCFACE_TEMPLATE.astype(np.float64))  # exact, noise-free
    inverse = np.linalg.inv(np.vstack([forward, [0, 0, 1]]))[:2]
    np.testing.assert_allclose(
        similarity_transform(landmarks, ARCFACE_TEMPLATE), inverse, atol=1e-9
    )
    crop = norm_crop(canvas, landmarks)
    inner = (slice(4, -4), slice(4, -4))  # away from the canvas's borders
    assert np.abs(crop[inner].astype(int) - face[inner].astype(int)).mean() < 1.5


def test_grey_images_and_other_sizes():
    image = smooth_image(200, 200, seed=4)[:, :, 0]
    landmarks = ARCFACE_TEMPLATE * 1.3 + 20
    assert norm_crop(image, landmarks).shape == (112, 112)
    assert norm_crop(image, landmarks, image_size=224).shape == (224, 224)
    template_128 = arcface_template(128)
    np.testing.assert_allclose(
        template_128[:, 0], ARCFACE_TEMPLATE[:, 0] * 128 / 128 + 8, rtol=1e-6
    )


@pytest.mark.parametrize(
    ("landmarks", "match"),
    [
        (np.zeros((4, 2)), r"shape \(5, 2\), got \(4, 2\)"),
        (np.full((5, 2), 10.0), "degenerate: the five points coincide"),
        (np.array([[1, 2], [3, np.nan], [5, 6], [7, 8], [9, 1]]), "non-finite"),
    ],
)
def test_bad_landmarks_are_clear_errors(landmarks, match):
    with pytest.raises(ValueError, match=match):
        norm_crop(np.zeros((50, 50, 3), np.uint8), landmarks)


def test_bad_size_and_image():
    with pytest.raises(ValueError, match="multiple of 112 or 128, got 100"):
        norm_crop(np.zeros((50, 50, 3), np.uint8), ARCFACE_TEMPLATE, image_size=100)
    with pytest.raises(ValueError, match="image must be"):
        norm_crop(np.zeros((0, 5, 3), np.uint8), ARCFACE_TEMPLATE)


def _landmark_line(name: str, points: np.ndarray, score: float | None = 0.9) -> str:
    values = " ".join(f"{v:.3f}" for v in points.reshape(-1))
    return f"{name} {values}" + ("" if score is None else f" {score}")


def test_read_landmarks_in_both_layouts(tmp_path):
    points = ARCFACE_TEMPLATE.astype(np.float64) + 3
    txt = tmp_path / "ijbc_name_5pts_score.txt"
    txt.write_text(_landmark_line("1.jpg", points) + "\n" + _landmark_line("a/2.jpg", points, None))
    table = read_landmarks(txt)
    assert list(table) == ["1.jpg", "a/2.jpg"]
    np.testing.assert_allclose(table["a/2.jpg"], points, atol=1e-3)
    csv_file = tmp_path / "marks.csv"
    header = "name," + ",".join(f"{c}{i}" for i in range(1, 6) for c in "xy")
    row = "b/3.png," + ",".join(f"{v:.3f}" for v in points.reshape(-1))
    csv_file.write_text(header + "\n" + row + "\n")
    np.testing.assert_allclose(read_landmarks(csv_file)["b/3.png"], points, atol=1e-3)
    bad = tmp_path / "bad.txt"
    bad.write_text(_landmark_line("1.jpg", points) + "\n2.jpg 1 2 3\n")
    with pytest.raises(ValueError, match=r"bad\.txt: line 2: expected a name, 10 coordinates"):
        read_landmarks(bad)


def _faces_folder(tmp_path):
    src = tmp_path / "src"
    lines = []
    rng = np.random.default_rng(5)
    for identity in ("anna", "bob"):
        (src / identity).mkdir(parents=True)
        for k in range(2):
            image = smooth_image(180, 160, seed=10 * len(identity) + k)
            name = f"{identity}/{k}.png"
            cv2.imwrite(str(src / name), image)
            points = ARCFACE_TEMPLATE * rng.uniform(1.0, 1.3) + rng.uniform(5, 30, size=2)
            lines.append(_landmark_line(name, points))
    cv2.imwrite(str(src / "anna" / "extra.png"), smooth_image(50, 50, seed=9))
    marks = tmp_path / "name_5pts_score.txt"
    marks.write_text("\n".join(lines) + "\n")
    return src, marks


def test_align_folder_writes_crops_with_the_same_paths(tmp_path):
    src, marks = _faces_folder(tmp_path)
    result = align_folder(src, marks, tmp_path / "out", workers=2)
    assert (result.written, result.unlisted) == (4, 1)
    table = read_landmarks(marks)
    for name, points in table.items():
        written = cv2.imread(str(tmp_path / "out" / name), cv2.IMREAD_UNCHANGED)
        expected = norm_crop(cv2.imread(str(src / name), cv2.IMREAD_UNCHANGED), points)
        np.testing.assert_array_equal(written, expected)  # PNG: lossless


def test_align_folder_names_a_missing_image(tmp_path):
    src, marks = _faces_folder(tmp_path)
    marks.write_text(marks.read_text() + _landmark_line("carl/0.png", ARCFACE_TEMPLATE) + "\n")
    with pytest.raises(ValueError, match=r"not in .*src, e\.g\. carl/0\.png"):
        align_folder(src, marks, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_align_command(tmp_path, capsys):
    src, marks = _faces_folder(tmp_path)
    assert main(["align", str(src), str(marks), str(tmp_path / "out")]) == 0
    assert "4 aligned 112x112 crop(s)" in capsys.readouterr().out
    assert (tmp_path / "out" / "bob" / "1.png").is_file()
    degenerate = tmp_path / "degenerate.txt"
    degenerate.write_text(_landmark_line("anna/0.png", np.zeros((5, 2))) + "\n")
    assert main(["align", str(src), str(degenerate), str(tmp_path / "out2")]) == 2
    err = capsys.readouterr().err
    assert "anna/0.png" in err and "degenerate" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
