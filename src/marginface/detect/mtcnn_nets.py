"""MTCNN's three networks (K. Zhang et al., IEEE SPL 2016): P-Net, R-Net, O-Net.

Layer names follow facenet-pytorch's state dicts (``conv1``, ``prelu1``, ..., ``dense6_3``) so
its ``pnet.pt``/``rnet.pt``/``onet.pt`` load as they are (:mod:`.weights`). Inputs are RGB
images normalized as ``(x - 127.5) / 128``, ``float32[N, 3, H, W]``. The dense layers of R-Net
and O-Net read their input transposed to ``(N, W, H, C)`` before flattening: the layout of the
Caffe models the weights were converted from.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .mtcnn_ops import ceil_max_pool

__all__ = ["CeilMaxPool2d", "ONet", "PNet", "RNet"]


class CeilMaxPool2d(nn.MaxPool2d):
    """``nn.MaxPool2d(kernel_size, stride, ceil_mode=True)``: the same values and memory
    layout, computed in channels-last memory (:func:`~marginface.detect.mtcnn_ops.ceil_max_pool`,
    faster on CPU for large inputs)."""

    def __init__(self, kernel_size: int, stride: int) -> None:
        super().__init__(kernel_size, stride, ceil_mode=True)

    def forward(self, x: Tensor) -> Tensor:
        """``x``: ``float[N, C, H, W]`` → ``[N, C, ceil((H - k) / s) + 1, ...]``."""
        return ceil_max_pool(x, self.kernel_size, self.stride)


class PNet(nn.Module):
    """The proposal network, fully convolutional: a 12×12 window per output cell, stride 2.

    ``forward(x[N, 3, H, W]) -> (regression[N, 4, H', W'], probability[N, 2, H', W'])`` with
    ``H' = ceil((H - 2) / 2) - 4``; channel 1 of ``probability`` is the face probability.
    """

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 10, kernel_size=3)
        self.prelu1 = nn.PReLU(10)
        self.pool1 = CeilMaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(10, 16, kernel_size=3)
        self.prelu2 = nn.PReLU(16)
        self.conv3 = nn.Conv2d(16, 32, kernel_size=3)
        self.prelu3 = nn.PReLU(32)
        self.conv4_1 = nn.Conv2d(32, 2, kernel_size=1)
        self.conv4_2 = nn.Conv2d(32, 4, kernel_size=1)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """See the class docstring."""
        x = self.pool1(self.prelu1(self.conv1(x)))
        x = self.prelu3(self.conv3(self.prelu2(self.conv2(x))))
        return self.conv4_2(x), torch.softmax(self.conv4_1(x), dim=1)


class RNet(nn.Module):
    """The refinement network on 24×24 crops.

    ``forward(x[N, 3, 24, 24]) -> (regression[N, 4], probability[N, 2])``.
    """

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 28, kernel_size=3)
        self.prelu1 = nn.PReLU(28)
        self.pool1 = CeilMaxPool2d(3, 2)
        self.conv2 = nn.Conv2d(28, 48, kernel_size=3)
        self.prelu2 = nn.PReLU(48)
        self.pool2 = CeilMaxPool2d(3, 2)
        self.conv3 = nn.Conv2d(48, 64, kernel_size=2)
        self.prelu3 = nn.PReLU(64)
        self.dense4 = nn.Linear(576, 128)
        self.prelu4 = nn.PReLU(128)
        self.dense5_1 = nn.Linear(128, 2)
        self.dense5_2 = nn.Linear(128, 4)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """See the class docstring."""
        x = self.pool1(self.prelu1(self.conv1(x)))
        x = self.pool2(self.prelu2(self.conv2(x)))
        x = self.prelu3(self.conv3(x))  # (N, 64, 3, 3)
        x = x.permute(0, 3, 2, 1).reshape(x.shape[0], -1)  # Caffe's (N, W, H, C) order
        x = self.prelu4(self.dense4(x))
        return self.dense5_2(x), torch.softmax(self.dense5_1(x), dim=1)


class ONet(nn.Module):
    """The output network on 48×48 crops, with the five landmarks.

    ``forward(x[N, 3, 48, 48]) -> (regression[N, 4], landmarks[N, 10], probability[N, 2])``;
    ``landmarks`` holds the five x then the five y, as fractions of the crop's side.
    """

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 32, kernel_size=3)
        self.prelu1 = nn.PReLU(32)
        self.pool1 = CeilMaxPool2d(3, 2)
        self.conv2 = nn.Conv2d(32, 64, kernel_size=3)
        self.prelu2 = nn.PReLU(64)
        self.pool2 = CeilMaxPool2d(3, 2)
        self.conv3 = nn.Conv2d(64, 64, kernel_size=3)
        self.prelu3 = nn.PReLU(64)
        self.pool3 = CeilMaxPool2d(2, 2)
        self.conv4 = nn.Conv2d(64, 128, kernel_size=2)
        self.prelu4 = nn.PReLU(128)
        self.dense5 = nn.Linear(1152, 256)
        self.prelu5 = nn.PReLU(256)
        self.dense6_1 = nn.Linear(256, 2)
        self.dense6_2 = nn.Linear(256, 4)
        self.dense6_3 = nn.Linear(256, 10)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """See the class docstring."""
        x = self.pool1(self.prelu1(self.conv1(x)))
        x = self.pool2(self.prelu2(self.conv2(x)))
        x = self.pool3(self.prelu3(self.conv3(x)))
        x = self.prelu4(self.conv4(x))  # (N, 128, 3, 3)
        x = x.permute(0, 3, 2, 1).reshape(x.shape[0], -1)  # Caffe's (N, W, H, C) order
        x = self.prelu5(self.dense5(x))
        return self.dense6_2(x), self.dense6_3(x), torch.softmax(self.dense6_1(x), dim=1)
