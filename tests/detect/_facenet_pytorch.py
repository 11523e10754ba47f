"""facenet-pytorch 2.6.0's own MTCNN code (``facenet_pytorch/models/utils/detect_face.py`` and
its ``PNet``/``RNet``/``ONet``), loaded from the installed package beside a torch that has no
torchvision.

``detect_face.py`` imports ``torchvision.transforms.functional`` (unused by ``detect_face``)
and ``torchvision.ops.boxes.batched_nms``. When torchvision is absent, a stand-in package
provides ``batched_nms`` restated from torchvision 0.17 (the last release for facenet-pytorch's
``torch<2.3``), ``torchvision/ops/boxes.py`` and ``csrc/ops/cpu/nms_kernel.cpp``:

- ``nms``: boxes visited by a *stable* descending sort of the scores; areas ``(x2 - x1)·(y2 -
  y1)``; a later box is suppressed when ``inter / (area_i + area_j - inter) > threshold``
  (float32 arithmetic, ``w = max(0, min(x2) - max(x1))``);
- ``batched_nms``: more than 4,000 numbers in ``boxes`` (CPU): NMS per index, the kept indices
  in increasing order re-sorted by ``scores.sort(descending=True)`` (not stable); otherwise the
  boxes of index ``k`` shifted by ``k · (max(boxes) + 1)`` and one NMS.

The stand-in leaves ``sys.modules`` once the files are loaded. Used by the parity tests and
``benchmarks/bench_detect.py``.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from typing import Any

import torch
from torch import Tensor

__all__ = ["FacenetMTCNN", "load_facenet_mtcnn", "torchvision_batched_nms", "torchvision_nms"]


def torchvision_nms(boxes: Tensor, scores: Tensor, iou_threshold: float) -> Tensor:
    """torchvision's CPU ``nms`` restated (see the module docstring): kept indices, int64."""
    if boxes.numel() == 0:
        return torch.empty(0, dtype=torch.int64)
    x1, y1, x2, y2 = (boxes[:, k].contiguous() for k in range(4))
    areas = (x2 - x1) * (y2 - y1)
    order = torch.sort(scores, dim=0, descending=True, stable=True).indices.tolist()
    suppressed = torch.zeros(boxes.shape[0], dtype=torch.bool)
    keep = []
    for position, i in enumerate(order):
        if suppressed[i]:
            continue
        keep.append(i)
        later = torch.tensor(order[position + 1 :], dtype=torch.int64)
        if later.numel() == 0:
            break
        zero = torch.zeros((), dtype=boxes.dtype)
        w = torch.maximum(zero, torch.minimum(x2[i], x2[later]) - torch.maximum(x1[i], x1[later]))
        h = torch.maximum(zero, torch.minimum(y2[i], y2[later]) - torch.maximum(y1[i], y1[later]))
        inter = w * h
        overlap = inter / (areas[i] + areas[later] - inter)
        # the C++ kernel compares the float overlap with the double threshold
        suppressed[later] |= overlap.double() > iou_threshold
    return torch.tensor(keep, dtype=torch.int64)


def torchvision_batched_nms(
    boxes: Tensor, scores: Tensor, idxs: Tensor, iou_threshold: float
) -> Tensor:
    """torchvision 0.17's ``batched_nms`` restated (CPU; see the module docstring)."""
    if boxes.numel() > 4000:
        keep_mask = torch.zeros_like(scores, dtype=torch.bool)
        for class_id in torch.unique(idxs):
            current = torch.where(idxs == class_id)[0]
            kept = torchvision_nms(boxes[current], scores[current], iou_threshold)
            keep_mask[current[kept]] = True
        keep_indices = torch.where(keep_mask)[0]
        return keep_indices[scores[keep_indices].sort(descending=True)[1]]
    if boxes.numel() == 0:
        return torch.empty((0,), dtype=torch.int64, device=boxes.device)
    max_coordinate = boxes.max()
    offsets = idxs.to(boxes) * (max_coordinate + torch.tensor(1).to(boxes))
    return torchvision_nms(boxes + offsets[:, None], scores, iou_threshold)


class FacenetMTCNN:
    """facenet-pytorch's ``detect_face`` with its pretrained networks and default settings
    (min_face_size 20, thresholds 0.6/0.7/0.7, factor 0.709, CPU).

    ``detect(image uint8[H, W, 3])`` gives ``(boxes float32[K, 4], scores float32[K],
    landmarks float32[K, 5, 2])`` in ``detect_face``'s order (best score first, the order of
    its last NMS), for one image as ``MTCNN.detect`` would run it (before its area sort).
    """

    def __init__(self, module: Any, nets: Any) -> None:
        self.module = module
        self.pnet = nets.PNet().eval()
        self.rnet = nets.RNet().eval()
        self.onet = nets.ONet().eval()

    def detect_batch(self, images: Any) -> tuple[Any, Any]:
        """``detect_face`` on ``images`` as facenet-pytorch's ``MTCNN.detect`` calls it."""
        with torch.no_grad():
            return self.module.detect_face(
                images, 20, self.pnet, self.rnet, self.onet, [0.6, 0.7, 0.7], 0.709, "cpu"
            )

    def detect(self, image: Any) -> tuple[Any, Any, Any]:
        """One image's boxes, scores and landmarks (see the class docstring)."""
        boxes, points = self.detect_batch(image)
        boxes, points = boxes[0], points[0]
        return boxes[:, :4], boxes[:, 4], points


def load_facenet_mtcnn() -> FacenetMTCNN:
    """The installed facenet-pytorch's ``detect_face`` and networks (ImportError if absent)."""
    if importlib.util.find_spec("facenet_pytorch") is None:
        raise ImportError("facenet-pytorch is not installed")
    stand_ins: dict[str, types.ModuleType] = {}
    if importlib.util.find_spec("torchvision") is None:
        for name in ("torchvision", "torchvision.transforms", "torchvision.ops"):
            stand_ins[name] = types.ModuleType(name)
        stand_ins["torchvision.transforms.functional"] = types.ModuleType("functional")
        boxes = types.ModuleType("torchvision.ops.boxes")
        boxes.batched_nms = torchvision_batched_nms
        stand_ins["torchvision.ops.boxes"] = boxes
        stand_ins["torchvision.transforms"].functional = stand_ins[
            "torchvision.transforms.functional"
        ]
        stand_ins["torchvision.ops"].boxes = boxes
    saved = {name: sys.modules.get(name) for name in stand_ins}
    sys.modules.update(stand_ins)
    try:
        module = importlib.import_module("facenet_pytorch.models.utils.detect_face")
        nets = importlib.import_module("facenet_pytorch.models.mtcnn")
    finally:
        for name, previous in saved.items():
            if previous is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = previous
    return FacenetMTCNN(module, nets)
