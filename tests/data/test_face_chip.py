"""dlib face chips from five landmarks (marginface.data.face_chip): the geometry restated here
(a linear least-squares similarity and dlib's chip rectangle written out), compared with the
installed dlib's ``get_face_chip`` on a synthetic image, and the fitted MTCNN template checked
against dlib's own pipeline on LFW photos outside its fit set."""

from __future__ import annotations

import importlib.util
import io
import math
import tarfile
from pathlib import Path

import numpy as np
import pytest
from tests._face_fixtures import require_mtcnn_weights
from tests._shared_data import require_shared_file

from marginface.data.align import similarity_transform
from marginface.data.face_chip import (
    DLIB_5POINT_MEAN_FACE,
    MTCNN_DLIB_TEMPLATE,
    MTCNN_DLIB_WEIGHTS,
    chip_pixel_map,
    dlib_chip,
    dlib_chip_matrix,
    dlib_chip_template,
    weighted_similarity,
)

cv2 = pytest.importorskip("cv2")


# ------------------------------------------------------------------ references written here
def least_squares_similarity(
    source: np.ndarray, target: np.ndarray, weights: np.ndarray | None = None
) -> np.ndarray:
    """``[[a, -b, tx], [b, a, ty]]`` minimizing ``Σ w_i ‖target_i - M [source_i; 1]‖²`` (linear
    in ``a, b, tx, ty``: rows scaled by ``√w_i``; ``numpy.linalg.lstsq``)."""
    weights = np.ones(len(source)) if weights is None else np.asarray(weights, np.float64)
    rows, rhs = [], []
    for (x, y), (u, v), w in zip(source, target, np.sqrt(weights), strict=True):
        rows += [[w * x, -w * y, w, 0.0], [w * y, w * x, 0.0, w]]
        rhs += [w * u, w * v]
    (a, b, tx, ty), *_ = np.linalg.lstsq(np.array(rows), np.array(rhs), rcond=None)
    return np.array([[a, -b, tx], [b, a, ty]])


def dlib_rectangle_map(transform: np.ndarray, size: int) -> np.ndarray:
    """dlib's chip: the rectangle centred on ``T(size/2, size/2)`` whose corners lie
    ``size·s - 1`` apart, turned by ``T``'s angle; chip pixels ``(0, 0)``, ``(size-1, 0)``,
    ``(0, size-1)`` go to its top-left, top-right and bottom-left corners. Returns the affine
    map through those three pairs, chip pixel → image."""
    s = math.hypot(transform[0, 0], transform[1, 0])
    angle = math.atan2(transform[1, 0], transform[0, 0])
    centre = transform[:, :2] @ [size / 2, size / 2] + transform[:, 2]
    half = (size * s - 1) / 2
    turn = np.array([[math.cos(angle), -math.sin(angle)], [math.sin(angle), math.cos(angle)]])
    corners = [centre + turn @ [-half, -half], centre + turn @ [half, -half]]
    corners.append(centre + turn @ [-half, half])
    chip = np.array([[0, 0, 1], [size - 1, 0, 1], [0, size - 1, 1]], dtype=np.float64)
    return np.linalg.solve(chip, np.array(corners)).T  # [2, 3]


def frame(unit: np.ndarray, size: int, padding: float) -> np.ndarray:
    return size * (padding + unit) / (1 + 2 * padding)


