"""IResNet (Deng et al., "ArcFace", CVPR 2019; insightface ``arcface_torch/backbones/iresnet.py``).

The standard face backbone at 112×112: a 3×3 stem ``Conv → BN → PReLU``, four stages of
"improved" residual blocks ``BN → Conv3×3 → BN → PReLU → Conv3×3(stride 2 in the first block)
→ BN`` (+ shortcut, a 1×1 stride-2 convolution and BN in each stage's first block) at widths
64/128/256/512, then ``BN2d → Dropout → Flatten → Linear(512·7·7 → D) → BatchNorm1d`` (the "E"
output; the last BN's scale is fixed at 1).

Blocks per stage: r18 (2, 2, 2, 2), r34 (3, 4, 6, 3), r50 (3, 4, 14, 3), r100 (3, 13, 30, 3),
r200 (6, 26, 60, 6).

The module, parameter and buffer names are insightface's (``conv1``, ``bn1``, ``prelu``,
``layer1.0.bn1``, ``layer1.0.downsample.0``, ..., ``bn2``, ``fc``, ``features``), so a
``backbone.pth`` saved by insightface loads with ``load_state_dict(strict=True)``. Checkpoints
written by marginface before it used these names (``stem.0``, ``stages.0.0.body.0``, ...) are
renamed on load (:func:`rename_legacy_keys`).
"""

from __future__ import annotations

import re
from collections.abc import MutableMapping
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from .._validation import check_int, check_real
from ._sides import check_image_side

__all__ = [
    "IRESNET_LAYERS",
    "IBasicBlock",
    "IResNet",
    "infer_iresnet",
    "iresnet18",
    "iresnet50",
    "rename_legacy_keys",
]

IRESNET_LAYERS: dict[int, tuple[int, int, int, int]] = {
    18: (2, 2, 2, 2),
    34: (3, 4, 6, 3),
    50: (3, 4, 14, 3),
    100: (3, 13, 30, 3),
    200: (6, 26, 60, 6),
}


