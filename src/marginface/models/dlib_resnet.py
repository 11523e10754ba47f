"""dlib's face recognition ResNet v1 (``dlib_face_recognition_resnet_model_v1.dat``, the
``anet_type`` of dlib's ``examples/dnn_face_recognition_ex.cpp``) as a PyTorch module, and a
loader of dlib's file that needs no dlib (:mod:`.dlib_format`).

dlib's layers differ from torchvision's in three ways, each restated here from dlib's source:

* **Strided layers are not padded.** ``con_``, ``max_pool_`` and ``avg_pool_`` default to
  padding ``0 if stride != 1 else kernel // 2`` (``dlib/dnn/layers.h``), and the output side is
  ``1 + (side + 2 * padding - kernel) // stride`` (``dlib/cuda/cpu_dlib.cpp``). A stride-2 3x3
  convolution maps side s to ``(s - 3) // 2 + 1``, so 150 -> 72 (7x7/2 stem) -> 35 (3x3/2 max
  pool) -> 17 -> 8 -> 3 -> 1 along the main path of the downsampling blocks.
* **A downsampling block's shortcut is a 2x2/2 average pool** of the block's input (no
  convolution; ``avg_pool<2,2,2,2,skip1<...>>`` in the example), side s -> ``s // 2``, with the
  input's channel count.
* **Tensors of unequal size add with zero fill** (``add_prev_`` then ``tt::add``,
  ``dlib/cuda/cpu_dlib.cpp``): the sum has, per dimension (samples, channels, rows, columns),
  the larger size, and each operand contributes only where its own index is in range (top-left
  aligned; no cropping). So a block 128 -> 256 with main path 3x3x256 and shortcut 4x4x128 gives
  4x4x256: ``out[:, :128, :3, :3] = main + shortcut``, ``out[:, 128:, :3, :3] = main``,
  ``out[:, :128, 3, :] = shortcut[:, :, 3, :]`` (and column 3 likewise), zero elsewhere.

Network (``N`` samples): ``[N,3,150,150]`` -> con 7x7/2, 32 (72x72) -> affine -> relu ->
max pool 3x3/2 (35x35) -> 3 blocks of 32 -> a downsampling block and 3 blocks of 64 (17x17) ->
down + 2 of 128 (8x8) -> down + 2 of 256 (4x4) -> down of 256 (2x2) -> global average ->
fc 256 -> 128 without bias. A block: ``relu(affine2(con2(relu(affine1(con1(x))))) + s(x))``
with 3x3 convolutions (``con1`` strided in a downsampling block) and ``s`` the identity or the
average pool. ``affine`` is dlib's test-time batch norm, ``y = gamma * x + beta`` per channel.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .dlib_format import DlibNetwork, dlib_default_padding, read_dlib_resnet_v1

__all__ = [
    "DLIB_CHIP_SIZE",
    "DLIB_MEAN_RGB",
    "DLIB_SCALE",
    "DlibResNet",
    "add_zero_padded",
    "dlib_chips_to_tensor",
    "dlib_resnet_state_dict",
    "dlib_resnet_v1",
    "load_dlib_resnet",
]

DLIB_MEAN_RGB: tuple[float, float, float] = (122.782, 117.001, 104.298)
"""Per-channel means (red, green, blue) in 0-255 pixel units that dlib's
``input_rgb_image_sized`` subtracts (``dlib/dnn/input.h``; stored in the file as float32)."""

DLIB_SCALE: float = 256.0
"""dlib's divisor after the mean subtraction: ``x = (pixel - mean) / 256`` (not 255)."""

DLIB_CHIP_SIZE: int = 150
"""The side of the face chips the network takes (``input_rgb_image_sized<150>``)."""

_STAGES = ((32, 3, False), (64, 4, True), (128, 3, True), (256, 3, True), (256, 1, True))
"""(channels, blocks, first block downsamples) per stage, input side first: the example's
alevel4, alevel3, alevel2, alevel1, alevel0."""


def dlib_chips_to_tensor(chips: np.ndarray | Tensor) -> Tensor:
    """dlib's input normalisation of RGB face chips, exactly (float32 arithmetic as dlib's).

    ``x[n, c, r, col] = float32(chips[n, r, col, c] - float32(DLIB_MEAN_RGB[c])) / 256``

    Args:
        chips: ``uint8`` ``[N, 150, 150, 3]`` (or one ``[150, 150, 3]``) RGB pixels, e.g. from
            ``dlib.get_face_chip(image, shape, size=150, padding=0.25)``.

    Returns:
        ``float32`` ``Tensor[N, 3, 150, 150]``, the input of :class:`DlibResNet`.

    Raises:
        TypeError: ``chips`` is not a uint8 array or tensor.
        ValueError: its shape is not ``[N, 150, 150, 3]`` or ``[150, 150, 3]``.
    """
    if isinstance(chips, Tensor):
        chips = chips.detach().cpu().numpy()
    if not isinstance(chips, np.ndarray) or chips.dtype != np.uint8:
        raise TypeError(f"chips must be a uint8 array or tensor, got {type(chips).__name__}")
    array = chips[None] if chips.ndim == 3 else chips
    if array.ndim != 4 or array.shape[1:] != (DLIB_CHIP_SIZE, DLIB_CHIP_SIZE, 3):
        raise ValueError(f"chips must have shape [N, 150, 150, 3] (RGB), got {list(chips.shape)}")
    mean = np.asarray(DLIB_MEAN_RGB, dtype=np.float32)
    x = (array.astype(np.float32) - mean) / np.float32(DLIB_SCALE)
    return torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2)))


