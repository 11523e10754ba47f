"""Inception-ResNet-v1 (Szegedy et al., "Inception-v4, Inception-ResNet and the Impact of
Residual Connections on Learning", AAAI 2017), the FaceNet backbone of David Sandberg's
TensorFlow models as ported by facenet-pytorch (``facenet_pytorch/models/inception_resnet_v1.py``).

``Tensor[N, 3, H, W] -> Tensor[N, 512]``. Every convolution but the residual projections is
``Conv2d(bias=False) → BatchNorm2d(eps=1e-3) → ReLU`` (TensorFlow's batch-norm epsilon):

* stem: 3×3/2 (32), 3×3 (32), 3×3 same (64), max-pool 3×3/2, 1×1 (80), 3×3 (192), 3×3/2 (256);
* 5 × Inception-ResNet-A at 256 channels (residual scale 0.17), reduction A to 896 channels,
  10 × Inception-ResNet-B at 896 (scale 0.10), reduction B to 1792 channels, 5 ×
  Inception-ResNet-C at 1792 (scale 0.20) and a last C block (scale 1, no ReLU);
* global average pool → Dropout → ``Linear(1792 → 512, bias=False)`` → ``BatchNorm1d(eps=1e-3)``.

A residual block computes ``relu(x + scale · W · concat(branches(x)))``, ``W`` a 1×1
convolution with bias back to the block's width (the last C block omits the ReLU).

The module, parameter and buffer names are facenet-pytorch's (``conv2d_1a.conv.weight``,
``repeat_1.0.branch1.1.bn.running_mean``, ``mixed_6a.branch0.conv.weight``, ``block8.conv2d``,
``last_linear.weight``, ``last_bn``...), so its published files (``20180402-114759-vggface2.pt``,
``20180408-102900-casia-webface.pt``: state_dicts of the network plus the training classifier
``logits``, 8631 and 10575 classes) load directly; ``logits.*`` is dropped on load
(:meth:`InceptionResnetV1.adapt_state_dict`).

Output: the ``last_bn`` features, **not** L2-normalised (facenet-pytorch's ``classify=False``
forward returns ``F.normalize`` of them). marginface's losses and evaluation normalise
embeddings themselves, and feature-norm-aware margins (AdaFace) need the norm; divide by the
norm to get facenet-pytorch's output.

Input convention of the published weights: RGB faces of 160×160 (MTCNN crops with a 32-pixel
margin in facenet-pytorch), ``(x - 127.5) / 128`` for ``uint8`` pixels ``x`` (facenet-pytorch's
``fixed_image_standardization``; :func:`fixed_image_standardization`), i.e. ``(x / 255 -
0.5) / (128 / 255)``: :data:`PIXEL_MEAN` and :data:`PIXEL_STD` in marginface's
``(x / 255 - mean) / std`` form. The network ends with a global average pool, so any side of at
least :data:`MIN_IMAGE_SIZE` (75) runs; the weights were trained at 160.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from .._validation import check_int, check_real

__all__ = [
    "EMBEDDING_DIM",
    "MIN_IMAGE_SIZE",
    "PIXEL_MEAN",
    "PIXEL_STD",
    "InceptionResnetV1",
    "fixed_image_standardization",
]

EMBEDDING_DIM = 512
"""The published weights' embedding size (``last_linear``'s output)."""
MIN_IMAGE_SIZE = 75
"""The smallest input side whose feature map survives the six unpadded stride-2 and 3×3 steps
(stem, reductions A and B) with at least one pixel."""
PIXEL_MEAN = 0.5
"""``mean`` of ``(x / 255 - mean) / std`` equal to ``(x - 127.5) / 128``."""
PIXEL_STD = 128.0 / 255.0
"""``std`` of ``(x / 255 - mean) / std`` equal to ``(x - 127.5) / 128``."""

_BN_EPS = 1e-3  # TensorFlow's batch-norm epsilon, kept by the port
_LOGITS_KEYS = ("logits.weight", "logits.bias")

Kernel = int | tuple[int, int]


def fixed_image_standardization(pixels: Tensor) -> Tensor:
    """``(pixels - 127.5) / 128``: ``uint8``-range pixels ``Tensor[N, 3, H, W]`` (any real
    dtype, values in [0, 255]) to the published weights' input range (about [-1, 1]), as float.
    """
    return (pixels.float() - 127.5) / 128.0


class ConvBNReLU(nn.Module):
    """``relu(bn(conv(x)))``: ``Conv2d(bias=False)`` then ``BatchNorm2d(eps=1e-3)``, named
    ``conv`` and ``bn`` (facenet-pytorch's ``BasicConv2d``).

    Args:
        in_channels, out_channels: channels in and out.
        kernel: kernel size (an int or ``(kh, kw)``).
        stride: stride. Default: 1.
        padding: zero padding (an int or ``(ph, pw)``). Default: 0 ("valid").
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel: Kernel,
        *,
        stride: int = 1,
        padding: Kernel = 0,
    ) -> None:
        super().__init__()
        self.conv = nn.Conv2d(
            in_channels, out_channels, kernel, stride=stride, padding=padding, bias=False
        )
        self.bn = nn.BatchNorm2d(out_channels, eps=_BN_EPS)
        self.relu = nn.ReLU()

    def forward(self, x: Tensor) -> Tensor:
        """``Tensor[N, in, H, W] -> Tensor[N, out, H', W']``."""
        return self.relu(self.bn(self.conv(x)))


