"""SCRFD/RetinaFace ONNX detectors (marginface.detect.scrfd) on a small ONNX graph built here
with insightface's layout (input ``[1, 3, H, W]``; outputs score_8/16/32 ``[A, 1]``,
bbox_8/16/32 ``[A, 4]``, kps_8/16/32 ``[A, 10]``, two anchors per location), against the
decoding restated here from insightface's ``model_zoo/scrfd.py`` conventions; files of another
layout are refused in one line.

Tolerance: boxes and landmarks are float32 values below ~2000 px after the division by the
resize factor (spacing 1.2e-4); 1e-3 px covers a few roundings.
"""

from __future__ import annotations

import cv2
import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

from marginface.detect import SCRFD, load_detector
from tests._face_fixtures import lfw_jpegs, lfw_rgb

__all__ = ["lfw_jpegs", "lfw_rgb"]  # fixtures

STRIDES = (8, 16, 32)


def _graph(path, *, anchors=2, kps=True, fixed=None, seed=0):
    """Per stride: average-pool the input by the stride, a 1x1 convolution to
    ``anchors·(1 + 4 + 10)`` channels: sigmoid scores, softplus distances (positive), raw
    landmark offsets; each reshaped to ``[rows·cols·anchors, k]``, location-major."""
    rng = np.random.default_rng(seed)
    nodes, inits, outs = [], [], {"score": [], "bbox": [], "kps": []}
    parts = [("score", 1), ("bbox", 4)] + ([("kps", 10)] if kps else [])
    for s in STRIDES:
        nodes.append(helper.make_node("AveragePool", ["input.1"], [f"pool{s}"],
                                      kernel_shape=[s, s], strides=[s, s]))  # fmt: skip
        for part, k in parts:
            weight = rng.normal(0, 1.5, (anchors * k, 3, 1, 1)).astype(np.float32)
            bias = rng.normal(-2.5 if part == "score" else 0, 0.5, anchors * k).astype(np.float32)
            inits += [numpy_helper.from_array(weight, f"w_{part}{s}"),
                      numpy_helper.from_array(bias, f"b_{part}{s}")]  # fmt: skip
            nodes.append(helper.make_node("Conv", [f"pool{s}", f"w_{part}{s}", f"b_{part}{s}"],
                                          [f"c_{part}{s}"]))  # fmt: skip
            act = {"score": "Sigmoid", "bbox": "Softplus", "kps": "Identity"}[part]
            nodes.append(helper.make_node(act, [f"c_{part}{s}"], [f"a_{part}{s}"]))
            nodes.append(helper.make_node("Transpose", [f"a_{part}{s}"], [f"t_{part}{s}"],
                                          perm=[0, 2, 3, 1]))  # fmt: skip
            inits.append(numpy_helper.from_array(np.array([-1, k], np.int64), f"shape_{part}{s}"))
            nodes.append(helper.make_node("Reshape", [f"t_{part}{s}", f"shape_{part}{s}"],
                                          [f"{part}_{s}"]))  # fmt: skip
            outs[part].append(
                helper.make_tensor_value_info(f"{part}_{s}", TensorProto.FLOAT, [None, k])
            )
    height, width = fixed if fixed else ("H", "W")
    graph = helper.make_graph(
        nodes, "scrfd_layout",
        [helper.make_tensor_value_info("input.1", TensorProto.FLOAT, [1, 3, height, width])],
        outs["score"] + outs["bbox"] + outs["kps"], inits,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def _reference(path, image, size=(640, 640), threshold=0.5, nms_threshold=0.4):
    """insightface's steps restated: aspect-kept resize into the top-left of the canvas,
    (x - 127.5) / 128, anchors (j·s, i·s) twice per location, boxes centre ∓ s·d, landmarks
    centre + s·d, score >= threshold, divide by the factor, greedy NMS on (w+1)(h+1) IoU."""
    h, w = image.shape[:2]
    if h / w > size[1] / size[0]:
        nh, nw = size[1], int(size[1] / (h / w))
    else:
        nw, nh = size[0], int(size[0] * (h / w))
    canvas = np.zeros((size[1], size[0], 3), np.uint8)
    canvas[:nh, :nw] = cv2.resize(image, (nw, nh))
    blob = ((canvas.astype(np.float32) - 127.5) / 128.0).transpose(2, 0, 1)[None]
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    outs = session.run(None, {"input.1": blob})
    boxes, scores, points = [], [], []
    for k, s in enumerate(STRIDES):
        centres = [(j * s, i * s) for i in range(size[1] // s) for j in range(size[0] // s)
                   for _ in range(2)]  # fmt: skip
        for a, (cx, cy) in enumerate(centres):
            if outs[k][a, 0] >= threshold:
                d, p = outs[k + 3][a] * s, outs[k + 6][a] * s
                boxes.append([cx - d[0], cy - d[1], cx + d[2], cy + d[3]])
                scores.append(outs[k][a, 0])
                points.append([[cx + p[2 * m], cy + p[2 * m + 1]] for m in range(5)])
    factor = nh / h
    boxes = np.array(boxes, np.float32).reshape(-1, 4) / factor
    points = np.array(points, np.float32).reshape(-1, 5, 2) / factor
    scores = np.array(scores, np.float32)
    order, keep = np.argsort(-scores, kind="stable"), []
    area = (boxes[:, 2] - boxes[:, 0] + 1) * (boxes[:, 3] - boxes[:, 1] + 1)
    while order.size:
        i, rest = order[0], order[1:]
        keep.append(i)
        iw = np.maximum(
            0, np.minimum(boxes[i, 2], boxes[rest, 2]) - np.maximum(boxes[i, 0], boxes[rest, 0]) + 1
        )
        ih = np.maximum(
            0, np.minimum(boxes[i, 3], boxes[rest, 3]) - np.maximum(boxes[i, 1], boxes[rest, 1]) + 1
        )
        inter = iw * ih
        order = rest[inter / (area[i] + area[rest] - inter) <= nms_threshold]
    return boxes[keep], scores[keep], points[keep]


@pytest.mark.parametrize("size", [(640, 640), (320, 256)])
def test_decoding_equals_the_restated_steps(lfw_rgb, tmp_path, size):
    path = _graph(tmp_path / "det.onnx")
    detector = SCRFD(path, input_size=size)
    image = np.concatenate([lfw_rgb[0], lfw_rgb[1][:, :120]], axis=1)  # 250 x 370: not square
    (faces,) = detector.detect(image)
    boxes, scores, points = _reference(path, image, size)
    assert faces.count == len(scores) >= 5  # the graph scores many anchors above 0.5
    np.testing.assert_allclose(faces.boxes, boxes, rtol=0, atol=1e-3)
    np.testing.assert_allclose(faces.scores, scores, rtol=0, atol=1e-6)
    np.testing.assert_allclose(faces.landmarks, points, rtol=0, atol=1e-3)


def test_thresholds_and_a_fixed_input_size(lfw_rgb, tmp_path):
    path = _graph(tmp_path / "fixed.onnx", fixed=(256, 320))
    detector = SCRFD(path, input_size=(640, 640), score_threshold=0.7)
    assert detector.input_size == (320, 256)  # (width, height) from the file wins
    (faces,) = detector.detect(lfw_rgb[2])
    boxes, scores, _ = _reference(path, lfw_rgb[2], (320, 256), threshold=0.7)
    assert faces.count == len(scores) >= 1 and np.all(faces.scores >= 0.7)
    assert (
        detector.detect(lfw_rgb[2])[0].count
        < SCRFD(path, score_threshold=0.5).detect(lfw_rgb[2])[0].count
    )
    np.testing.assert_allclose(faces.boxes, boxes, rtol=0, atol=1e-3)
    assert isinstance(load_detector(path), SCRFD)


def test_another_layout_is_refused_in_one_line(tmp_path):
    no_kps = _graph(tmp_path / "nokps.onnx", kps=False)
    with pytest.raises(ValueError, match=r"nokps\.onnx: not a face detector of this layout") as e:
        SCRFD(no_kps)
    assert "6 output(s)" in str(e.value) and "\n" not in str(e.value)
    one_anchor = _graph(tmp_path / "one.onnx", anchors=1)  # 9 outputs but one anchor each
    with pytest.raises(ValueError, match=r"one\.onnx: stride 8 gives 6400 scores for 12800"):
        SCRFD(one_anchor).detect(np.zeros((64, 64, 3), np.uint8))
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"not onnx at all")
    with pytest.raises(ValueError, match=r"junk\.onnx: not a readable ONNX model") as e:
        SCRFD(junk)
    assert "\n" not in str(e.value)
    with pytest.raises(FileNotFoundError, match="no ONNX detector at"):
        SCRFD(tmp_path / "absent.onnx")


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"input_size": (640, 100)}, "input_size must be"),
        ({"input_size": 640}, "input_size must be"),
        ({"score_threshold": 1.5}, "score_threshold must be <= 1"),
        ({"nms_threshold": -0.1}, "nms_threshold must be >= 0"),
    ],
)
def test_bad_options(tmp_path, options, match):
    with pytest.raises(ValueError, match=match):
        SCRFD(_graph(tmp_path / "d.onnx"), **options)
