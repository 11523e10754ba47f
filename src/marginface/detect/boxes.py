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

__all__ = ["Faces", "grouped_nms", "nms", "square_boxes"]


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
    one is above ``threshold``. The overlaps are float32 arithmetic in torchvision's order:
    ``w = max(0, min(x2, x2') - max(x1, x1') + e)`` (``e`` = 1 if ``inclusive`` else 0), ``h``
    likewise, ``inter = w·h``, areas ``(x2 - x1 + e)·(y2 - y1 + e)``, and
    ``inter / (area + area' - inter)`` or ``inter / min(area, area')``.

    Args:
        boxes: ``[K, 4]`` ``(x1, y1, x2, y2)``.
        scores: ``[K]``.
        threshold: the overlap above which a box is dropped, in [0, 1].
        overlap: ``"union"``, intersection over union (IoU), or ``"min"``, intersection over
            the smaller box's area (MTCNN's last stage). Default: ``"union"``.
        inclusive: pixel-inclusive sizes ``x2 - x1 + 1`` (MTCNN's MATLAB heritage) instead of
            ``x2 - x1``. Default: False.
        order: how boxes of equal scores are visited and the overlap compared:

            - ``"stable"``: a stable descending sort (the lower index first); a box is dropped
              when its overlap is ``> threshold`` compared in float64 (torchvision's ``nms``
              since 0.12). The indices come out in visiting order.
            - ``"torchvision"``: as ``"stable"``, and with more than 1,000 boxes the kept
              indices, in increasing order, re-sorted by ``torch.sort(descending=True)`` (not
              stable), as torchvision's ``batched_nms`` returns them for one image.
            - ``"numpy"``: the reverse of NumPy's default ``np.argsort(scores)`` (ascending,
              kind ``"quicksort"``, which is not stable: on NumPy 2 with AVX-512 or AVX2 a
              sorting network decides the order of equal scores), a box kept only when its
              overlap is ``<= threshold`` in float32 (a NaN overlap drops it): facenet-pytorch
              2.6.0's ``nms_numpy``.

            Default: ``"stable"``.

    Returns:
        ``int64[k]`` indices into ``boxes``, on its device.
    """
    check_choice("overlap", overlap, ("union", "min"))
    check_choice("order", order, ("stable", "torchvision", "numpy"))
    threshold = check_real("threshold", threshold, nonnegative=True, at_most=1.0)
    if boxes.ndim != 2 or boxes.shape[-1] != 4 or scores.shape != boxes.shape[:1]:
        raise ValueError(
            f"boxes must be [K, 4] and scores [K], got {tuple(boxes.shape)} and "
            f"{tuple(scores.shape)}"
        )
    values = scores.detach().cpu()
    if order == "numpy":
        visit = np.ascontiguousarray(np.argsort(values.numpy())[::-1])
    else:
        visit = torch.sort(values, descending=True, stable=True).indices.numpy()
    corners = boxes.detach().cpu().numpy()[visit].astype(np.float32, copy=False)
    if order == "numpy":
        limit = np.float32(threshold)

        def suppressed(ratio: np.ndarray) -> np.ndarray:
            return ~(ratio <= limit)
    else:

        def suppressed(ratio: np.ndarray) -> np.ndarray:
            return ratio.astype(np.float64) > threshold

    kept = _greedy(corners, overlap, np.float32(1 if inclusive else 0), suppressed)
    keep = visit[kept]
    if order == "torchvision" and visit.shape[0] > 1000:
        keep = np.sort(keep)
        keep = keep[torch.sort(values[keep], descending=True).indices.numpy()]
    return torch.from_numpy(np.ascontiguousarray(keep, dtype=np.int64)).to(boxes.device)


_BLOCK = 1024  # boxes whose overlaps are computed as one matrix
_GROUPED = 512  # grouped_nms: boxes of consecutive groups in one overlap matrix


def _greedy(corners: np.ndarray, overlap: str, one: np.float32, suppressed) -> list[int]:
    """Positions kept when ``corners`` (float32 ``[K, 4]``) are visited in order."""
    x1, y1, x2, y2 = (np.ascontiguousarray(corners[:, i]) for i in range(4))
    area = (x2 - x1 + one) * (y2 - y1 + one)
    zero = np.float32(0)

    def dropped(rows: np.ndarray, cols: slice) -> np.ndarray:
        w = np.maximum(
            zero,
            np.minimum(x2[rows, None], x2[None, cols])
            - np.maximum(x1[rows, None], x1[None, cols])
            + one,
        )
        h = np.maximum(
            zero,
            np.minimum(y2[rows, None], y2[None, cols])
            - np.maximum(y1[rows, None], y1[None, cols])
            + one,
        )
        inter = w * h
        if overlap == "min":
            ratio = inter / np.minimum(area[rows, None], area[None, cols])
        else:
            ratio = inter / (area[rows, None] + area[None, cols] - inter)
        return suppressed(ratio)

    count = corners.shape[0]
    alive = np.ones(count, dtype=bool)
    keep = []
    with np.errstate(divide="ignore", invalid="ignore"):
        if count <= _BLOCK:
            matrix = dropped(np.arange(count), slice(None))
            for i in range(count):
                if alive[i]:
                    keep.append(i)
                    alive[i + 1 :] &= ~matrix[i, i + 1 :]
            return keep
        for i in range(count):
            if alive[i]:
                keep.append(i)
                alive[i + 1 :] &= ~dropped(np.array([i]), slice(i + 1, None))[0]
    return keep


def grouped_nms(boxes: Tensor, scores: Tensor, groups: Tensor, threshold: float) -> Tensor:
    """:func:`nms` with ``order="torchvision"`` (IoU, ``overlap="union"``, not inclusive) run
    separately on each group's boxes (boxes of different groups never suppress each other),
    in one pass: the indices kept, group by group in increasing group number, each group's
    best score first; equal to concatenating ``members[nms(boxes[members], scores[members],
    threshold, order="torchvision")]`` over ``members`` = the indices of each group.

    One overlap matrix and one greedy visit serve all the groups (the visit in each group's
    order: stable descending scores), so many small groups (MTCNN's photos of a batch) cost
    one call. A group of more than 1,000 boxes falls back to :func:`nms` for that group.

    Args:
        boxes: ``[K, 4]`` ``(x1, y1, x2, y2)``.
        scores: ``[K]``.
        groups: ``int64[K]``, each box's group (any integers).
        threshold: the IoU above which a box is dropped (float64 comparison), in [0, 1].

    Returns:
        ``int64[k]`` indices into ``boxes``, on its device.
    """
    threshold = check_real("threshold", threshold, nonnegative=True, at_most=1.0)
    if (
        boxes.ndim != 2
        or boxes.shape[-1] != 4
        or scores.shape != boxes.shape[:1]
        or groups.shape != boxes.shape[:1]
    ):
        raise ValueError(
            f"boxes must be [K, 4], scores and groups [K], got {tuple(boxes.shape)}, "
            f"{tuple(scores.shape)} and {tuple(groups.shape)}"
        )
    if boxes.shape[0] == 0:
        return torch.zeros(0, dtype=torch.int64, device=boxes.device)
    values = scores.detach().cpu()
    label = groups.detach().cpu().numpy()
    by_score = torch.sort(values, descending=True, stable=True).indices.numpy()
    visit = by_score[np.argsort(label[by_score], kind="stable")]  # by group, then score
    label = label[visit]
    starts = np.flatnonzero(np.r_[True, label[1:] != label[:-1]])
    stops = np.r_[starts[1:], visit.size].astype(np.int64)
    if (stops - starts).max() > 1000:
        kept = [
            members[nms(boxes[members], scores[members], threshold, order="torchvision")]
            for members in (
                torch.from_numpy(np.sort(visit[a:b])).to(boxes.device)
                for a, b in zip(starts, stops, strict=True)
            )
        ]
        return torch.cat(kept) if kept else boxes.new_zeros(0, dtype=torch.int64)
    corners = boxes.detach().cpu().numpy()[visit].astype(np.float32, copy=False)
    x1, y1, x2, y2 = (np.ascontiguousarray(corners[:, i]) for i in range(4))
    area = (x2 - x1) * (y2 - y1)
    keep: list[int] = []
    # consecutive groups together, up to _GROUPED boxes per overlap matrix (one group alone
    # when larger), other groups' entries masked out
    chunks, begin = [], 0
    for a, b in zip(starts.tolist(), stops.tolist(), strict=True):
        if b - begin > _GROUPED and a > begin:
            chunks.append((begin, a))
            begin = a
    chunks.append((begin, int(visit.size)))
    with np.errstate(divide="ignore", invalid="ignore"):
        for a, b in chunks:
            part = slice(a, b)
            w = np.maximum(
                np.float32(0),
                np.minimum(x2[part, None], x2[None, part])
                - np.maximum(x1[part, None], x1[None, part]),
            )
            h = np.maximum(
                np.float32(0),
                np.minimum(y2[part, None], y2[None, part])
                - np.maximum(y1[part, None], y1[None, part]),
            )
            inter = w * h
            ratio = inter / (area[part, None] + area[None, part] - inter)
            matrix = (ratio.astype(np.float64) > threshold) & (
                label[part, None] == label[None, part]
            )
            alive = np.ones(b - a, dtype=bool)
            for i in range(b - a):
                if alive[i]:
                    keep.append(a + i)
                    alive[i + 1 :] &= ~matrix[i, i + 1 :]
    chosen = visit[np.asarray(keep, dtype=np.int64)]
    return torch.from_numpy(np.ascontiguousarray(chosen, dtype=np.int64)).to(boxes.device)


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