def _same(kernel: Kernel) -> Kernel:
    """The padding that keeps the side at stride 1 for an odd ``kernel``."""
    return kernel // 2 if isinstance(kernel, int) else (kernel[0] // 2, kernel[1] // 2)


def _chain(layers: list[ConvBNReLU]) -> nn.Module:
    """One layer as itself (``branch0.conv``), several as a Sequential (``branch1.0.conv``)."""
    return layers[0] if len(layers) == 1 else nn.Sequential(*layers)


class ResidualInceptionBlock(nn.Module):
    """An Inception-ResNet block of constant width ``C``:
    ``out = act(x + scale · conv2d(concat_b branch_b(x)))``, ``Tensor[N, C, H, W]`` in and out.

    Each branch is a 1×1 convolution followed by "same"-padded convolutions; ``conv2d`` is a
    1×1 convolution with bias from the concatenated branches back to ``C``.

    Args:
        channels: ``C``.
        branches: per branch, its ``(out_channels, kernel)`` layers in order.
        scale: the residual scale.
        relu: apply the ReLU after the sum. Default: True (False for the last block, as in
            facenet-pytorch's ``Block8(noReLU=True)``, which then has no ``relu`` module).
    """

    def __init__(
        self,
        channels: int,
        branches: Sequence[Sequence[tuple[int, Kernel]]],
        scale: float,
        *,
        relu: bool = True,
    ) -> None:
        super().__init__()
        self.scale = float(scale)
        width = 0
        for index, layers in enumerate(branches):
            convs, previous = [], channels
            for out, kernel in layers:
                convs.append(ConvBNReLU(previous, out, kernel, padding=_same(kernel)))
                previous = out
            self.add_module(f"branch{index}", _chain(convs))
            width += previous
        self.branch_count = len(branches)
        self.conv2d = nn.Conv2d(width, channels, 1)
        self.relu: nn.Module | None = nn.ReLU() if relu else None

    def forward(self, x: Tensor) -> Tensor:
        """``Tensor[N, C, H, W] -> Tensor[N, C, H, W]``."""
        mixed = torch.cat([getattr(self, f"branch{i}")(x) for i in range(self.branch_count)], 1)
        out = x + self.scale * self.conv2d(mixed)
        return out if self.relu is None else self.relu(out)


