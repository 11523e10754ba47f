"""MTCNN restated for the tests, independently of ``marginface.detect``: the networks as
functional calls on the state dicts, the proposals, NMS and box arithmetic in NumPy, from the
paper (Zhang et al., IEEE SPL 2016) and facenet-pytorch 2.6.0's documented defaults
(min_face_size 20, thresholds 0.6/0.7/0.7, factor 0.709, inputs ``(x - 127.5) / 128``, area
resampling, NMS 0.5 then 0.7 (IoU) in stage 1, 0.7 (IoU) in stage 2, 0.7 over the smaller
pixel-inclusive area in stage 3).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F


def _pnet(s, x):
    x = F.max_pool2d(
        F.prelu(F.conv2d(x, s["conv1.weight"], s["conv1.bias"]), s["prelu1.weight"]),
        2,
        2,
        ceil_mode=True,
    )
    x = F.prelu(F.conv2d(x, s["conv2.weight"], s["conv2.bias"]), s["prelu2.weight"])
    x = F.prelu(F.conv2d(x, s["conv3.weight"], s["conv3.bias"]), s["prelu3.weight"])
    prob = F.softmax(F.conv2d(x, s["conv4_1.weight"], s["conv4_1.bias"]), dim=1)
    return F.conv2d(x, s["conv4_2.weight"], s["conv4_2.bias"]), prob


def _convs(s, x, layers):
    for i, pool in layers:
        x = F.prelu(F.conv2d(x, s[f"conv{i}.weight"], s[f"conv{i}.bias"]), s[f"prelu{i}.weight"])
        if pool:
            x = F.max_pool2d(x, pool[0], pool[1], ceil_mode=True)
    return x.permute(0, 3, 2, 1).flatten(1)  # Caffe's (N, W, H, C) flattening


def _rnet(s, x):
    x = _convs(s, x, [(1, (3, 2)), (2, (3, 2)), (3, None)])
    x = F.prelu(F.linear(x, s["dense4.weight"], s["dense4.bias"]), s["prelu4.weight"])
    prob = F.softmax(F.linear(x, s["dense5_1.weight"], s["dense5_1.bias"]), dim=1)
    return F.linear(x, s["dense5_2.weight"], s["dense5_2.bias"]), prob


def _onet(s, x):
    x = _convs(s, x, [(1, (3, 2)), (2, (3, 2)), (3, (2, 2)), (4, None)])
    x = F.prelu(F.linear(x, s["dense5.weight"], s["dense5.bias"]), s["prelu5.weight"])
    prob = F.softmax(F.linear(x, s["dense6_1.weight"], s["dense6_1.bias"]), dim=1)
    reg = F.linear(x, s["dense6_2.weight"], s["dense6_2.bias"])
    return reg, F.linear(x, s["dense6_3.weight"], s["dense6_3.bias"]), prob


def greedy_nms(boxes, scores, threshold, smaller=False):
    """Indices kept, best first: IoU (areas w·h) or, with ``smaller``, intersection over the
    smaller pixel-inclusive area ((w+1)·(h+1))."""
    one = np.float32(1 if smaller else 0)
    x1, y1, x2, y2 = (boxes[:, i] for i in range(4))
    area = (x2 - x1 + one) * (y2 - y1 + one)
    order = list(np.argsort(-scores, kind="stable"))
    keep = []
    while order:
        i, order = order[0], order[1:]
        keep.append(i)
        rest = np.array(order, dtype=np.int64)
        w = np.maximum(
            np.float32(0), np.minimum(x2[i], x2[rest]) - np.maximum(x1[i], x1[rest]) + one
        )
        h = np.maximum(
            np.float32(0), np.minimum(y2[i], y2[rest]) - np.maximum(y1[i], y1[rest]) + one
        )
        inter = w * h
        ratio = inter / (
            np.minimum(area[i], area[rest]) if smaller else area[i] + area[rest] - inter
        )
        order = [j for j, r in zip(order, ratio, strict=True) if not r > threshold]
    return np.array(keep, dtype=np.int64)


def _square(b):
    w, h = b[:, 2] - b[:, 0], b[:, 3] - b[:, 1]
    side = np.maximum(w, h)
    b = b.copy()
    b[:, 0] = b[:, 0] + w * np.float32(0.5) - side * np.float32(0.5)
    b[:, 1] = b[:, 1] + h * np.float32(0.5) - side * np.float32(0.5)
    b[:, 2], b[:, 3] = b[:, 0] + side, b[:, 1] + side
    return b


def _inside_crops(image, boxes, side):
    """image: float32 tensor [1, 3, H, W]; each box's in-image pixels, area-resampled."""
    h, w = image.shape[2:]
    out = []
    for x1, y1, x2, y2 in np.trunc(boxes[:, :4]).astype(np.int64):
        x1, y1, x2, y2 = max(x1, 1), max(y1, 1), min(x2, w), min(y2, h)
        out.append(F.adaptive_avg_pool2d(image[:, :, y1 - 1 : y2, x1 - 1 : x2], side))
    return (torch.cat(out) - 127.5) * 0.0078125


