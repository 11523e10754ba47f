"""insightface's ``arcface_torch/backbones`` state_dict keys and shapes, restated from the
architecture descriptions (not from marginface's code), and their forward passes written as
plain functions over those keys: the independent references of tests/models.

* IResNet (``iresnet.py``): ``conv1``, ``bn1``, ``prelu``; ``layer{1..4}.{b}.{bn1, conv1, bn2,
  prelu, conv2, bn3}`` and ``layer{s}.0.downsample.{0: conv 1×1, 1: BN}``; ``bn2``, ``fc``,
  ``features``. Blocks: r18 2,2,2,2; r34 3,4,6,3; r50 3,4,14,3; r100 3,13,30,3; r200 6,26,60,6.
* MobileFaceNet (``mobilefacenet.py``): ``layers.{0..7}``, ``conv_sep``, ``features.layers``.
* ViT (``vit.py``): ``patch_embed.proj``, ``pos_embed``, ``blocks.{i}.{norm1, attn.qkv,
  attn.proj, norm2, mlp.fc1, mlp.fc2}``, ``norm``, ``feature.{0..3}``, ``mask_token``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

BLOCKS = {18: (2, 2, 2, 2), 34: (3, 4, 6, 3), 50: (3, 4, 14, 3), 100: (3, 13, 30, 3)}
BLOCKS[200] = (6, 26, 60, 6)


def _bn(name: str, c: int) -> dict[str, tuple[int, ...]]:
    return {
        f"{name}.weight": (c,),
        f"{name}.bias": (c,),
        f"{name}.running_mean": (c,),
        f"{name}.running_var": (c,),
        f"{name}.num_batches_tracked": (),
    }


def iresnet_keys(depth: int, num_features: int = 512) -> dict[str, tuple[int, ...]]:
    """``{key: shape}`` of insightface's ``iresnet{depth}(num_features=...)``."""
    keys: dict[str, tuple[int, ...]] = {"conv1.weight": (64, 3, 3, 3)}
    keys |= _bn("bn1", 64) | {"prelu.weight": (64,)}
    inplanes = 64
    for s, (planes, count) in enumerate(zip((64, 128, 256, 512), BLOCKS[depth], strict=True)):
        for b in range(count):
            p = f"layer{s + 1}.{b}"
            cin = inplanes if b == 0 else planes
            keys |= _bn(f"{p}.bn1", cin) | {f"{p}.conv1.weight": (planes, cin, 3, 3)}
            keys |= _bn(f"{p}.bn2", planes) | {f"{p}.prelu.weight": (planes,)}
            keys |= {f"{p}.conv2.weight": (planes, planes, 3, 3)} | _bn(f"{p}.bn3", planes)
            if b == 0:  # every stage starts with stride 2: a 1×1 conv + BN shortcut
                keys |= {f"{p}.downsample.0.weight": (planes, cin, 1, 1)}
                keys |= _bn(f"{p}.downsample.1", planes)
        inplanes = planes
    keys |= _bn("bn2", 512)
    keys |= {"fc.weight": (num_features, 512 * 49), "fc.bias": (num_features,)}
    return keys | _bn("features", num_features)