def textured_image(shape: tuple[int, int], seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    noise = rng.integers(0, 256, size=(shape[0] // 8 + 2, shape[1] // 8 + 2, 3), dtype=np.uint8)
    return cv2.resize(noise, (shape[1], shape[0]), interpolation=cv2.INTER_CUBIC)


def dlib_or_skip():
    return pytest.importorskip("dlib")


# ------------------------------------------------------------------ the template and geometry
def test_template_is_the_unit_square_grown_by_padding_and_scaled():
    unit = MTCNN_DLIB_TEMPLATE
    np.testing.assert_allclose(dlib_chip_template(), 150 * (0.25 + unit) / 1.5, rtol=0, atol=1e-12)
    np.testing.assert_allclose(dlib_chip_template(200, 0.0), 200 * unit, rtol=0, atol=1e-12)
    wide = dlib_chip_template(100, 1.0)  # the unit square is the middle third
    np.testing.assert_allclose(wide, 100 * (1 + unit) / 3, rtol=0, atol=1e-12)
    # the eyes level and the face symmetric to within 2% of the square, nose below the eyes
    assert abs(unit[0, 1] - unit[1, 1]) < 0.02 and abs(unit[3, 1] - unit[4, 1]) < 0.02
    assert abs((unit[0, 0] + unit[1, 0]) / 2 - 0.5) < 0.02
    assert unit[0, 1] < unit[2, 1] < unit[3, 1]


@pytest.mark.parametrize(("size", "padding"), [(150, 0.25), (80, 0.1), (150, 0.0)])
def test_matrix_is_dlibs_rectangle_on_the_image_space_least_squares_fit(size, padding):
    rng = np.random.default_rng(size)
    unit = MTCNN_DLIB_TEMPLATE
    truth = np.array([[1.3 * math.cos(0.2), -1.3 * math.sin(0.2), 40.0]])
    truth = np.vstack([truth, [1.3 * math.sin(0.2), 1.3 * math.cos(0.2), 25.0]])
    q = frame(unit, size, padding)
    landmarks = q @ truth[:, :2].T + truth[:, 2] + rng.normal(0, 2.0, (5, 2))
    # chip frame -> image, as dlib fits, with MTCNN_DLIB_WEIGHTS
    fitted = least_squares_similarity(q, landmarks, MTCNN_DLIB_WEIGHTS)
    got = dlib_chip_matrix(landmarks, size, padding)
    np.testing.assert_allclose(got, dlib_rectangle_map(fitted, size), rtol=0, atol=1e-9)
    equal = dlib_chip_matrix(landmarks, size, padding, weights=[2, 2, 2, 2, 2])
    expected = dlib_rectangle_map(least_squares_similarity(q, landmarks), size)
    np.testing.assert_allclose(equal, expected, rtol=0, atol=1e-9)
    assert np.abs(equal - got).max() > 1e-3  # the weights matter
    # the other direction (image -> chip frame, inverted) gives another scale: not this one
    backward = least_squares_similarity(landmarks, q)
    other = dlib_rectangle_map(np.linalg.inv(np.vstack([backward, [0, 0, 1]]))[:2], size)
    assert np.abs(other - equal).max() > 1e-3


def test_weighted_similarity_is_the_weighted_least_squares_fit():
    rng = np.random.default_rng(7)
    source, target = rng.normal(0, 30, (5, 2)), rng.normal(0, 30, (5, 2))
    weights = np.array([3.0, 0.5, 0.0, 1.0, 2.0])
    np.testing.assert_allclose(
        weighted_similarity(source, target, weights),
        least_squares_similarity(source, target, weights),
        atol=1e-9,
    )
    np.testing.assert_allclose(
        weighted_similarity(source, target, np.ones(5)),
        similarity_transform(source, target),
        atol=1e-9,
    )


def test_landmarks_land_where_dlibs_pixel_map_puts_them_on_a_synthetic_image():
    size, padding, s, angle = 150, 0.25, 1.4, -0.3
    turn = np.array([[math.cos(angle), -math.sin(angle)], [math.sin(angle), math.cos(angle)]])
    q = dlib_chip_template(size, padding)
    landmarks = q @ (s * turn).T + np.array([90.0, 70.0])  # exactly a similarity of q
    image = np.zeros((420, 420, 3), np.uint8)
    for x, y in landmarks:  # a bright dot, 5 px wide, centred on each landmark
        xs, ys = np.meshgrid(np.arange(420), np.arange(420))
        blob = 255 * np.exp(-((xs - x) ** 2 + (ys - y) ** 2) / (2 * 1.5**2))
        image[..., 1] = np.maximum(image[..., 1], blob.astype(np.uint8))
    chip = dlib_chip(image, landmarks, size, padding)[..., 1].astype(np.float64)
    # where dlib puts a point q of its frame: (size-1)/2 + (q - size/2)·s·(size-1)/(size·s - 1)
    expected = (size - 1) / 2 + (q - size / 2) * s * (size - 1) / (size * s - 1)
    for x, y in expected:
        r0, c0 = round(float(y)), round(float(x))
        patch = chip[r0 - 5 : r0 + 6, c0 - 5 : c0 + 6]
        rows, cols = np.mgrid[r0 - 5 : r0 + 6, c0 - 5 : c0 + 6]
        centroid = ((patch * cols).sum() / patch.sum(), (patch * rows).sum() / patch.sum())
        assert np.hypot(centroid[0] - x, centroid[1] - y) < 0.1
    assert np.abs(expected - (q - 0.5)).max() < 0.15  # ~ q - 0.5 at this scale


def test_chip_pixel_map_is_the_rectangle_map():
    centre, s, angle, size = np.array([120.5, 99.0]), 0.8, 0.7, 112
    transform = np.array([[math.cos(angle), -math.sin(angle)], [math.sin(angle), math.cos(angle)]])
    transform = np.hstack([s * transform, (centre - s * transform @ [56, 56])[:, None]])
    np.testing.assert_allclose(
        chip_pixel_map(centre, s, angle, size), dlib_rectangle_map(transform, size), atol=1e-9
    )


def test_dlib_chip_equals_dlibs_get_face_chip_with_dlibs_own_template():
    dlib = dlib_or_skip()
    image = textured_image((400, 400))
    rng = np.random.default_rng(3)
    for size, padding, s, angle in ((150, 0.25, 1.1, 0.15), (100, 0.4, 0.9, -0.4)):
        turn = np.array([[math.cos(angle), -math.sin(angle)], [math.sin(angle), math.cos(angle)]])
        q = frame(DLIB_5POINT_MEAN_FACE, size, padding)
        points = np.round(q @ (s * turn).T + [110, 95] + rng.normal(0, 1.5, (5, 2)))
        shape = dlib.full_object_detection(
            dlib.rectangle(0, 0, 399, 399), [dlib.point(int(x), int(y)) for x, y in points]
        )
        theirs = dlib.get_face_chip(image, shape, size, padding)
        matrix = dlib_chip_matrix(points, size, padding, template=DLIB_5POINT_MEAN_FACE)
        details = dlib.get_face_chip_details(shape, size, padding)
        rect = details.rect
        centre = [(rect.left() + rect.right()) / 2, (rect.top() + rect.bottom()) / 2]
        np.testing.assert_allclose(
            matrix, chip_pixel_map(centre, rect.width() / size, details.angle, size), atol=1e-9
        )
        flags = cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP
        ours = cv2.warpAffine(image, matrix, (size, size), flags=flags)
        difference = ours.astype(int) - theirs  # dlib truncates, OpenCV rounds
        assert difference.min() >= -1 and difference.max() <= 1
        assert 0.3 < difference.mean() < 0.7


# ------------------------------------------------------------------ against dlib on LFW
# Photos of identities after the fit set's 300 (benchmarks/fit_dlib_chip_template.py).
LFW_PHOTOS = (
    "Colin_Powell/Colin_Powell_0001.jpg",
    "George_W_Bush/George_W_Bush_0010.jpg",
    "Jennifer_Lopez/Jennifer_Lopez_0001.jpg",
    "Serena_Williams/Serena_Williams_0001.jpg",
    "Tony_Blair/Tony_Blair_0001.jpg",
    "Vladimir_Putin/Vladimir_Putin_0001.jpg",
)


def dlib_model_or_skip(name: str) -> str:
    spec = importlib.util.find_spec("face_recognition_models")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("face_recognition_models (dlib's model files) is not installed")
    path = Path(spec.submodule_search_locations[0]) / "models" / name
    if not path.is_file():
        pytest.skip(f"no {path}")
    return str(path)


@pytest.mark.slow
def test_template_reproduces_dlibs_chips_on_lfw_photos():
    """dlib's five shape points in our chip lie within 4.5 px of where they lie in dlib's chip
    (mean distance of the five; under 2.5 px averaged over the six photos: 0.8 to 3.4, mean 1.9
    when written; equal least-squares weights give 2.3 to 5.7, mean 3.4, and fail), and dlib's
    descriptors of the two chips have a cosine above 0.975 (0.985 to 0.999 when written).
    benchmarks/bench_dlib_chip.py has the figures over 498 photos."""

    from PIL import Image

    from marginface.detect import MTCNN

    dlib = dlib_or_skip()
    predictor = dlib.shape_predictor(dlib_model_or_skip("shape_predictor_5_face_landmarks.dat"))
    net = dlib.face_recognition_model_v1(
        dlib_model_or_skip("dlib_face_recognition_resnet_model_v1.dat")
    )
    weights = require_mtcnn_weights()
    photos = {}
    with tarfile.open(require_shared_file("lfw", "lfw-deepfunneled.tar.gz")) as tar:
        for member in tar:
            name = member.name.split("/", 1)[-1]
            if name in LFW_PHOTOS:
                data = tar.extractfile(member).read()
                photos[name] = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    assert sorted(photos) == sorted(LFW_PHOTOS)
    detector = dlib.get_frontal_face_detector()
    found = MTCNN(weights).detect([photos[n] for n in LFW_PHOTOS])
    errors, cosines = [], []
    for name, faces in zip(LFW_PHOTOS, found, strict=True):
        photo = photos[name]
        rect = max(detector(photo, 1), key=lambda r: r.area())
        shape = predictor(photo, rect)
        parts = np.array([[shape.part(i).x, shape.part(i).y] for i in range(5)], np.float64)
        box = np.array([rect.left(), rect.top(), rect.right() + 1, rect.bottom() + 1], float)
        landmarks = faces.landmarks[int(np.argmax([iou(b, box) for b in faces.boxes]))]
        details = dlib.get_face_chip_details(shape, 150, 0.25)
        r = details.rect
        theirs = chip_pixel_map(
            [(r.left() + r.right()) / 2, (r.top() + r.bottom()) / 2],
            r.width() / 150,
            details.angle,
            150,
        )
        ours = dlib_chip_matrix(landmarks)
        errors.append(np.linalg.norm(in_chip(ours, parts) - in_chip(theirs, parts), axis=1).mean())
        a = np.asarray(net.compute_face_descriptor(dlib.get_face_chip(photo, shape, 150, 0.25)))
        b = np.asarray(net.compute_face_descriptor(dlib_chip(photo, landmarks)))
        cosines.append(a @ b / np.linalg.norm(a) / np.linalg.norm(b))
    assert max(errors) < 4.5 and np.mean(errors) < 2.5, errors
    assert min(cosines) > 0.975, cosines


def in_chip(matrix: np.ndarray, points: np.ndarray) -> np.ndarray:
    """Image points in the chip pixels of a chip pixel → image map."""
    return (points - matrix[:, 2]) @ np.linalg.inv(matrix[:, :2]).T


def iou(a: np.ndarray, b: np.ndarray) -> float:
    """Intersection over union of two ``x1, y1, x2, y2`` boxes."""
    w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    area = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1])
    return w * h / (area - w * h)


# ------------------------------------------------------------------ arguments
LANDMARKS = dlib_chip_template() * 1.2 + 30


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"image": [[0]]}, ValueError, "image must be a non-empty"),
        ({"image": np.zeros((0, 5, 3), np.uint8)}, ValueError, "image must be a non-empty"),
        ({"image": np.zeros((9, 9, 3, 1), np.uint8)}, ValueError, "image must be a non-empty"),
        ({"image": np.zeros((9, 9, 3), np.float32)}, ValueError, "image must be uint8"),
        ({"landmarks": np.zeros((4, 2))}, ValueError, r"landmarks must be five .*\(4, 2\)"),
        ({"landmarks": "eyes"}, ValueError, "landmarks must be five"),
        ({"landmarks": np.full((5, 2), np.nan)}, ValueError, "landmarks holds a non-finite"),
        ({"landmarks": np.ones((5, 2))}, ValueError, "landmarks are degenerate"),
        ({"landmarks": dlib_chip_template() / 200}, ValueError, "landmarks span too few pixels"),
        ({"size": 1}, ValueError, "size must be >= 2, got 1"),
        ({"size": 150.0}, TypeError, "size must be an integer, got 150.0"),
        ({"size": True}, TypeError, "size must be an integer, got True"),
        ({"padding": -0.1}, ValueError, "padding must be >= 0, got -0.1"),
        ({"padding": float("nan")}, ValueError, "padding must be finite"),
        ({"padding": "0.25"}, TypeError, "padding must be a real number"),
    ],
)
def test_dlib_chip_refuses_bad_arguments(kwargs, error, match):
    arguments = {"image": np.zeros((300, 300, 3), np.uint8), "landmarks": LANDMARKS, **kwargs}
    with pytest.raises(error, match=match):
        dlib_chip(**arguments)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [({"size": 0}, ValueError, "size must be >= 2"), ({"padding": -1}, ValueError, "padding")],
)
def test_dlib_chip_template_refuses_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        dlib_chip_template(**kwargs)