def _regress(b, reg):
    b = b.copy()
    w, h = b[:, 2] - b[:, 0] + 1, b[:, 3] - b[:, 1] + 1
    b[:, :4] = b[:, :4] + reg * np.stack([w, h, w, h], axis=1)
    return b


def mtcnn_reference(image, states, min_face=20.0, thresholds=(0.6, 0.7, 0.7), factor=0.709):
    """One uint8 RGB [H, W, 3] image -> (boxes[K, 4], scores[K], landmarks[K, 5, 2]), NumPy."""
    with torch.no_grad():
        x = torch.from_numpy(image).permute(2, 0, 1)[None].float()
        h, w = image.shape[:2]
        proposals = []
        scale = 12.0 / min_face
        while min(h, w) * scale >= 12:
            level = F.adaptive_avg_pool2d(x, (int(h * scale + 1), int(w * scale + 1)))
            reg, prob = _pnet(states["pnet"], (level - 127.5) * 0.0078125)
            p, reg = prob[0, 1].numpy(), reg[0].numpy()
            rows, cols = np.nonzero(p >= thresholds[0])
            cells = np.stack([cols, rows], axis=1).astype(np.float32)
            b = np.concatenate(
                [
                    np.floor((2 * cells + 1) / np.float32(scale)),
                    np.floor((2 * cells + 12) / np.float32(scale)),
                    p[rows, cols][:, None],
                    reg[:, rows, cols].T,
                ],
                axis=1,
            )
            proposals.append(b[greedy_nms(b, b[:, 4], 0.5)])
            scale *= factor
        b = np.concatenate(proposals)
        b = b[greedy_nms(b, b[:, 4], 0.7)]
        w_, h_ = b[:, 2] - b[:, 0], b[:, 3] - b[:, 1]
        b = np.concatenate([b[:, :4] + b[:, 5:9] * np.stack([w_, h_, w_, h_], 1), b[:, 4:5]], 1)
        b = _square(b)
        empty = (
            np.zeros((0, 4), np.float32),
            np.zeros(0, np.float32),
            np.zeros((0, 5, 2), np.float32),
        )
        if not len(b):
            return empty
        reg, prob = (t.numpy() for t in _rnet(states["rnet"], _inside_crops(x, b, 24)))
        ok = prob[:, 1] > thresholds[1]
        b = np.concatenate([b[ok, :4], prob[ok, 1:2]], 1)
        keep = greedy_nms(b, b[:, 4], 0.7)
        b = _square(_regress(b[keep], reg[ok][keep]))
        if not len(b):
            return empty
        reg, marks, prob = (t.numpy() for t in _onet(states["onet"], _inside_crops(x, b, 48)))
        ok = prob[:, 1] > thresholds[2]
        b, reg, marks = np.concatenate([b[ok, :4], prob[ok, 1:2]], 1), reg[ok], marks[ok]
        w_, h_ = b[:, 2:3] - b[:, 0:1] + 1, b[:, 3:4] - b[:, 1:2] + 1
        points = np.stack([w_ * marks[:, :5] + b[:, 0:1] - 1, h_ * marks[:, 5:] + b[:, 1:2] - 1], 2)
        b = _regress(b, reg)
        keep = greedy_nms(b, b[:, 4], 0.7, smaller=True)
        return b[keep, :4], b[keep, 4], points[keep]