def _convblock(p: str, cin: int, cout: int, k: int, groups: int, act: bool = True) -> dict:
    keys = {f"{p}.layers.0.weight": (cout, cin // groups, k, k)} | _bn(f"{p}.layers.1", cout)
    if act:
        keys[f"{p}.layers.2.weight"] = (cout,)
    return keys


def _depthwise(p: str, cin: int, cout: int, hidden: int) -> dict:
    keys = _convblock(f"{p}.layers.0", cin, hidden, 1, 1)
    keys |= _convblock(f"{p}.layers.1", hidden, hidden, 3, hidden)
    return keys | _convblock(f"{p}.layers.2", hidden, cout, 1, 1, act=False)


def _residual(p: str, c: int, count: int, hidden: int) -> dict:
    keys: dict = {}
    for i in range(count):
        keys |= _depthwise(f"{p}.layers.{i}", c, c, hidden)
    return keys


def mobilefacenet_keys(blocks: tuple[int, ...], scale: int, num_features: int = 512) -> dict:
    """``{key: shape}`` of insightface's ``MobileFaceNet(num_features, blocks, scale)``."""
    c = 64 * scale
    keys = _convblock("layers.0", 3, c, 3, 1)
    if blocks[0] == 1:
        keys |= _convblock("layers.1", c, c, 3, 64)
    else:
        keys |= _residual("layers.1", c, blocks[0], 128)
    keys |= _depthwise("layers.2", c, c, 128) | _residual("layers.3", c, blocks[1], 128)
    keys |= _depthwise("layers.4", c, 2 * c, 256) | _residual("layers.5", 2 * c, blocks[2], 256)
    keys |= _depthwise("layers.6", 2 * c, 2 * c, 512)
    keys |= _residual("layers.7", 2 * c, blocks[3], 256)
    keys |= _convblock("conv_sep", 2 * c, 512, 1, 1)
    keys |= _convblock("features.layers.0", 512, 512, 7, 512, act=False)
    keys |= {"features.layers.2.weight": (num_features, 512)}
    return keys | _bn("features.layers.3", num_features)


def vit_keys(width: int, depth: int, num_features: int = 512, patches: int = 144) -> dict:
    """``{key: shape}`` of insightface's ``VisionTransformer(img_size=112, patch_size=9,
    embed_dim=width, depth=depth, num_classes=num_features, norm_layer="ln")``."""
    keys = {"patch_embed.proj.weight": (width, 3, 9, 9), "patch_embed.proj.bias": (width,)}
    keys |= {"pos_embed": (1, patches, width), "mask_token": (1, 1, width)}
    for i in range(depth):
        p = f"blocks.{i}"
        for norm in ("norm1", "norm2"):
            keys |= {f"{p}.{norm}.weight": (width,), f"{p}.{norm}.bias": (width,)}
        keys |= {f"{p}.attn.qkv.weight": (3 * width, width)}
        keys |= {f"{p}.attn.proj.weight": (width, width), f"{p}.attn.proj.bias": (width,)}
        keys |= {f"{p}.mlp.fc1.weight": (4 * width, width), f"{p}.mlp.fc1.bias": (4 * width,)}
        keys |= {f"{p}.mlp.fc2.weight": (width, 4 * width), f"{p}.mlp.fc2.bias": (width,)}
    keys |= {"norm.weight": (width,), "norm.bias": (width,)}
    keys |= {"feature.0.weight": (width, width * patches)} | _bn("feature.1", width)
    return keys | {"feature.2.weight": (num_features, width)} | _bn("feature.3", num_features)


# ---------------------------------------------------------------- forwards over the keys (eval)
def _batch_norm(x: Tensor, sd: dict, name: str, eps: float = 1e-5) -> Tensor:
    return F.batch_norm(
        x, sd[f"{name}.running_mean"], sd[f"{name}.running_var"], sd[f"{name}.weight"],
        sd[f"{name}.bias"], training=False, eps=eps,
    )  # fmt: skip


def iresnet_forward(sd: dict, x: Tensor, depth: int) -> Tensor:
    """insightface's ``IResNet.forward`` in eval mode, over its state_dict ``sd``."""
    x = F.prelu(_batch_norm(F.conv2d(x, sd["conv1.weight"], padding=1), sd, "bn1"),
                sd["prelu.weight"])  # fmt: skip
    for s, count in enumerate(BLOCKS[depth]):
        for b in range(count):
            p = f"layer{s + 1}.{b}"
            stride = 2 if b == 0 else 1
            out = _batch_norm(x, sd, f"{p}.bn1")
            out = F.conv2d(out, sd[f"{p}.conv1.weight"], padding=1)
            out = F.prelu(_batch_norm(out, sd, f"{p}.bn2"), sd[f"{p}.prelu.weight"])
            out = F.conv2d(out, sd[f"{p}.conv2.weight"], stride=stride, padding=1)
            out = _batch_norm(out, sd, f"{p}.bn3")
            if f"{p}.downsample.0.weight" in sd:
                shortcut = F.conv2d(x, sd[f"{p}.downsample.0.weight"], stride=stride)
                shortcut = _batch_norm(shortcut, sd, f"{p}.downsample.1")
            else:
                shortcut = x
            x = out + shortcut
    x = torch.flatten(_batch_norm(x, sd, "bn2"), 1)
    x = F.linear(x, sd["fc.weight"], sd["fc.bias"])
    return _batch_norm(x, sd, "features")


def vit_forward(sd: dict, x: Tensor, depth: int, heads: int = 8) -> Tensor:
    """insightface's ``VisionTransformer.forward`` in eval mode (no masking, no drop path)."""
    x = F.conv2d(x, sd["patch_embed.proj.weight"], sd["patch_embed.proj.bias"], stride=9)
    x = x.flatten(2).transpose(1, 2) + sd["pos_embed"]  # (N, L, W)
    n, length, width = x.shape
    hd = width // heads
    for i in range(depth):
        p = f"blocks.{i}"
        h = F.layer_norm(x, (width,), sd[f"{p}.norm1.weight"], sd[f"{p}.norm1.bias"])
        qkv = (h @ sd[f"{p}.attn.qkv.weight"].T).reshape(n, length, 3, heads, hd)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
        attn = ((q @ k.transpose(-2, -1)) * hd**-0.5).softmax(dim=-1)
        h = (attn @ v).transpose(1, 2).reshape(n, length, width)
        x = x + F.linear(h, sd[f"{p}.attn.proj.weight"], sd[f"{p}.attn.proj.bias"])
        h = F.layer_norm(x, (width,), sd[f"{p}.norm2.weight"], sd[f"{p}.norm2.bias"])
        h = F.relu6(F.linear(h, sd[f"{p}.mlp.fc1.weight"], sd[f"{p}.mlp.fc1.bias"]))
        x = x + F.linear(h, sd[f"{p}.mlp.fc2.weight"], sd[f"{p}.mlp.fc2.bias"])
    x = F.layer_norm(x, (width,), sd["norm.weight"], sd["norm.bias"]).reshape(n, -1)
    x = _batch_norm(x @ sd["feature.0.weight"].T, sd, "feature.1", eps=2e-5)
    return _batch_norm(x @ sd["feature.2.weight"].T, sd, "feature.3", eps=2e-5)


def _convblock_forward(sd: dict, p: str, x: Tensor, stride: int, groups: int, act: bool = True):
    weight = sd[f"{p}.layers.0.weight"]
    padding = weight.shape[-1] // 2 if weight.shape[-1] == 3 else 0
    x = F.conv2d(x, weight, stride=stride, padding=padding, groups=groups)
    x = _batch_norm(x, sd, f"{p}.layers.1")
    return F.prelu(x, sd[f"{p}.layers.2.weight"]) if act else x


def _depthwise_forward(sd: dict, p: str, x: Tensor, stride: int, residual: bool) -> Tensor:
    hidden = sd[f"{p}.layers.0.layers.0.weight"].shape[0]
    h = _convblock_forward(sd, f"{p}.layers.0", x, 1, 1)
    h = _convblock_forward(sd, f"{p}.layers.1", h, stride, hidden)
    h = _convblock_forward(sd, f"{p}.layers.2", h, 1, 1, act=False)
    return x + h if residual else h


def mobilefacenet_forward(sd: dict, x: Tensor, blocks: tuple[int, ...]) -> Tensor:
    """insightface's ``MobileFaceNet.forward`` in eval mode over its keys (112×112 input)."""
    x = _convblock_forward(sd, "layers.0", x, 2, 1)
    if blocks[0] == 1:
        x = _convblock_forward(sd, "layers.1", x, 1, 64)
    else:
        for i in range(blocks[0]):
            x = _depthwise_forward(sd, f"layers.1.layers.{i}", x, 1, True)
    for index, count in ((2, None), (3, blocks[1]), (4, None), (5, blocks[2]), (6, None)):
        if count is None:  # a stride-2 DepthWise without residual
            x = _depthwise_forward(sd, f"layers.{index}", x, 2, False)
        else:
            for i in range(count):
                x = _depthwise_forward(sd, f"layers.{index}.layers.{i}", x, 1, True)
    for i in range(blocks[3]):
        x = _depthwise_forward(sd, f"layers.7.layers.{i}", x, 1, True)
    x = _convblock_forward(sd, "conv_sep", x, 1, 1)
    x = _convblock_forward(sd, "features.layers.0", x, 1, 512, act=False).flatten(1)
    return _batch_norm(x @ sd["features.layers.2.weight"].T, sd, "features.layers.3")
