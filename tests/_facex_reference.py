"""The softmax-form heads of FaceX-Zoo (JDAI-CV/FaceX-Zoo ``head/``), face.evoLVe and OpenSphere
written out for the tests from what their code computes, on embeddings and centers, in plain
PyTorch. Independent of marginface's code; nothing copied.

Conventions shared by every function here:

* ``x``: ``Tensor[N, D]`` embeddings, ``weight``: ``Tensor[C, D]`` class centers (FaceX-Zoo
  stores ``(D, C)`` and normalizes along ``D``: the same centers transposed), ``labels``:
  ``Tensor[N]`` int64. The functions return the logits (``Tensor[N, C]``) that the authors' head
  hands to ``CrossEntropyLoss``.
* The embeddings are L2-normalized first. FaceX-Zoo's MV-Softmax head takes ``x`` as it comes
  (its backbones' outputs are used unnormalized); marginface's heads always normalize, so the
  parity is stated for normalized embeddings (``∂x`` then includes the normalization's
  Jacobian on both sides).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor


def normalized_cosine(x: Tensor, weight: Tensor) -> Tensor:
    """``cos θ = x̂·ŵᵀ``, ``Tensor[N, C]``, no clamp (FaceX-Zoo's MV head clamps nothing)."""
    return F.normalize(x, dim=1) @ F.normalize(weight, dim=1).t()


def mv_softmax_logits(
    x: Tensor,
    weight: Tensor,
    labels: Tensor,
    *,
    is_am: bool,
    margin: float = 0.35,
    mv_weight: float = 1.12,
    scale: float = 32.0,
) -> Tensor:
    """FaceX-Zoo ``MV_Softmax.forward``.

    With ``g = cos θ_y`` (unclamped):

    * AM (``is_am``): mis-classified where ``cos θ_j > g - m``; target ``g - m`` if ``g > m``
      else ``g``.
    * Arc: ``f = g·cos m - sqrt(1 - g²)·sin m``; mis-classified where ``cos θ_j > f``; target
      ``f`` if ``g > 0`` else ``g``.

    Every mis-classified cosine (a boolean mask, no gradient through it) becomes
    ``w·cos θ_j + w - 1``; the target column is then overwritten; all times ``s``.
    """
    cos_theta = normalized_cosine(x, weight)  # (N, C)
    gt = cos_theta.gather(1, labels.view(-1, 1))  # (N, 1)
    if is_am:
        mask = cos_theta > gt - margin
        final_gt = torch.where(gt > margin, gt - margin, gt)
    else:
        sin_theta = torch.sqrt(1.0 - gt * gt)
        cos_theta_m = gt * math.cos(margin) - sin_theta * math.sin(margin)
        mask = cos_theta > cos_theta_m
        final_gt = torch.where(gt > 0.0, cos_theta_m, gt)
    reweighted = torch.where(mask, mv_weight * cos_theta + mv_weight - 1.0, cos_theta)
    is_target = F.one_hot(labels, cos_theta.shape[1]).bool()
    logits = torch.where(is_target, final_gt, reweighted)
    return logits * scale


def reference_loss(logits: Tensor, labels: Tensor) -> Tensor:
    """``nn.CrossEntropyLoss()`` (mean) on the head's logits, as FaceX-Zoo's training loop."""
    return F.cross_entropy(logits, labels)