def add_zero_padded(a: Tensor, b: Tensor) -> Tensor:
    """dlib's ``tt::add`` of two 4-d tensors of possibly unequal sizes.

    ``out`` has shape ``max(a.shape[d], b.shape[d])`` per dimension ``d`` and
    ``out[i] = (a[i] if i is inside a else 0) + (b[i] if i is inside b else 0)``: both operands
    top-left (index 0) aligned, zero-filled, never cropped.

    Args:
        a, b: ``Tensor[N, C, H, W]`` each.

    Returns:
        ``Tensor[max N, max C, max H, max W]``.
    """
    if a.shape == b.shape:
        return a + b
    shape = [max(x, y) for x, y in zip(a.shape, b.shape, strict=True)]

    def grow(t: Tensor) -> Tensor:
        pad: list[int] = []
        for have, want in zip(reversed(t.shape), reversed(shape), strict=True):
            pad += [0, want - have]
        return F.pad(t, pad)

    return grow(a) + grow(b)


class _Affine(nn.Module):
    """dlib's ``affine_`` in CONV_MODE: ``y = weight[c] * x + bias[c]`` per channel ``c``."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(channels))
        self.bias = nn.Parameter(torch.zeros(channels))

    def forward(self, x: Tensor) -> Tensor:
        return x * self.weight[:, None, None] + self.bias[:, None, None]


def _conv(in_channels: int, out_channels: int, kernel: int, stride: int) -> nn.Conv2d:
    padding = dlib_default_padding(kernel, stride)
    return nn.Conv2d(in_channels, out_channels, kernel, stride=stride, padding=padding)


class _Block(nn.Module):
    """``relu(affine2(conv2(relu(affine1(conv1(x))))) + shortcut(x))``, the sum zero-padded
    (:func:`add_zero_padded`); ``shortcut`` is the identity or, when ``downsample``, a 2x2/2
    average pool (and ``conv1`` has stride 2 and no padding)."""

    def __init__(self, in_channels: int, channels: int, downsample: bool) -> None:
        super().__init__()
        stride = 2 if downsample else 1
        self.downsample = downsample
        self.conv1 = _conv(in_channels, channels, 3, stride)
        self.affine1 = _Affine(channels)
        self.conv2 = _conv(channels, channels, 3, 1)
        self.affine2 = _Affine(channels)

    def forward(self, x: Tensor) -> Tensor:
        y = self.affine2(self.conv2(F.relu(self.affine1(self.conv1(x)))))
        shortcut = F.avg_pool2d(x, 2, 2) if self.downsample else x
        return F.relu(add_zero_padded(y, shortcut))


class _Stem(nn.Module):
    """con 7x7/2 (no padding) -> affine -> relu -> max pool 3x3/2 (no padding)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = _conv(3, 32, 7, 2)
        self.affine = _Affine(32)

    def forward(self, x: Tensor) -> Tensor:
        return F.max_pool2d(F.relu(self.affine(self.conv(x))), 3, 2)


