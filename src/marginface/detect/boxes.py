"""The detectors' shared types and box arithmetic: :class:`Faces`, greedy NMS, squares.

Boxes are ``[K, 4]`` ``(x1, y1, x2, y2)`` in image pixels (x to the right, y down); landmarks
``[K, 5, 2]`` ``(x, y)``: left eye, right eye, nose tip, left and right mouth corners (left as
seen in the image).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from .._validation import check_choice, check_real

__all__ = ["Faces", "nms", "square_boxes"]


class Faces(NamedTuple):
    """The faces found in one image, best score first (unpacks as ``boxes, scores, landmarks``).

    Attributes:
        boxes: ``float32[K, 4]``, ``(x1, y1, x2, y2)`` in pixels of the image given.
        scores: ``float32[K]``, the detector's face probability (or score) in [0, 1].
        landmarks: ``float32[K, 5, 2]``, ``(x, y)`` pixels: eyes, nose tip, mouth corners.
    """

    boxes: np.ndarray
    scores: np.ndarray
    landmarks: np.ndarray

    @staticmethod
    def empty() -> Faces:
        """No face: ``[0, 4]``, ``[0]``, ``[0, 5, 2]``."""
        return Faces(
            np.zeros((0, 4), np.float32), np.zeros(0, np.float32), np.zeros((0, 5, 2), np.float32)
        )

    @property
    def count(self) -> int:
        """The number of faces ``K``."""
        return int(self.scores.shape[0])


def nms(
    boxes: Tensor,
    scores: Tensor,
    threshold: float,
    *,
    overlap: str = "union",
    inclusive: bool = False,
    order: str = "stable",
) -> Tensor:
    """Greedy non-maximum suppression: the indices of the boxes kept, best score first.

    Visits the boxes by decreasing score and drops every later box whose overlap with a kept
    one is above ``threshold``.

    Args:
        boxes: ``[K, 4]`` ``(x1, y1, x2, y2)``.
        scores: ``[K]``.
        threshold: the overlap above which a box is dropped, in [0, 1].
        overlap: ``"union"``, intersection over union (IoU), or ``"min"``, intersection over
            the smaller box's area (MTCNN's last stage). Default: ``"union"``.
        inclusive: pixel-inclusive sizes ``x2 - x1 + 1`` (MTCNN's MATLAB heritage) instead of
            ``x2 - x1``. Default: False.
        order: how equal scores are visited. ``"stable"``: a stable descending sort, the
            lower index first (torchvision's ``nms`` since 0.12); a box is dropped when its
            overlap is ``> threshold``. ``"numpy"``: the reverse of NumPy's default
            ``np.argsort(scores)`` (ascending, kind ``"quicksort"``, which is not stable: on
            NumPy 2 with AVX-512 or AVX2 a sorting network decides the order of ties), as
            facenet-pytorch's ``nms_numpy`` visits them; a box is kept only when its overlap is
            ``<= threshold`` (so a NaN overlap drops it). Default: ``"stable"``.

    Returns:
        ``int64[k]`` indices into ``boxes``.
    """
    check_choice("overlap", overlap, ("union", "min"))
    threshold = check_real("threshold", threshold, nonnegative=True, at_most=1.0)
    if boxes.ndim != 2 or boxes.shape[-1] != 4 or scores.shape != boxes.shape[:1]:
        raise ValueError(
            f"boxes must be [K, 4] and scores [K], got {tuple(boxes.shape)} and "
            f"{tuple(scores.shape)}"
        )
    check_choice("order", order, ("stable", "numpy"))
    if order == "numpy":
        ascending = np.argsort(scores.detach().cpu().numpy())
        visit = torch.from_numpy(np.ascontiguousarray(ascending[::-1])).to(boxes.device)
    else:
        visit = torch.sort(scores, descending=True, stable=True).indices
    x1, y1, x2, y2 = boxes[visit].unbind(1)
    one = 1.0 if inclusive else 0.0
    area = (x2 - x1 + one) * (y2 - y1 + one)  # (K,)
    alive = torch.ones(visit.shape[0], dtype=torch.bool, device=boxes.device)
    keep = []
    for i in range(visit.shape[0]):
        if not alive[i]:
            continue
        keep.append(i)
        rest = slice(i + 1, None)
        width = (torch.minimum(x2[i], x2[rest]) - torch.maximum(x1[i], x1[rest]) + one).clamp(min=0)
        height = (torch.minimum(y2[i], y2[rest]) - torch.maximum(y1[i], y1[rest]) + one).clamp(
            min=0
        )
        inter = width * height
        if overlap == "min":
            ratio = inter / torch.minimum(area[i], area[rest])
        else:
            ratio = inter / (area[i] + area[rest] - inter)
        alive[rest] &= (ratio <= threshold) if order == "numpy" else ~(ratio > threshold)
    return visit[torch.tensor(keep, dtype=torch.int64, device=boxes.device)]


def square_boxes(boxes: Tensor) -> Tensor:
    """Each box grown to the square of its longer side about the same centre (a new tensor).

    ``l = max(x2 - x1, y2 - y1)``; ``x1' = x1 + (x2 - x1)/2 - l/2``, ``y1'`` likewise,
    ``x2' = x1' + l``, ``y2' = y1' + l``. ``boxes``: ``[K, >=4]``; columns after the fourth
    (scores) are kept.
    """
    out = boxes.clone()
    width = boxes[:, 2] - boxes[:, 0]
    height = boxes[:, 3] - boxes[:, 1]
    side = torch.maximum(width, height)
    out[:, 0] = boxes[:, 0] + width * 0.5 - side * 0.5
    out[:, 1] = boxes[:, 1] + height * 0.5 - side * 0.5
    out[:, 2] = out[:, 0] + side
    out[:, 3] = out[:, 1] + side
    return out