class IBasicBlock(nn.Module):
    """One improved residual block ``Tensor[N, inplanes, H, W] -> Tensor[N, planes, H/s, W/s]``:
    ``bn3(conv2(prelu(bn2(conv1(bn1(x)))))) + shortcut(x)``, ``conv2`` of stride ``s``.

    The shortcut is ``downsample`` (1×1 convolution of stride ``s`` → BN) when the shape
    changes, else the identity (``downsample`` is then None, as in insightface's state_dict).
    """

    def __init__(self, inplanes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.bn1 = nn.BatchNorm2d(inplanes, eps=1e-5)
        self.conv1 = nn.Conv2d(inplanes, planes, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes, eps=1e-5)
        self.prelu = nn.PReLU(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes, eps=1e-5)
        self.downsample: nn.Sequential | None = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(
                nn.Conv2d(inplanes, planes, 1, stride=stride, bias=False),
                nn.BatchNorm2d(planes, eps=1e-5),
            )

    def forward(self, x: Tensor) -> Tensor:
        out = self.bn1(x)
        out = self.prelu(self.bn2(self.conv1(out)))
        out = self.bn3(self.conv2(out))  # (N, planes, H/s, W/s)
        shortcut = x if self.downsample is None else self.downsample(x)
        return out + shortcut


class IResNet(nn.Module):
    """IResNet: ``Tensor[N, C, H, W] -> Tensor[N, embedding_dim]``.

    Args:
        depth: 18, 34, 50, 100 or 200.
        embedding_dim: ``D``. Default: 512 (insightface's ``num_features``).
        in_channels: 3 for RGB faces, 1 for grey. Default: 3.
        image_size: input side; four stride-2 stages, so ``image_size / 16`` is the final map
            (7 at 112, insightface's only size). Default: 112.
        widths: stage widths. Default: (64, 128, 256, 512).
        dropout: before the final linear layer. Default: 0.0 (insightface's default).
        activation_checkpointing: recompute each block in the backward pass instead of
            keeping its activations (training only; insightface's ``using_ckpt``). Default:
            False.

    Input convention of insightface's weights: RGB, ``(x / 255 - 0.5) / 0.5``, 112×112 aligned
    faces (docs/backbones.md).
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
        activation_checkpointing: bool = False,
    ) -> None:
        super().__init__()
        if depth not in IRESNET_LAYERS:
            valid = ", ".join(str(d) for d in IRESNET_LAYERS)
            raise ValueError(f"depth must be one of {valid}, got {depth!r}")
        self.embedding_dim = check_int("embedding_dim", embedding_dim, minimum=1)
        check_int("in_channels", in_channels, minimum=1)
        check_image_side(
            f"IResNet-{depth} (r{depth})",
            image_size,
            multiple=16,
            why="four stride-2 stages: the last map is image_size / 16",
        )
        check_real("dropout", dropout, nonnegative=True, below=1.0)
        if not isinstance(activation_checkpointing, bool):
            raise TypeError(
                f"activation_checkpointing must be a bool, got {activation_checkpointing!r}"
            )
        self.activation_checkpointing = activation_checkpointing
        self.conv1 = nn.Conv2d(in_channels, widths[0], 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(widths[0], eps=1e-5)
        self.prelu = nn.PReLU(widths[0])
        inplanes = widths[0]
        for index, (planes, blocks) in enumerate(zip(widths, IRESNET_LAYERS[depth], strict=True)):
            layer = [IBasicBlock(inplanes, planes, stride=2)]
            layer += [IBasicBlock(planes, planes) for _ in range(blocks - 1)]
            self.add_module(f"layer{index + 1}", nn.Sequential(*layer))
            inplanes = planes
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
        self.register_load_state_dict_pre_hook(_legacy_keys_hook)

    def stages(self) -> list[nn.Sequential]:
        """``[layer1, layer2, layer3, layer4]``."""
        return [self.layer1, self.layer2, self.layer3, self.layer4]

    def forward(self, images: Tensor) -> Tensor:
        """Embeddings ``Tensor[N, D]`` of images ``Tensor[N, C, image_size, image_size]``."""
        x = self.prelu(self.bn1(self.conv1(images)))  # (N, 64, s, s)
        for stage in self.stages():
            for block in stage:
                if self.activation_checkpointing and self.training:
                    x = checkpoint(block, x, use_reentrant=False)
                else:
                    x = block(x)
        # x: (N, 512, s/16, s/16)
        x = self.dropout(torch.flatten(self.bn2(x), 1))  # (N, 512·(s/16)²)
        return self.features(self.fc(x))  # (N, D)


_LEGACY_BLOCK = re.compile(r"stages\.(\d+)\.(\d+)\.body\.(\d+)\.")
_LEGACY_BODY = {"0": "bn1", "1": "conv1", "2": "bn2", "3": "prelu", "4": "conv2", "5": "bn3"}
_LEGACY_STEM = {"stem.0.": "conv1.", "stem.1.": "bn1.", "stem.2.": "prelu."}


def _legacy_name(key: str) -> str:
    for old, new in _LEGACY_STEM.items():
        if key.startswith(old):
            return new + key[len(old) :]
    match = _LEGACY_BLOCK.match(key)
    if match:
        stage, block, layer = match.groups()
        return f"layer{int(stage) + 1}.{block}.{_LEGACY_BODY[layer]}." + key[match.end() :]
    if key.startswith("stages."):
        _, stage, rest = key.split(".", 2)
        return f"layer{int(stage) + 1}.{rest}"  # the shortcut: ``downsample.{0,1}`` unchanged
    return key  # bn2, fc, features kept their names


def rename_legacy_keys(state_dict: MutableMapping[str, Any], prefix: str = "") -> bool:
    """Rename, in place, the keys of an IResNet state_dict written by marginface before it
    used insightface's names: ``stem.0/1/2`` → ``conv1``/``bn1``/``prelu``,
    ``stages.S.B.body.0..5`` → ``layer{S+1}.B.bn1, conv1, bn2, prelu, conv2, bn3``,
    ``stages.S.B.downsample`` → ``layer{S+1}.B.downsample``. Only keys under ``prefix`` are
    looked at; others are left alone.

    Returns:
        Whether any key was renamed.
    """
    old_keys = [
        key
        for key in state_dict
        if key.startswith(prefix) and key[len(prefix) :].startswith(("stem.", "stages."))
    ]
    for key in old_keys:
        state_dict[prefix + _legacy_name(key[len(prefix) :])] = state_dict.pop(key)
    return bool(old_keys)


def _legacy_keys_hook(module: nn.Module, state_dict: Any, prefix: str, *args: Any) -> None:
    """``load_state_dict`` pre-hook: old marginface names are renamed before matching."""
    rename_legacy_keys(state_dict, prefix)


def iresnet18(embedding_dim: int = 512, **kwargs: Any) -> IResNet:
    """IResNet-18 (blocks 2, 2, 2, 2); insightface's ``r18``."""
    return IResNet(18, embedding_dim, **kwargs)


def iresnet50(embedding_dim: int = 512, **kwargs: Any) -> IResNet:
    """IResNet-50 (blocks 3, 4, 14, 3); insightface's ``r50``."""
    return IResNet(50, embedding_dim, **kwargs)


def infer_iresnet(state_dict: Any) -> tuple[str, int, int] | None:
    """The insightface name, embedding size ``D`` and input side of an IResNet state_dict
    written by insightface's ``arcface_torch`` (or marginface), read from its keys and shapes;
    None when the tensors are not an IResNet's.

    The depth is the number of blocks per stage (``layerS.B.conv1.weight``) matched against
    :data:`IRESNET_LAYERS`; ``D`` is ``fc.weight``'s rows; the side is ``16·√(in/512)`` from
    ``fc.weight``'s columns ``512·(side/16)²`` (112 for ``512·7·7``).
    """
    if not isinstance(state_dict, MutableMapping | dict) or "fc.weight" not in state_dict:
        return None
    blocks = [0, 0, 0, 0]
    for key in state_dict:
        match = re.fullmatch(r"layer([1-4])\.(\d+)\.conv1\.weight", str(key))
        if match:
            stage, block = int(match.group(1)) - 1, int(match.group(2))
            blocks[stage] = max(blocks[stage], block + 1)
    depth = next((d for d, layers in IRESNET_LAYERS.items() if tuple(blocks) == layers), None)
    fc = state_dict["fc.weight"]
    if depth is None or getattr(fc, "ndim", 0) != 2 or "conv1.weight" not in state_dict:
        return None
    cells = int(fc.shape[1]) // 512
    grid = round(cells**0.5)
    if grid * grid * 512 != int(fc.shape[1]):
        return None
    return f"r{depth}", int(fc.shape[0]), grid * 16
