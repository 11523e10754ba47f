"""IResNet (Deng et al., ArcFace; insightface ``arcface_torch/backbones/iresnet.py``).

The standard face backbone at 112×112: a 3×3 stem, four stages of "improved" residual blocks
``BN → Conv3×3 → BN → PReLU → Conv3×3(stride) → BN`` (+ shortcut) at widths 64/128/256/512,
then ``BN → Dropout → Flatten → Linear(512·7·7 → D) → BatchNorm1d`` (the "E" output).
IResNet-18 has (2, 2, 2, 2) blocks per stage, IResNet-50 (3, 4, 14, 3).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .._validation import check_int, check_real

__all__ = ["IRESNET_LAYERS", "IResNet", "iresnet18", "iresnet50"]

IRESNET_LAYERS: dict[int, tuple[int, int, int, int]] = {
    18: (2, 2, 2, 2),
    34: (3, 4, 6, 3),
    50: (3, 4, 14, 3),
    100: (3, 13, 30, 3),
}


class IBasicBlock(nn.Module):
    """One improved residual block: ``BN → Conv3×3 → BN → PReLU → Conv3×3(stride) → BN``."""

    def __init__(self, inplanes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.BatchNorm2d(inplanes, eps=1e-5),
            nn.Conv2d(inplanes, planes, 3, padding=1, bias=False),
            nn.BatchNorm2d(planes, eps=1e-5),
            nn.PReLU(planes),
            nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False),
            nn.BatchNorm2d(planes, eps=1e-5),
        )
        self.downsample: nn.Module = nn.Identity()
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(
                nn.Conv2d(inplanes, planes, 1, stride=stride, bias=False),
                nn.BatchNorm2d(planes, eps=1e-5),
            )

    def forward(self, x: Tensor) -> Tensor:
        return self.body(x) + self.downsample(x)


class IResNet(nn.Module):
    """IResNet: ``Tensor[N, C, H, W] -> Tensor[N, embedding_dim]``.

    Args:
        depth: 18, 34, 50 or 100.
        embedding_dim: ``D``. Default: 512 (insightface).
        in_channels: 3 for RGB faces, 1 for grey. Default: 3.
        image_size: input side; four stride-2 stages, so ``image_size / 16`` is the final map
            (7 at 112). Default: 112.
        widths: stage widths. Default: (64, 128, 256, 512).
        dropout: before the final linear layer. Default: 0.0.
    """

    def __init__(
        self,
        depth: int = 50,
        embedding_dim: int = 512,
        *,
        in_channels: int = 3,
        image_size: int = 112,
        widths: tuple[int, int, int, int] = (64, 128, 256, 512),
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        if depth not in IRESNET_LAYERS:
            valid = ", ".join(str(d) for d in IRESNET_LAYERS)
            raise ValueError(f"depth must be one of {valid}, got {depth!r}")
        self.embedding_dim = check_int("embedding_dim", embedding_dim, minimum=1)
        check_int("in_channels", in_channels, minimum=1)
        check_int("image_size", image_size, minimum=16)
        check_real("dropout", dropout, nonnegative=True, below=1.0)
        if image_size % 16:
            raise ValueError(f"image_size must be a multiple of 16, got {image_size!r}")
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, widths[0], 3, padding=1, bias=False),
            nn.BatchNorm2d(widths[0], eps=1e-5),
            nn.PReLU(widths[0]),
        )
        stages: list[nn.Module] = []
        inplanes = widths[0]
        for planes, blocks in zip(widths, IRESNET_LAYERS[depth], strict=True):
            layer = [IBasicBlock(inplanes, planes, stride=2)]
            layer += [IBasicBlock(planes, planes) for _ in range(blocks - 1)]
            stages.append(nn.Sequential(*layer))
            inplanes = planes
        self.stages = nn.Sequential(*stages)
        side = image_size // 16
        self.bn2 = nn.BatchNorm2d(inplanes, eps=1e-5)
        self.dropout = nn.Dropout(dropout)
        self.fc = nn.Linear(inplanes * side * side, embedding_dim)
        self.features = nn.BatchNorm1d(embedding_dim, eps=1e-5)
        nn.init.constant_(self.features.weight, 1.0)
        self.features.weight.requires_grad_(False)  # insightface freezes the final BN's scale
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.normal_(module.weight, 0.0, 0.1)
        self.in_channels = in_channels
        self.image_size = image_size

    def forward(self, images: Tensor) -> Tensor:
        """Embeddings ``Tensor[N, D]`` of images ``Tensor[N, C, image_size, image_size]``."""
        x = self.stages(self.stem(images))  # (N, 512, s/16, s/16)
        x = self.dropout(torch.flatten(self.bn2(x), 1))  # (N, 512·(s/16)²)
        return self.features(self.fc(x))  # (N, D)


def iresnet18(embedding_dim: int = 512, **kwargs: object) -> IResNet:
    """IResNet-18 (blocks 2, 2, 2, 2)."""
    return IResNet(18, embedding_dim, **kwargs)  # type: ignore[arg-type]


def iresnet50(embedding_dim: int = 512, **kwargs: object) -> IResNet:
    """IResNet-50 (blocks 3, 4, 14, 3)."""
    return IResNet(50, embedding_dim, **kwargs)  # type: ignore[arg-type]
