"""MobileFaceNet (Chen et al., "MobileFaceNets", CCBR 2018) as insightface's ``mbf`` and
``mbf_large`` (``arcface_torch/backbones/mobilefacenet.py``).

A 112×112 face ``Tensor[N, 3, 112, 112]`` goes through (``c = 64·scale``):

===  =====================================================  ==================
 i   ``layers[i]``                                          output (mbf)
===  =====================================================  ==================
 0   ConvBlock 3×3 stride 2, 3 → c                          (128, 56, 56)
 1   ``blocks[0] == 1``: ConvBlock 3×3, groups 64;          (128, 56, 56)
     else Residual(c, blocks[0], hidden 128)
 2   DepthWise c → c, stride 2, hidden 128                  (128, 28, 28)
 3   Residual(c, blocks[1], hidden 128)                     (128, 28, 28)
 4   DepthWise c → 2c, stride 2, hidden 256                 (256, 14, 14)
 5   Residual(2c, blocks[2], hidden 256)                    (256, 14, 14)
 6   DepthWise 2c → 2c, stride 2, hidden 512                (256, 7, 7)
 7   Residual(2c, blocks[3], hidden 256)                    (256, 7, 7)
===  =====================================================  ==================

then ``conv_sep`` (ConvBlock 1×1, 2c → 512) and ``features`` (GDC: a 7×7 depthwise LinearBlock,
Flatten, ``Linear(512 → D, bias=False)``, ``BatchNorm1d(D)``).

* ConvBlock: ``Conv → BN → PReLU`` (``layers.0/1/2``); LinearBlock: ``Conv → BN``.
* DepthWise(in, out, hidden): ConvBlock 1×1 in → hidden, ConvBlock 3×3 depthwise (groups =
  hidden) with the stride, LinearBlock 1×1 hidden → out; plus the input when residual.
* Residual(c, n, hidden): ``n`` residual DepthWise(c, c, hidden) of stride 1.

``mbf``: blocks (1, 4, 6, 2), scale 2; ``mbf_large``: blocks (2, 8, 12, 4), scale 4.
BatchNorm eps 1e-5 (PyTorch's default) everywhere. Names and shapes are insightface's, so its
``backbone.pth`` loads with ``strict=True``.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from .._validation import check_int
from ._sides import check_image_side

__all__ = ["MobileFaceNet", "mbf", "mbf_large"]


class Flatten(nn.Module):
    """``Tensor[N, ...] -> Tensor[N, prod(...)]`` (no parameters; a named layer of the GDC)."""

    def forward(self, x: Tensor) -> Tensor:
        return x.flatten(1)


def _conv(in_c: int, out_c: int, kernel: int, stride: int, padding: int, groups: int) -> nn.Conv2d:
    return nn.Conv2d(in_c, out_c, kernel, stride, padding, groups=groups, bias=False)


class ConvBlock(nn.Module):
    """``PReLU(BN(Conv(x)))``; parameters under ``layers.0`` (conv), ``.1`` (BN), ``.2``."""

    def __init__(
        self,
        in_c: int,
        out_c: int,
        kernel: int = 1,
        stride: int = 1,
        padding: int = 0,
        groups: int = 1,
    ) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            _conv(in_c, out_c, kernel, stride, padding, groups),
            nn.BatchNorm2d(out_c),
            nn.PReLU(out_c),
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.layers(x)


class LinearBlock(nn.Module):
    """``BN(Conv(x))`` (no activation); parameters under ``layers.0`` (conv), ``.1`` (BN)."""

    def __init__(
        self,
        in_c: int,
        out_c: int,
        kernel: int = 1,
        stride: int = 1,
        padding: int = 0,
        groups: int = 1,
    ) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            _conv(in_c, out_c, kernel, stride, padding, groups), nn.BatchNorm2d(out_c)
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.layers(x)


class DepthWise(nn.Module):
    """Inverted bottleneck ``Tensor[N, in_c, H, W] -> Tensor[N, out_c, H/s, W/s]``: 1×1 expand
    to ``hidden``, 3×3 depthwise of stride ``s``, 1×1 linear projection (+ ``x`` if
    ``residual``)."""

    def __init__(
        self, in_c: int, out_c: int, hidden: int, *, stride: int = 2, residual: bool = False
    ) -> None:
        super().__init__()
        self.residual = residual
        self.layers = nn.Sequential(
            ConvBlock(in_c, hidden),
            ConvBlock(hidden, hidden, 3, stride, 1, groups=hidden),
            LinearBlock(hidden, out_c),
        )

    def forward(self, x: Tensor) -> Tensor:
        out = self.layers(x)
        return x + out if self.residual else out


class Residual(nn.Module):
    """``count`` residual :class:`DepthWise` blocks of width ``channels``, stride 1."""

    def __init__(self, channels: int, count: int, hidden: int) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            *(DepthWise(channels, channels, hidden, stride=1, residual=True) for _ in range(count))
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.layers(x)


class GDC(nn.Module):
    """Global depthwise convolution head ``Tensor[N, 512, k, k] -> Tensor[N, D]``: a ``k×k``
    depthwise LinearBlock, Flatten, ``Linear(512, D, bias=False)``, ``BatchNorm1d(D)``."""

    def __init__(self, embedding_dim: int, side: int = 7) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            LinearBlock(512, 512, side, 1, 0, groups=512),
            Flatten(),
            nn.Linear(512, embedding_dim, bias=False),
            nn.BatchNorm1d(embedding_dim),
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.layers(x)


class MobileFaceNet(nn.Module):
    """MobileFaceNet ``Tensor[N, in_channels, s, s] -> Tensor[N, embedding_dim]`` (``s`` = 112).

    Args:
        embedding_dim: ``D``. Default: 512 (insightface's ``num_features``).
        blocks: residual blocks of the four stages. Default: (1, 4, 6, 2) (``mbf``).
        scale: width multiplier of the first stages (``c = 64·scale``). Default: 2.
        in_channels: Default: 3.
        image_size: a multiple of 16; the GDC kernel is ``image_size / 16``. Default: 112.
    """

    def __init__(
        self,
        embedding_dim: int = 512,
        *,
        blocks: tuple[int, int, int, int] = (1, 4, 6, 2),
        scale: int = 2,
        in_channels: int = 3,
        image_size: int = 112,
    ) -> None:
        super().__init__()
        check_int("embedding_dim", embedding_dim, minimum=1)
        check_int("scale", scale, minimum=1)
        check_int("in_channels", in_channels, minimum=1)
        shape = tuple(blocks) if isinstance(blocks, tuple | list) else blocks
        known = {((1, 4, 6, 2), 2): " (mbf)", ((2, 8, 12, 4), 4): " (mbf_large)"}
        check_image_side(
            "MobileFaceNet" + known.get((shape, scale), ""),
            image_size,
            multiple=16,
            why="four stride-2 stages: the GDC kernel is image_size / 16",
        )
        if (
            not isinstance(blocks, tuple | list)
            or len(blocks) != 4
            or not all(isinstance(b, int) and not isinstance(b, bool) and b >= 1 for b in blocks)
        ):
            raise ValueError(f"blocks must be four ints >= 1, got {blocks!r}")
        c = 64 * scale
        first: nn.Module
        if blocks[0] == 1:
            first = ConvBlock(c, c, 3, 1, 1, groups=64)
        else:
            first = Residual(c, blocks[0], 128)
        self.layers = nn.ModuleList(
            [
                ConvBlock(in_channels, c, 3, 2, 1),  # (N, c, s/2, s/2)
                first,
                DepthWise(c, c, 128),  # (N, c, s/4, s/4)
                Residual(c, blocks[1], 128),
                DepthWise(c, 2 * c, 256),  # (N, 2c, s/8, s/8)
                Residual(2 * c, blocks[2], 256),
                DepthWise(2 * c, 2 * c, 512),  # (N, 2c, s/16, s/16)
                Residual(2 * c, blocks[3], 256),
            ]
        )
        self.conv_sep = ConvBlock(2 * c, 512)  # (N, 512, s/16, s/16)
        self.features = GDC(embedding_dim, image_size // 16)  # (N, D)
        self.embedding_dim = embedding_dim
        for module in self.modules():
            if isinstance(module, nn.Conv2d | nn.Linear):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, images: Tensor) -> Tensor:
        """Embeddings ``Tensor[N, D]`` of ``Tensor[N, C, s, s]``."""
        x = images
        for layer in self.layers:
            x = layer(x)
        return self.features(self.conv_sep(x))


def mbf(embedding_dim: int = 512, **kwargs: Any) -> MobileFaceNet:
    """insightface's ``mbf``: blocks (1, 4, 6, 2), scale 2."""
    return MobileFaceNet(embedding_dim, blocks=(1, 4, 6, 2), scale=2, **kwargs)


def mbf_large(embedding_dim: int = 512, **kwargs: Any) -> MobileFaceNet:
    """insightface's ``mbf_large``: blocks (2, 8, 12, 4), scale 4."""
    return MobileFaceNet(embedding_dim, blocks=(2, 8, 12, 4), scale=4, **kwargs)