class DlibResNet(nn.Module):
    """dlib's face recognition ResNet v1: ``Tensor[N, 3, 150, 150] -> Tensor[N, 128]``.

    The input is an RGB face chip normalised as dlib's ``input_rgb_image_sized`` does
    (:func:`dlib_chips_to_tensor`): ``x = (pixel - DLIB_MEAN_RGB[c]) / DLIB_SCALE`` with
    ``DLIB_MEAN_RGB = (122.782, 117.001, 104.298)`` in 0-255 units and ``DLIB_SCALE = 256``.
    The output is dlib's face descriptor, the fc layer's output as is (not L2-normalised; dlib
    compares descriptors by Euclidean distance, same person below 0.6).

    Parameters (29 convolutions with bias, 29 affines, one fc): ``stem.conv``, ``stem.affine``,
    ``stages.S.B.conv1`` / ``affine1`` / ``conv2`` / ``affine2`` for stage S = 0..4 (32, 64,
    128, 256, 256 channels; 3, 4, 3, 3, 1 blocks; the first block of stages 1-4 downsamples),
    and ``fc`` (256 -> 128, no bias). Random initialisation; :func:`load_dlib_resnet` loads
    dlib's weights.

    Raises (forward):
        ValueError: the input is not ``[N, 3, 150, 150]``.
    """

    def __init__(self) -> None:
        super().__init__()
        self.stem = _Stem()
        stages = []
        in_channels = 32
        for channels, blocks, downsample in _STAGES:
            stage = [_Block(in_channels, channels, downsample)]
            stage += [_Block(channels, channels, False) for _ in range(blocks - 1)]
            stages.append(nn.Sequential(*stage))
            in_channels = channels
        self.stages = nn.Sequential(*stages)
        self.fc = nn.Linear(in_channels, 128, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        if x.ndim != 4 or tuple(x.shape[1:]) != (3, DLIB_CHIP_SIZE, DLIB_CHIP_SIZE):
            raise ValueError(
                f"DlibResNet takes x of shape [N, 3, 150, 150] (dlib-normalised RGB chips), "
                f"got {list(x.shape)}"
            )
        x = self.stages(self.stem(x))
        return self.fc(x.mean(dim=(2, 3)))


def dlib_resnet_state_dict(network: DlibNetwork) -> dict[str, Tensor]:
    """``network``'s weights under :class:`DlibResNet`'s parameter names.

    The convolutions and affines are taken in forward order: the stem's, then per block
    ``conv1, affine1, conv2, affine2``; the fc's ``[128, 256]`` weight last.
    """
    names = ["stem.conv", "stem.affine"]
    for s, (_, blocks, _) in enumerate(_STAGES):
        for b in range(blocks):
            names += [f"stages.{s}.{b}.{m}" for m in ("conv1", "affine1", "conv2", "affine2")]
    layers = [layer for layer in network.layers if layer.kind in ("con", "affine")]
    if len(layers) != len(names):  # read_dlib_resnet_v1 checked the layout: cannot happen
        raise ValueError(f"{network.path}: {len(layers)} con/affine layers, expected {len(names)}")
    state: dict[str, Tensor] = {}
    for name, layer in zip(names, layers, strict=True):
        if layer.kind == "con":
            state[f"{name}.weight"] = layer.tensors["weight"]
            state[f"{name}.bias"] = layer.tensors["bias"]
        else:
            state[f"{name}.weight"] = layer.tensors["gamma"]
            state[f"{name}.bias"] = layer.tensors["beta"]
    state["fc.weight"] = network.of_kind("fc")[0].tensors["weight"]
    return state


def load_dlib_resnet(path: str | os.PathLike[str]) -> DlibResNet:
    """:class:`DlibResNet` in eval mode with the weights of dlib's file at ``path``.

    Reads with :func:`~marginface.models.dlib_format.read_dlib_resnet_v1` (no code runs) and
    loads strictly (every name and shape checked).

    Raises:
        ValueError: the file is not dlib's face recognition ResNet v1 (one line naming it), or
            its input layer subtracts means other than :data:`DLIB_MEAN_RGB`.
        OSError: the file cannot be read.
    """
    network = read_dlib_resnet_v1(path)
    means = network.of_kind("input")[0].attrs["mean_rgb"]
    expected = tuple(float(np.float32(m)) for m in DLIB_MEAN_RGB)
    if means != expected:
        raise ValueError(
            f"{network.path}: its input layer subtracts the means {means}, not dlib's "
            f"{DLIB_MEAN_RGB} that DlibResNet's inputs assume"
        )
    model = DlibResNet()
    model.load_state_dict(dlib_resnet_state_dict(network), strict=True)
    return model.eval()


def dlib_resnet_v1(
    *, embedding_dim: int = 128, in_channels: int = 3, image_size: Any = 150, **options: Any
) -> DlibResNet:
    """Registry factory of ``"dlib-resnet-v1"``: a randomly initialised :class:`DlibResNet`.

    The architecture is fixed: ``embedding_dim`` must be 128, ``in_channels`` 3 and
    ``image_size`` 150 (or ``(150, 150)``); it takes no options.

    Raises:
        ValueError: another ``embedding_dim``, ``in_channels`` or ``image_size`` (named with
            the value).
        TypeError: any option.
    """
    if options:
        raise TypeError(f"dlib-resnet-v1 takes no options, got {sorted(options)}")
    for name, value, fixed in (
        ("embedding_dim", embedding_dim, 128),
        ("in_channels", in_channels, 3),
    ):
        if isinstance(value, bool) or value != fixed:
            raise ValueError(
                f"dlib-resnet-v1 has {name} {fixed} (fixed by dlib's weights), got {value!r}"
            )
    size = tuple(image_size) if isinstance(image_size, (tuple, list)) else (image_size,) * 2
    if any(isinstance(v, bool) or v != DLIB_CHIP_SIZE for v in size) or len(size) != 2:
        raise ValueError(
            f"dlib-resnet-v1 takes 150x150 face chips: image_size must be 150, got {image_size!r}"
        )
    return DlibResNet()
