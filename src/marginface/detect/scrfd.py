"""insightface's SCRFD / RetinaFace ONNX detectors (``det_10g.onnx``, ``det_2.5g.onnx``,
``det_500m.onnx`` of its model packs), run through onnxruntime.

J. Guo, J. Deng, A. Lattas, S. Zafeiriou, "Sample and Computation Redistribution for Efficient
Face Detection", ICLR 2022. The file's layout, as insightface's ``model_zoo/scrfd.py`` reads it:
one input ``[1, 3, H, W]`` (RGB, ``(x - 127.5) / 128``) and, for strides ``8, 16, 32`` with two
anchors per location (or ``8 ... 128`` with one, 15 outputs), the outputs in the order
``score_s`` (``[A, 1]``) for each stride, then ``bbox_s`` (``[A, 4]``), then ``kps_s``
(``[A, 10]``), ``A = (H/s)·(W/s)·anchors``, rows location-major (row, column, anchor).

Decoding: the anchor centre of location ``(i, j)`` is ``(j·s, i·s)``; a box is
``centre ∓ s·(left, top, right, bottom)``; a landmark is ``centre + s·(dx, dy)``. The photo is
resized (bilinear, aspect kept) into the top-left corner of a black ``input_size`` canvas,
anchors with ``score >= score_threshold`` kept, boxes and landmarks divided by the resize
factor, then NMS (IoU over pixel-inclusive areas, ``nms_threshold``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .._validation import check_real
from .boxes import Faces, nms

__all__ = ["SCRFD"]

_LAYOUTS = {9: ((8, 16, 32), 2), 15: ((8, 16, 32, 64, 128), 1)}


class SCRFD:
    """An SCRFD/RetinaFace ONNX face detector with five landmarks.

    Args:
        path: the ``.onnx`` file.
        input_size: ``(width, height)`` of the network's input when the file leaves it open
            (a fixed size in the file wins). Default: ``(640, 640)`` (insightface's
            ``det_size``).
        score_threshold: the face score an anchor needs, in [0, 1]. Default: 0.5.
        nms_threshold: IoU above which a lower-scored box is dropped. Default: 0.4.
        providers: onnxruntime execution providers. Default: CPU.

    Raises:
        ValueError: not an ONNX file, or not this layout (one line naming the file).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        input_size: tuple[int, int] = (640, 640),
        score_threshold: float = 0.5,
        nms_threshold: float = 0.4,
        providers: list[str] | None = None,
    ) -> None:
        import onnxruntime

        self.path = Path(path)
        self.score_threshold = check_real("score_threshold", score_threshold, at_most=1.0)
        self.nms_threshold = check_real(
            "nms_threshold", nms_threshold, nonnegative=True, at_most=1.0
        )
        if (
            not isinstance(input_size, (tuple, list))
            or len(input_size) != 2
            or not all(isinstance(v, int) and v >= 32 and v % 32 == 0 for v in input_size)
        ):
            raise ValueError(
                f"input_size must be (width, height), multiples of 32, got {input_size!r}"
            )
        if not self.path.is_file():
            raise FileNotFoundError(f"no ONNX detector at {self.path}")
        try:
            self.session = onnxruntime.InferenceSession(
                str(self.path), providers=providers or ["CPUExecutionProvider"]
            )
        except Exception as error:  # onnxruntime raises its own types for a bad file
            first = (
                str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            )
            raise ValueError(f"{self.path}: not a readable ONNX model ({first})") from None
        self.input_name, self.input_size = self._check_layout(input_size)

    def _check_layout(self, input_size: tuple[int, int]) -> tuple[str, tuple[int, int]]:
        inputs, outputs = self.session.get_inputs(), self.session.get_outputs()
        shapes = [list(o.shape) for o in outputs]
        expected = (
            "expected insightface's SCRFD/RetinaFace layout: one input [1, 3, H, W] and 9 "
            "outputs score_8/16/32 [A, 1], bbox_8/16/32 [A, 4], kps_8/16/32 [A, 10] (or 15 "
            "for strides 8..128)"
        )
        fmc = len(outputs) // 3
        ok = (
            len(inputs) == 1
            and len(inputs[0].shape) == 4
            and inputs[0].shape[1] == 3
            and len(outputs) in _LAYOUTS
            and all(
                s and s[-1] == last
                for s, last in zip(shapes, [1] * fmc + [4] * fmc + [10] * fmc, strict=True)
            )
        )
        if not ok:
            got = (
                f"{len(inputs)} input(s) {[list(i.shape) for i in inputs]}, "
                f"{len(outputs)} output(s) {shapes}"
            )
            raise ValueError(
                f"{self.path}: not a face detector of this layout ({expected}; got {got})"
            )
        self.strides, self.anchors = _LAYOUTS[len(outputs)]
        self.output_names = [o.name for o in outputs]
        height, width = inputs[0].shape[2:]
        if isinstance(height, int) and isinstance(width, int):
            return inputs[0].name, (width, height)
        return inputs[0].name, tuple(input_size)

    def _canvas(self, image: np.ndarray) -> tuple[np.ndarray, float]:
        """The photo resized into the input canvas, ``float32[1, 3, H, W]``, and the factor."""
        import cv2

        width, height = self.input_size
        h, w = image.shape[:2]
        if h / w > height / width:
            new_h, new_w = height, int(height / (h / w))
        else:
            new_w, new_h = width, int(width * (h / w))
        new_w, new_h = max(new_w, 1), max(new_h, 1)
        canvas = np.zeros((height, width, 3), np.uint8)
        canvas[:new_h, :new_w] = cv2.resize(image, (new_w, new_h))
        blob = (canvas.astype(np.float32) - 127.5) / 128.0
        return blob.transpose(2, 0, 1)[None], new_h / h

    def decode(self, outputs: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Candidates of one canvas, before NMS: ``boxes[K, 4]``, ``scores[K]``,
        ``landmarks[K, 5, 2]`` in canvas pixels (anchors with score >= the threshold)."""
        width, height = self.input_size
        fmc = len(self.strides)
        boxes, scores, points = [], [], []
        for k, stride in enumerate(self.strides):
            score = outputs[k].reshape(-1)
            distance = outputs[k + fmc].reshape(-1, 4) * stride
            offsets = outputs[k + 2 * fmc].reshape(-1, 10) * stride
            rows, cols = height // stride, width // stride
            grid = np.stack(np.meshgrid(np.arange(cols), np.arange(rows)), axis=-1)  # (r, c, 2)
            centres = np.repeat((grid.reshape(-1, 2) * stride).astype(np.float32), self.anchors, 0)
            if centres.shape[0] != score.shape[0]:
                raise ValueError(
                    f"{self.path}: stride {stride} gives {score.shape[0]} scores for "
                    f"{centres.shape[0]} anchors (input {width}x{height}): not this layout"
                )
            keep = score >= self.score_threshold
            c = centres[keep]
            boxes.append(np.concatenate([c - distance[keep, :2], c + distance[keep, 2:]], 1))
            scores.append(score[keep])
            points.append(np.tile(c, 5).reshape(-1, 5, 2) + offsets[keep].reshape(-1, 5, 2))
        return np.concatenate(boxes), np.concatenate(scores), np.concatenate(points)

    def detect(self, images: Any) -> list[Faces]:
        """The faces of each ``uint8[H, W, 3]`` RGB image (one run per image), best first."""
        from .mtcnn import to_image_batch

        if isinstance(images, np.ndarray) and images.ndim == 4:
            images = list(images)
        elif isinstance(images, (np.ndarray, torch.Tensor)):
            images = [images]
        results = []
        for i, image in enumerate(images):
            image = to_image_batch(image, f"images[{i}]")
            blob, factor = self._canvas(image)
            outputs = self.session.run(self.output_names, {self.input_name: blob})
            boxes, scores, points = self.decode(outputs)
            boxes, points = boxes / factor, points / factor
            keep = nms(
                torch.from_numpy(boxes.astype(np.float32)),
                torch.from_numpy(scores.astype(np.float32)),
                self.nms_threshold,
                inclusive=True,
            ).numpy()
            results.append(
                Faces(
                    boxes[keep].astype(np.float32),
                    scores[keep].astype(np.float32),
                    points[keep].astype(np.float32),
                )
            )
        return results
