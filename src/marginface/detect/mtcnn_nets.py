"""MTCNN's three networks (K. Zhang et al., IEEE SPL 2016): P-Net, R-Net, O-Net.

Layer names follow facenet-pytorch's state dicts (``conv1``, ``prelu1``, ..., ``dense6_3``) so
its ``pnet.pt``/``rnet.pt``/``onet.pt`` load as they are (:mod:`.weights`). Inputs are RGB
images normalized as ``(x - 127.5) / 128``, ``float32[N, 3, H, W]``. The dense layers of R-Net
and O-Net read their input transposed to ``(N, W, H, C)`` before flattening: the layout of the
Caffe models the weights were converted from.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .mtcnn_ops import ceil_max_pool

__all__ = ["CeilMaxPool2d", "ONet", "PNet", "RNet"]


# The forwards call the functional ops on the layers' parameters instead of the layers
# themselves: the same ATen calls (so the same numbers) without nn.Module's per-call dispatch,
# which is a tenth of R-Net's time on a handful of crops. Hooks on the layers are not run.
def _conv_prelu(conv: nn.Conv2d, prelu: nn.PReLU, x: Tensor) -> Tensor:
    """``prelu(conv(x))``; the convolutions here have stride 1, no padding, no groups."""
    return F.prelu(F.conv2d(x, conv.weight, conv.bias), prelu.weight)


def _pool(pool: nn.MaxPool2d, x: Tensor) -> Tensor:
    return ceil_max_pool(x, pool.kernel_size, pool.stride)


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
        x = _pool(self.pool1, _conv_prelu(self.conv1, self.prelu1, x))
        x = _conv_prelu(self.conv3, self.prelu3, _conv_prelu(self.conv2, self.prelu2, x))
        regression = F.conv2d(x, self.conv4_2.weight, self.conv4_2.bias)
        return regression, torch.softmax(F.conv2d(x, self.conv4_1.weight, self.conv4_1.bias), 1)


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
        x = _pool(self.pool1, _conv_prelu(self.conv1, self.prelu1, x))
        x = _pool(self.pool2, _conv_prelu(self.conv2, self.prelu2, x))
        x = _conv_prelu(self.conv3, self.prelu3, x)  # (N, 64, 3, 3)
        x = x.permute(0, 3, 2, 1).reshape(x.shape[0], -1)  # Caffe's (N, W, H, C) order
        x = F.prelu(F.linear(x, self.dense4.weight, self.dense4.bias), self.prelu4.weight)
        regression = F.linear(x, self.dense5_2.weight, self.dense5_2.bias)
        return regression, torch.softmax(F.linear(x, self.dense5_1.weight, self.dense5_1.bias), 1)


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
        x = _pool(self.pool1, _conv_prelu(self.conv1, self.prelu1, x))
        x = _pool(self.pool2, _conv_prelu(self.conv2, self.prelu2, x))
        x = _pool(self.pool3, _conv_prelu(self.conv3, self.prelu3, x))
        x = _conv_prelu(self.conv4, self.prelu4, x)  # (N, 128, 3, 3)
        x = x.permute(0, 3, 2, 1).reshape(x.shape[0], -1)  # Caffe's (N, W, H, C) order
        x = F.prelu(F.linear(x, self.dense5.weight, self.dense5.bias), self.prelu5.weight)
        regression = F.linear(x, self.dense6_2.weight, self.dense6_2.bias)
        landmarks = F.linear(x, self.dense6_3.weight, self.dense6_3.bias)
        probability = torch.softmax(F.linear(x, self.dense6_1.weight, self.dense6_1.bias), 1)
        return regression, landmarks, probability