def test_dlib_chip_matrix_refuses_a_bad_template():
    with pytest.raises(ValueError, match=r"template must be five .*\(3, 2\)"):
        dlib_chip_matrix(LANDMARKS, template=np.zeros((3, 2)))


@pytest.mark.parametrize(
    "weights", [[1, 1, 1, 1], [1, 1, 1, 1, -1], [0, 0, 0, 0, 0], [1, 1, np.nan, 1, 1], "even"]
)
def test_dlib_chip_matrix_refuses_bad_weights(weights):
    with pytest.raises(ValueError, match="weights must be five finite numbers >= 0, not all 0"):
        dlib_chip_matrix(LANDMARKS, weights=weights)


def test_weighted_similarity_refuses_weight_on_one_point_only():
    with pytest.raises(ValueError, match="source points with weight coincide"):
        weighted_similarity(LANDMARKS, LANDMARKS, [1, 0, 0, 0, 0])


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        (([1.0, 2.0, 3.0], 1.0, 0.0, 150), ValueError, "centre must be two finite numbers"),
        (([1.0, np.inf], 1.0, 0.0, 150), ValueError, "centre must be two finite numbers"),
        (([1.0, 2.0], 0.0, 0.0, 150), ValueError, "scale must be > 0"),
        (([1.0, 2.0], 0.005, 0.0, 150), ValueError, "scale must exceed 1/size"),
        (([1.0, 2.0], 1.0, float("inf"), 150), ValueError, "angle must be finite"),
        (([1.0, 2.0], 1.0, 0.0, 1), ValueError, "size must be >= 2"),
    ],
)
def test_chip_pixel_map_refuses_bad_arguments(args, error, match):
    with pytest.raises(error, match=match):
        chip_pixel_map(*args)
