"""AdaFace's released IR checkpoints (Kim et al., "AdaFace", CVPR 2022; mk-minchul/AdaFace
``net.py``) mapped onto :class:`~marginface.models.iresnet.IResNet`.

AdaFace's ``Backbone(input_size=(112, 112), num_layers, mode="ir")`` is the same network as
insightface's IResNet of that depth (IR_50 ↔ r50, IR_101 ↔ r100: ``IR_101`` builds the
100-layer block list 3, 13, 30, 3), under other names:

==============================================  ================================
AdaFace                                         marginface / insightface
==============================================  ================================
``input_layer.0`` (conv 3×3), ``.1`` (BN),      ``conv1``, ``bn1``, ``prelu``
``.2`` (PReLU)
``body.{i}.res_layer.0 .. 5``                   ``layer{s}.{b}.bn1, conv1, bn2,
                                                prelu, conv2, bn3`` (``i`` counts
                                                blocks across the stages)
``body.{i}.shortcut_layer.0``, ``.1``           ``layer{s}.{b}.downsample.0``, ``.1``
``output_layer.0`` (BN2d)                       ``bn2``
``output_layer.3`` (Linear 512·7·7 → 512)       ``fc``
``output_layer.4`` (BatchNorm1d, affine=False)  ``features`` (weight 1, bias 0)
==============================================  ================================

Two differences, both expressed exactly in IResNet's parameters:

* the first block (64 → 64 channels, stride 2) has a parameter-free shortcut in AdaFace,
  ``MaxPool2d(kernel_size=1, stride=2)``, i.e. ``x[:, :, ::2, ::2]``; IResNet's is a 1×1
  stride-2 convolution and a BN, which compute the same subsampling with an identity kernel and
  a BN of mean 0, variance 1, scale ``√(1 + eps)``, bias 0 (in eval mode; fine-tuning trains
  them like any other shortcut);
* AdaFace's models take **BGR** images (its ``inference.py`` flips PIL's RGB); with
  ``rgb=True`` (default) the first convolution's input channels are reversed, so the mapped
  model takes RGB like every other marginface backbone. Normalization is the same,
  ``(x / 255 - 0.5) / 0.5``.

AdaFace's forward also divides the embedding by its norm (and returns the norm); the mapped
IResNet returns the unnormalized embedding, of the same direction (cosine scores are equal).
IR-SE models (``mode="ir_se"``, an SE block in each residual branch) and the bottleneck IR-152/
IR-200 have no IResNet counterpart and are refused.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch import Tensor

__all__ = ["ADAFACE_DEPTHS", "adaface_to_iresnet", "is_adaface_state_dict"]

ADAFACE_DEPTHS: dict[int, tuple[int, int, int, int]] = {
    8: (2, 2, 2, 2),  # IR_18 (8 blocks)
    16: (3, 4, 6, 3),  # IR_34
    24: (3, 4, 14, 3),  # IR_50
    49: (3, 13, 30, 3),  # IR_101
}
"""Number of ``body`` blocks → blocks per stage."""

_RESIDUAL = {"0": "bn1", "1": "conv1", "2": "bn2", "3": "prelu", "4": "conv2", "5": "bn3"}
_STEM = {"0": "conv1", "1": "bn1", "2": "prelu"}
_OUTPUT = {"0": "bn2", "3": "fc", "4": "features"}
_BN_EPS = 1e-5


def _strip(state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Without the Lightning ``model.`` prefix and the classifier ``head.*``."""
    out = {}
    for key, value in state.items():
        if key.startswith("head."):
            continue
        out[key[len("model.") :] if key.startswith("model.") else key] = value
    return out


def is_adaface_state_dict(state: Mapping[str, object]) -> bool:
    """Whether ``state`` uses AdaFace's ``net.py`` names (``input_layer.0.weight``)."""
    return any(k in state for k in ("input_layer.0.weight", "model.input_layer.0.weight"))


