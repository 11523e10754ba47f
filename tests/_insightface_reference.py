"""insightface's ``CombinedMarginLoss`` (``recognition/arcface_torch/losses.py``) written out
for the tests, on cosines: the inter-class filter under ``no_grad``, then the ArcFace branch or
the CosFace branch, then the scale. Independent of marginface's code.

insightface's ArcFace branch exists in two versions: ``"arccos"`` (``arccos_``/``cos_`` in place
under ``no_grad``: a straight-through target, no guard at θ + m > π; marginface's
``policy="none", gradient="straight_through"``) and ``"formula"`` (``cos θ cos m - sin θ sin m``
with ``easy_margin = False``: ``cos θ - sin(π - m)·m`` beyond ``cos(π - m)``, exact gradient;
marginface's ``policy="linear", gradient="exact"``)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor


def insightface_logits(
    cosine: Tensor,
    labels: Tensor,
    *,
    s: float,
    m1: float,
    m2: float,
    m3: float,
    interclass_filtering_threshold: float = 0.0,
    arcface_branch: str = "arccos",
) -> Tensor:
    """``CombinedMarginLoss.forward`` before the cross-entropy, ``Tensor[N, C]``.

    ``labels`` is -1 for rows whose class is not among these columns (Partial FC's
    convention). ``cosine`` may require grad; it is not modified.
    """
    logits = cosine.clamp(-1, 1)  # partial_fc.py clamps the cosines before the margin loss
    index_positive = torch.where(labels != -1)[0]
    if interclass_filtering_threshold > 0:
        with torch.no_grad():
            dirty = logits > interclass_filtering_threshold
            dirty = dirty.float()
            mask = torch.ones(
                [index_positive.size(0), logits.size(1)], device=logits.device, dtype=logits.dtype
            )
            mask.scatter_(1, labels[index_positive].view(-1, 1), 0)
            dirty[index_positive] *= mask
            tensor_mul = 1 - dirty
        logits = tensor_mul * logits
    else:
        logits = logits * 1.0  # a non-leaf copy, as their logits are
    target_logit = logits[index_positive, labels[index_positive].view(-1)]
    if m1 == 1.0 and m3 == 0.0 and arcface_branch == "formula":
        sin_theta = torch.sqrt(1.0 - torch.pow(target_logit, 2))
        cos_theta_m = target_logit * math.cos(m2) - sin_theta * math.sin(m2)
        final_target_logit = torch.where(
            target_logit > math.cos(math.pi - m2),
            cos_theta_m,
            target_logit - math.sin(math.pi - m2) * m2,
        )
        logits[index_positive, labels[index_positive].view(-1)] = final_target_logit
        logits = logits * s
    elif m1 == 1.0 and m3 == 0.0:
        with torch.no_grad():
            target_logit.arccos_()
            logits.arccos_()
            final_target_logit = target_logit + m2
            logits[index_positive, labels[index_positive].view(-1)] = final_target_logit
            logits.cos_()
        logits = logits * s
    elif m3 > 0:
        final_target_logit = target_logit - m3
        logits[index_positive, labels[index_positive].view(-1)] = final_target_logit
        logits = logits * s
    else:
        raise ValueError("only insightface's ArcFace and CosFace branches are written out")
    return logits


def insightface_loss(cosine: Tensor, labels: Tensor, **options: float) -> Tensor:
    """Per-sample cross-entropy of :func:`insightface_logits`, ``Tensor[N]`` (rows with a
    target among the columns)."""
    logits = insightface_logits(cosine, labels, **options)
    return F.cross_entropy(logits, labels, reduction="none")