class ReductionBlock(nn.Module):
    """An Inception reduction ``Tensor[N, C, H, W] -> Tensor[N, C + Σ widths, H', W']``,
    ``H' = (H - 3) // 2 + 1``: convolution branches ending in a 3×3 stride-2 "valid"
    convolution, concatenated with a 3×3 stride-2 max-pool of ``x`` (the last branch).

    Args:
        channels: ``C``.
        branches: per convolution branch, its output widths. One width: a single 3×3/2
            convolution; several: a 1×1 convolution, 3×3 "same" convolutions, then the 3×3/2.
    """

    def __init__(self, channels: int, branches: Sequence[Sequence[int]]) -> None:
        super().__init__()
        for index, widths in enumerate(branches):
            convs, previous = [], channels
            for position, out in enumerate(widths):
                if position == len(widths) - 1:
                    convs.append(ConvBNReLU(previous, out, 3, stride=2))
                elif position == 0:
                    convs.append(ConvBNReLU(previous, out, 1))
                else:
                    convs.append(ConvBNReLU(previous, out, 3, padding=1))
                previous = out
            self.add_module(f"branch{index}", _chain(convs))
        self.add_module(f"branch{len(branches)}", nn.MaxPool2d(3, stride=2))
        self.branch_count = len(branches) + 1

    def forward(self, x: Tensor) -> Tensor:
        """``Tensor[N, C, H, W] -> Tensor[N, C', (H - 3) // 2 + 1, (W - 3) // 2 + 1]``."""
        return torch.cat([getattr(self, f"branch{i}")(x) for i in range(self.branch_count)], 1)


def _block_a() -> ResidualInceptionBlock:
    return ResidualInceptionBlock(
        256, [[(32, 1)], [(32, 1), (32, 3)], [(32, 1), (32, 3), (32, 3)]], 0.17
    )


def _block_b() -> ResidualInceptionBlock:
    return ResidualInceptionBlock(896, [[(128, 1)], [(128, 1), (128, (1, 7)), (128, (7, 1))]], 0.10)


def _block_c(scale: float = 0.20, *, relu: bool = True) -> ResidualInceptionBlock:
    branches = [[(192, 1)], [(192, 1), (192, (1, 3)), (192, (3, 1))]]
    return ResidualInceptionBlock(1792, branches, scale, relu=relu)