def adaface_to_iresnet(
    state: Mapping[str, Tensor], *, rgb: bool = True, source: str = "the state_dict"
) -> tuple[dict[str, Tensor], int]:
    """Rename an AdaFace IR state_dict to :class:`~marginface.models.iresnet.IResNet`'s names.

    Args:
        state: AdaFace's ``Backbone`` state_dict, or a Lightning checkpoint's ``state_dict``
            (keys ``model.*``, ``head.*``).
        rgb: reverse the first convolution's input channels, so the model takes RGB instead of
            AdaFace's BGR. Default: True.
        source: the file's name, for messages.

    Returns:
        ``(state_dict, depth)``: the renamed tensors and the IResNet depth (18, 34, 50, 100).

    Raises:
        ValueError: an IR-SE or bottleneck model, or a block count of no IResNet depth.
    """
    state = _strip(state)
    if any(".se_block." in key for key in state):
        raise ValueError(
            f"{source} is an AdaFace IR-SE model (squeeze-and-excitation blocks); only the plain "
            "IR models (IR_18/34/50/101) map onto IResNet"
        )
    blocks = sorted({int(key.split(".")[1]) for key in state if key.startswith("body.")})
    count = len(blocks)
    if count not in ADAFACE_DEPTHS or "body.0.res_layer.6.weight" in state:
        raise ValueError(
            f"{source} has {count} AdaFace body blocks; only IR_18 (8), IR_34 (16), IR_50 (24) "
            "and IR_101 (49) map onto IResNet"
        )
    per_stage = ADAFACE_DEPTHS[count]
    place = [(s + 1, b) for s, n in enumerate(per_stage) for b in range(n)]  # body i → (s, b)
    out: dict[str, Tensor] = {}
    for key, value in state.items():
        parts = key.split(".")
        if parts[0] == "input_layer":
            out[".".join([_STEM[parts[1]], *parts[2:]])] = value
        elif parts[0] == "output_layer":
            if parts[1] not in _OUTPUT:
                raise ValueError(f"{source}: unexpected AdaFace key {key!r}")
            out[".".join([_OUTPUT[parts[1]], *parts[2:]])] = value
        elif parts[0] == "body":
            stage, block = place[int(parts[1])]
            prefix = f"layer{stage}.{block}"
            if parts[2] == "res_layer":
                out[".".join([prefix, _RESIDUAL[parts[3]], *parts[4:]])] = value
            elif parts[2] == "shortcut_layer":
                out[".".join([prefix, "downsample", *parts[3:]])] = value
            else:
                raise ValueError(f"{source}: unexpected AdaFace key {key!r}")
        else:
            raise ValueError(f"{source}: unexpected AdaFace key {key!r}")
    conv = out["conv1.weight"]
    if rgb:
        out["conv1.weight"] = conv.flip(1)  # (64, 3, 3, 3): input channels B, G, R → R, G, B
    if "layer1.0.downsample.0.weight" not in out:  # MaxPool2d(1, 2): subsampling, exactly
        width = out["layer1.0.conv1.weight"].shape[0]
        dtype = conv.dtype
        out["layer1.0.downsample.0.weight"] = torch.eye(width, dtype=dtype)[:, :, None, None]
        out["layer1.0.downsample.1.weight"] = torch.full(
            (width,), math.sqrt(1.0 + _BN_EPS), dtype=dtype
        )
        out["layer1.0.downsample.1.bias"] = torch.zeros(width, dtype=dtype)
        out["layer1.0.downsample.1.running_mean"] = torch.zeros(width, dtype=dtype)
        out["layer1.0.downsample.1.running_var"] = torch.ones(width, dtype=dtype)
        out["layer1.0.downsample.1.num_batches_tracked"] = torch.tensor(0)
    features = out["features.running_mean"]
    out.setdefault("features.weight", torch.ones_like(features))  # affine=False in AdaFace
    out.setdefault("features.bias", torch.zeros_like(features))
    depth = {8: 18, 16: 34, 24: 50, 49: 100}[count]
    return out, depth
