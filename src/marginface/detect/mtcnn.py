"""MTCNN: the P-Net → R-Net → O-Net cascade, batched over images of one size.

K. Zhang, Z. Zhang, Z. Li, Y. Qiao, "Joint Face Detection and Alignment using Multi-task
Cascaded Convolutional Networks", IEEE Signal Processing Letters 23(10), 2016; the steps and
defaults of facenet-pytorch 2.6.0's ``MTCNN.detect`` (whose weights this reads,
:mod:`.weights`), so that its boxes, probabilities and landmarks come out equal:

1. **Pyramid**: scales ``s_k = (12 / min_face_size) · factor^k`` while
   ``min(H, W) · s_k >= 12``; each level is the image resized to
   ``(int(H·s_k + 1), int(W·s_k + 1))`` by area averaging, normalized ``(x - 127.5) / 128``.
2. **P-Net** on each level: a cell ``(i, j)`` whose face probability is ``>= thresholds[0]``
   proposes the window ``floor((2j + 1) / s)``, ``floor((2i + 1) / s)``,
   ``floor((2j + 12) / s)``, ``floor((2i + 12) / s)``; NMS (IoU 0.5) per level and image, then
   NMS (IoU 0.7) over the levels; each box moves by its regression times its width/height
   (``x2 - x1``), then becomes the square of its longer side.
3. **R-Net** on each box's pixels inside the image (integer corners, clipped; not padded)
   resized to 24×24 by area averaging: probability ``> thresholds[1]``, NMS (IoU 0.7),
   regression times ``x2 - x1 + 1``, square.
4. **O-Net** on 48×48 crops the same way: probability ``> thresholds[2]``; the landmarks are
   ``x1 - 1 + (x2 - x1 + 1) · p`` (and y) on the box before its regression; regression; NMS
   over the smaller area (``"min"``, pixel-inclusive sizes, 0.7).

NMS runs per image, so a batch gives each image what it alone would give (facenet-pytorch
separates the images of a batch by shifting their boxes, which can let boxes of neighbouring
images with negative coordinates meet).

**Bit for bit** (unless ``batch_networks=True``). On CPU (float32), each image's boxes,
scores and landmarks equal those of facenet-pytorch's ``detect_face`` run on that image alone,
whatever the batch
(``tests/detect/test_mtcnn.py`` runs facenet-pytorch's own code): the networks are called
per image with the shapes and memory layouts facenet-pytorch gives them (PyTorch chooses a
convolution kernel by the batch size and layout, and the kernels round differently): each
pyramid level in channels-last memory, the crops of one image contiguous, in calls of at most
512; the NMS of stages 1 and 2 as torchvision's (stable order, float64 comparison, more than
1,000 boxes re-sorted), the last as ``nms_numpy`` (:func:`~marginface.detect.boxes.nms`,
``order``). The area resampling and max pooling are computed faster with the same values
(:mod:`.mtcnn_ops`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._validation import check_device, check_int, check_real
from .boxes import Faces, grouped_nms, nms, square_boxes
from .mtcnn_nets import ONet, PNet, RNet
from .mtcnn_ops import area_crops, area_resize, integral_images
from .weights import INSTALL_HINT, WeightsError, read_mtcnn_weights

__all__ = ["MTCNN", "pyramid_scales", "to_image_batch"]

_CHUNK = 512  # crops per R-Net/O-Net call (bounds the memory of a crowded image)


def pyramid_scales(height: int, width: int, min_face_size: float, factor: float) -> list[float]:
    """The pyramid's scales: ``(12 / min_face_size) · factor^k`` while the shorter side at
    that scale is still ``>= 12`` pixels (P-Net's window). Python floats, in the order used."""
    scale = 12.0 / min_face_size
    shortest = min(height, width) * scale
    scales = []
    while shortest >= 12:
        scales.append(scale)
        scale *= factor
        shortest *= factor
    return scales


def to_image_batch(image: object, name: str = "image") -> np.ndarray:
    """One image as ``uint8[H, W, 3]`` RGB: a ``uint8`` ``[H, W]`` (grey) or ``[H, W, 1]``
    is repeated to three channels, ``[H, W, 4]`` (RGBA) loses its alpha.

    Raises:
        TypeError: not a NumPy array or tensor of ``uint8``; ValueError: another shape.
    """
    if isinstance(image, Tensor):
        image = image.detach().cpu().numpy()
    if not isinstance(image, np.ndarray):
        raise TypeError(f"{name} must be a uint8 array [H, W, 3], got {type(image).__name__}")
    if image.dtype != np.uint8:
        raise TypeError(f"{name} must be uint8 (0..255, RGB), got {image.dtype}")
    if image.ndim == 2:
        image = image[:, :, None]
    if image.ndim != 3 or image.shape[2] not in (1, 3, 4) or min(image.shape[:2]) < 1:
        raise ValueError(f"{name} must be [H, W, 3] RGB (or grey/RGBA), got {image.shape}")
    if image.shape[2] == 1:
        image = np.repeat(image, 3, axis=2)
    return np.ascontiguousarray(image[:, :, :3])


def _load_into(module: nn.Module, state: dict[str, Tensor], name: str, source: object) -> None:
    try:
        module.load_state_dict(state)
    except RuntimeError as error:
        first = str(error).strip().splitlines()
        detail = first[1].strip() if len(first) > 1 else first[0]
        raise WeightsError(
            f"{source or 'facenet-pytorch'}: {name}.pt is not MTCNN's {name} ({detail}). "
            f"{INSTALL_HINT}"
        ) from None


class MTCNN(nn.Module):
    """The MTCNN face detector with facenet-pytorch 2.6.0's weights and defaults.

    Args:
        weights: where the weights are (:func:`~marginface.detect.weights.read_mtcnn_weights`):
            None for the installed facenet-pytorch, a folder or its wheel file.
        min_face_size: the smallest face searched for, pixels. Default: 20.
        thresholds: the face probabilities P-Net (``>=``), R-Net and O-Net (``>``) require.
            Default: ``(0.6, 0.7, 0.7)``.
        factor: the pyramid's step between scales, in (0, 1). Default: 0.709.
        max_side: an image whose longer side exceeds this many pixels is first shrunk to it
            (area averaging, rounded to uint8 like a resized photo) and its boxes and
            landmarks mapped back; None never shrinks.
            Default: 1600 (no effect on LFW's 250×250).
        device: where the networks run (``"cpu"``, ``"cuda"``...). Default: CPU.
        batch_networks: run P-Net once per pyramid level over all the photos of a batch
            instead of photo by photo (R-Net and O-Net stay per photo: larger calls were
            measured slower on CPU). About 10 % faster for 16 photos of one size, but PyTorch
            then picks other convolution kernels, so the last bits of the numbers, and in
            principle a box near a threshold, differ from facenet-pytorch's and from one
            photo per call (docs/benchmarks.md, issue 47, measures how much).
            Default: False (bit for bit).

    ``detect(images)`` gives one :class:`~marginface.detect.Faces` per image.
    """

    def __init__(
        self,
        weights: str | os.PathLike[str] | None = None,
        *,
        min_face_size: float = 20.0,
        thresholds: Sequence[float] = (0.6, 0.7, 0.7),
        factor: float = 0.709,
        max_side: int | None = 1600,
        device: str | torch.device | None = None,
        batch_networks: bool = False,
    ) -> None:
        super().__init__()
        self.min_face_size = check_real("min_face_size", min_face_size, positive=True)
        if isinstance(thresholds, (str, bytes)) or len(thresholds) != 3:
            raise ValueError(f"thresholds must be three probabilities, got {thresholds!r}")
        self.thresholds = tuple(
            check_real(f"thresholds[{i}]", t, nonnegative=True, at_most=1.0)
            for i, t in enumerate(thresholds)
        )
        self.factor = check_real("factor", factor, positive=True, below=1.0)
        self.max_side = None if max_side is None else check_int("max_side", max_side, minimum=12)
        if not isinstance(batch_networks, bool):
            raise TypeError(f"batch_networks must be True or False, got {batch_networks!r}")
        self.batch_networks = batch_networks
        self.pnet, self.rnet, self.onet = PNet(), RNet(), ONet()
        states = read_mtcnn_weights(weights)
        for name in ("pnet", "rnet", "onet"):
            _load_into(getattr(self, name), states[name], name, weights)
        self.eval()
        self.requires_grad_(False)
        self.to(check_device("device", device) or torch.device("cpu"))

    @property
    def device(self) -> torch.device:
        """Where the networks are."""
        return self.pnet.conv1.weight.device

    @torch.inference_mode()
    def detect(self, images: object) -> list[Faces]:
        """The faces in each image, best score first.

        Args:
            images: one ``uint8[H, W, 3]`` RGB image (NumPy or tensor), a ``uint8[N, H, W, 3]``
                batch, or a sequence of images (any sizes: images of one size run as one
                batch). Grey ``[H, W]`` and RGBA are accepted (:func:`to_image_batch`).

        Returns:
            one :class:`~marginface.detect.Faces` per image, in order.
        """
        if isinstance(images, (np.ndarray, Tensor)) and images.ndim == 4:
            images = list(images)
        elif isinstance(images, (np.ndarray, Tensor)):
            images = [images]
        if not isinstance(images, Sequence) or isinstance(images, (str, bytes)):
            raise TypeError(f"images must be an image or a sequence of images, got {images!r}")
        arrays = [to_image_batch(image, f"images[{i}]") for i, image in enumerate(images)]
        results: list[Faces | None] = [None] * len(arrays)
        groups: dict[tuple[int, int], list[int]] = {}
        for index, array in enumerate(arrays):
            groups.setdefault(array.shape[:2], []).append(index)
        for (height, width), indices in groups.items():
            pixels = torch.from_numpy(np.stack([arrays[i] for i in indices])).to(self.device)
            ratio = 1.0
            if self.max_side is not None and max(height, width) > self.max_side:
                ratio = self.max_side / max(height, width)
                size = (max(1, round(height * ratio)), max(1, round(width * ratio)))
                shrunk = F.interpolate(pixels.permute(0, 3, 1, 2).float(), size=size, mode="area")
                pixels = shrunk.round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1)
            for index, faces in zip(indices, self._cascade(pixels), strict=True):
                if ratio != 1.0:
                    scale = np.float32(1.0 / ratio)
                    faces = Faces(faces.boxes * scale, faces.scores, faces.landmarks * scale)
                results[index] = faces
        return [r if r is not None else Faces.empty() for r in results]

    def _per_image_nms(
        self, boxes: Tensor, image: Tensor, threshold: float, overlap: str = "union"
    ) -> Tensor:
        """Indices kept by NMS run separately on each image's boxes, image by image."""
        if overlap == "union":  # torchvision's order: all the images in one pass
            return grouped_nms(boxes[:, :4], boxes[:, 4], image, threshold)
        kept = [
            members[
                nms(
                    boxes[members, :4],
                    boxes[members, 4],
                    threshold,
                    overlap=overlap,
                    inclusive=overlap == "min",
                    order="numpy" if overlap == "min" else "torchvision",
                )
            ]
            for members in (torch.nonzero(image == i).flatten() for i in image.unique())
        ]
        return torch.cat(kept) if kept else image.new_zeros(0)

    def _proposals(self, batch: Tensor, integral: Tensor) -> tuple[Tensor, Tensor]:
        """Stage 1: ``boxes[K, 5]`` (corners, probability) and ``image[K]``."""
        height, width = batch.shape[2:]
        found, images = [], []
        for scale in pyramid_scales(height, width, self.min_face_size, self.factor):
            size = (int(height * scale + 1), int(width * scale + 1))
            try:
                level = area_resize(integral, size)
            except ValueError:  # windows too large for integer sums: PyTorch's own resize
                level = F.interpolate(batch.float(), size=size, mode="area")
            level = level.sub_(127.5).mul_(0.0078125)  # a new tensor: normalized in place
            # one image per call: facenet-pytorch's kernels (PyTorch picks a convolution
            # by the batch size), so each image's numbers are the ones it would get alone
            if self.batch_networks:
                regression, probability = self.pnet(level)
            else:
                outs = [self.pnet(level[i : i + 1]) for i in range(level.shape[0])]
                regression, probability = (torch.cat(parts) for parts in zip(*outs, strict=True))
            face = probability[:, 1]  # (B, h, w)
            cells = torch.nonzero(face >= self.thresholds[0])  # (K, 3): image, row, column
            corner = cells[:, 1:].to(face.dtype).flip(1)  # (K, 2): column, row
            top_left = ((2 * corner + 1) / scale).floor()
            bottom_right = ((2 * corner + 12) / scale).floor()
            offsets = regression.permute(0, 2, 3, 1)[cells[:, 0], cells[:, 1], cells[:, 2]]
            score = face[cells[:, 0], cells[:, 1], cells[:, 2]]
            boxes = torch.cat([top_left, bottom_right, score[:, None], offsets], dim=1)  # (K, 9)
            keep = self._per_image_nms(boxes, cells[:, 0], 0.5)
            found.append(boxes[keep])
            images.append(cells[keep, 0])
        if not found:  # smaller than P-Net's 12×12 window at the first scale
            return (
                torch.zeros(0, 5, device=batch.device),
                torch.zeros(0, dtype=torch.int64, device=batch.device),
            )
        boxes, image = torch.cat(found), torch.cat(images)
        keep = self._per_image_nms(boxes, image, 0.7)
        boxes, image = boxes[keep], image[keep]
        width_ = boxes[:, 2] - boxes[:, 0]
        height_ = boxes[:, 3] - boxes[:, 1]
        moved = torch.stack(
            [
                boxes[:, 0] + boxes[:, 5] * width_,
                boxes[:, 1] + boxes[:, 6] * height_,
                boxes[:, 2] + boxes[:, 7] * width_,
                boxes[:, 3] + boxes[:, 8] * height_,
                boxes[:, 4],
            ],
            dim=1,
        )
        return square_boxes(moved), image

    @staticmethod
    def _crops(
        batch: Tensor, integral: Tensor, boxes: Tensor, image: Tensor, side: int
    ) -> tuple[Tensor, Tensor]:
        """Each box's pixels inside its image (integer corners, truncated and clipped to the
        image) resized to ``side × side`` by area averaging and normalized (contiguous, as
        facenet-pytorch's crops); with the mask of boxes that have any pixel inside (the
        others are dropped)."""
        height, width = batch.shape[2:]
        corners = boxes[:, :4].trunc().int().cpu().numpy()
        x = np.maximum(corners[:, 0], 1)
        y = np.maximum(corners[:, 1], 1)
        ex = np.minimum(corners[:, 2], width)
        ey = np.minimum(corners[:, 3], height)
        valid = (ey > y - 1) & (ex > x - 1)
        inside = np.stack([x, y, ex, ey], axis=1)[valid]
        crops, exact = area_crops(integral, image[torch.from_numpy(valid)], inside, side)
        if not exact.all():  # windows too large for integer sums: PyTorch's own resize
            images = image[torch.from_numpy(valid)].tolist()
            every = torch.zeros(len(images), 3, side, side, device=batch.device)
            every[torch.from_numpy(exact)] = crops
            for k in np.flatnonzero(~exact):
                i, (x1, y1, x2, y2) = images[k], inside[k]
                every[k] = F.interpolate(
                    batch[i, :, y1 - 1 : y2, x1 - 1 : x2].unsqueeze(0).float(),
                    (side, side),
                    mode="area",
                )[0]
            crops = every
        return crops.sub_(127.5).mul_(0.0078125), torch.from_numpy(valid).to(boxes.device)

    @staticmethod
    def _regress(boxes: Tensor, offsets: Tensor) -> Tensor:
        """Each corner moved by its offset times the pixel-inclusive width/height."""
        width = boxes[:, 2] - boxes[:, 0] + 1
        height = boxes[:, 3] - boxes[:, 1] + 1
        moved = boxes.clone()
        moved[:, :4] = torch.stack(
            [
                boxes[:, 0] + offsets[:, 0] * width,
                boxes[:, 1] + offsets[:, 1] * height,
                boxes[:, 2] + offsets[:, 2] * width,
                boxes[:, 3] + offsets[:, 3] * height,
            ],
            dim=1,
        )
        return moved

    def _cascade(self, pixels: Tensor) -> list[Faces]:
        """The three stages on ``pixels`` (``uint8[B, H, W, 3]``)."""
        batch = pixels.permute(0, 3, 1, 2)  # (B, 3, H, W) uint8 view, channels-last
        integral = integral_images(pixels)
        boxes, image = self._proposals(batch, integral)
        points = boxes.new_zeros(0, 5, 2)
        if boxes.shape[0]:
            crops, valid = self._crops(batch, integral, boxes, image, 24)
            boxes, image = boxes[valid], image[valid]
            offsets, probability = _per_image(self.rnet, crops, image)
            score = probability[:, 1]
            passed = score > self.thresholds[1]
            boxes = torch.cat([boxes[passed, :4], score[passed, None]], dim=1)
            image, offsets = image[passed], offsets[passed]
            keep = self._per_image_nms(boxes, image, 0.7)
            boxes = square_boxes(self._regress(boxes[keep], offsets[keep]))
            image = image[keep]
        if boxes.shape[0]:
            crops, valid = self._crops(batch, integral, boxes, image, 48)
            boxes, image = boxes[valid], image[valid]
            offsets, marks, probability = _per_image(self.onet, crops, image)
            score = probability[:, 1]
            passed = score > self.thresholds[2]
            boxes = torch.cat([boxes[passed, :4], score[passed, None]], dim=1)
            image, offsets, marks = image[passed], offsets[passed], marks[passed]
            width = (boxes[:, 2] - boxes[:, 0] + 1)[:, None]
            height = (boxes[:, 3] - boxes[:, 1] + 1)[:, None]
            points = torch.stack(
                [
                    width * marks[:, :5] + boxes[:, 0:1] - 1,
                    height * marks[:, 5:] + boxes[:, 1:2] - 1,
                ],
                dim=2,
            )  # (K, 5, 2)
            boxes = self._regress(boxes, offsets)
            keep = self._per_image_nms(boxes, image, 0.7, overlap="min")
            boxes, image, points = boxes[keep], image[keep], points[keep]
        boxes, points, image = boxes.cpu().numpy(), points.cpu().numpy(), image.cpu().numpy()
        return [
            Faces(
                np.ascontiguousarray(boxes[image == i, :4]),
                np.ascontiguousarray(boxes[image == i, 4]),
                np.ascontiguousarray(points[image == i]),
            )
            for i in range(batch.shape[0])
        ]


def _per_image(net: nn.Module, crops: Tensor, image: Tensor) -> tuple[Tensor, ...]:
    """``net`` over each image's crops (``image`` sorted) in chunks of at most 512, as
    facenet-pytorch calls it for one image, outputs concatenated."""
    bounds = np.flatnonzero(np.diff(image.cpu().numpy())) + 1
    starts = [0, *bounds.tolist()]
    stops = [*bounds.tolist(), crops.shape[0]]
    outs = [
        net(crops[i : min(i + _CHUNK, stop)])
        for start, stop in zip(starts, stops, strict=True)
        for i in range(start, stop, _CHUNK)
    ]
    return tuple(torch.cat(parts) for parts in zip(*outs, strict=True))