class InceptionResnetV1(nn.Module):
    """Inception-ResNet-v1 with facenet-pytorch's names: ``Tensor[N, 3, H, W] ->
    Tensor[N, 512]`` (the ``last_bn`` features, not normalised; module docstring).

    Only the shapes of the published weights are built: the factory arguments that would
    change them are checked rather than honoured.

    Args:
        embedding_dim: ``D``; must be 512 (``last_linear``'s width in the published files).
        in_channels: must be 3 (RGB).
        image_size: input side ``H = W``; at least :data:`MIN_IMAGE_SIZE` (75). The feature
            map before the average pool is 3×3 at 160. Default: 160.
        dropout: probability before ``last_linear`` (training only). Default: 0.6
            (facenet-pytorch's ``dropout_prob``).

    Raises:
        TypeError: a non-integer size, a non-real ``dropout``.
        ValueError: ``embedding_dim`` other than 512, ``in_channels`` other than 3,
            ``image_size`` below 75, ``dropout`` outside [0, 1).
    """

    def __init__(
        self,
        embedding_dim: int = EMBEDDING_DIM,
        *,
        in_channels: int = 3,
        image_size: int = 160,
        dropout: float = 0.6,
    ) -> None:
        super().__init__()
        if check_int("embedding_dim", embedding_dim) != EMBEDDING_DIM:
            raise ValueError(
                f"inception-resnet-v1: embedding_dim must be {EMBEDDING_DIM} (the published "
                f"weights' last_linear), got {embedding_dim!r}"
            )
        if check_int("in_channels", in_channels) != 3:
            raise ValueError(
                f"inception-resnet-v1: in_channels must be 3 (RGB, the published weights' "
                f"first convolution), got {in_channels!r}"
            )
        if check_int("image_size", image_size) < MIN_IMAGE_SIZE:
            raise ValueError(
                f"inception-resnet-v1: image_size must be >= {MIN_IMAGE_SIZE} (the stem and "
                f"two reductions shrink smaller images to nothing), got {image_size!r}: pass "
                "--image-size 160 (the published weights' side)"
            )
        check_real("dropout", dropout, nonnegative=True, below=1.0)
        self.embedding_dim = EMBEDDING_DIM
        self.in_channels = 3
        self.image_size = int(image_size)
        self.conv2d_1a = ConvBNReLU(3, 32, 3, stride=2)
        self.conv2d_2a = ConvBNReLU(32, 32, 3)
        self.conv2d_2b = ConvBNReLU(32, 64, 3, padding=1)
        self.maxpool_3a = nn.MaxPool2d(3, stride=2)
        self.conv2d_3b = ConvBNReLU(64, 80, 1)
        self.conv2d_4a = ConvBNReLU(80, 192, 3)
        self.conv2d_4b = ConvBNReLU(192, 256, 3, stride=2)
        self.repeat_1 = nn.Sequential(*(_block_a() for _ in range(5)))
        self.mixed_6a = ReductionBlock(256, [[384], [192, 192, 256]])  # 256+384+256 = 896
        self.repeat_2 = nn.Sequential(*(_block_b() for _ in range(10)))
        # 896 + 384 + 256 + 256 = 1792
        self.mixed_7a = ReductionBlock(896, [[256, 384], [256, 256], [256, 256, 256]])
        self.repeat_3 = nn.Sequential(*(_block_c() for _ in range(5)))
        self.block8 = _block_c(1.0, relu=False)
        self.avgpool_1a = nn.AdaptiveAvgPool2d(1)
        self.dropout = nn.Dropout(dropout)
        self.last_linear = nn.Linear(1792, EMBEDDING_DIM, bias=False)
        self.last_bn = nn.BatchNorm1d(EMBEDDING_DIM, eps=_BN_EPS)
        self.register_load_state_dict_pre_hook(_drop_logits_hook)

    @staticmethod
    def adapt_state_dict(state: Mapping[str, Tensor]) -> dict[str, Tensor]:
        """``state`` without facenet-pytorch's classifier (``logits.weight``, ``logits.bias``),
        the layer of the training identities that the published files carry."""
        return {key: value for key, value in state.items() if key not in _LOGITS_KEYS}

    def forward(self, images: Tensor) -> Tensor:
        """Embeddings ``Tensor[N, 512]`` (not normalised) of standardised images
        ``Tensor[N, 3, H, W]`` (:func:`fixed_image_standardization`)."""
        x = self.conv2d_2b(self.conv2d_2a(self.conv2d_1a(images)))  # (N, 64, 77, 77) at 160
        x = self.conv2d_4b(self.conv2d_4a(self.conv2d_3b(self.maxpool_3a(x))))  # (N, 256, 17, 17)
        x = self.mixed_6a(self.repeat_1(x))  # (N, 896, 8, 8)
        x = self.mixed_7a(self.repeat_2(x))  # (N, 1792, 3, 3)
        x = self.block8(self.repeat_3(x))  # (N, 1792, 3, 3)
        x = self.dropout(torch.flatten(self.avgpool_1a(x), 1))  # (N, 1792)
        return self.last_bn(self.last_linear(x))  # (N, 512)


def _drop_logits_hook(
    module: nn.Module, state_dict: dict[str, Any], prefix: str, *args: Any, **kwargs: Any
) -> None:
    """``load_state_dict`` pre-hook: remove ``<prefix>logits.*`` (the published files')."""
    for key in _LOGITS_KEYS:
        state_dict.pop(prefix + key, None)
