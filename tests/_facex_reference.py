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


def circle_loss_logits(
    x: Tensor, weight: Tensor, labels: Tensor, *, margin: float = 0.25, gamma: float = 256.0
) -> Tensor:
    """FaceX-Zoo ``CircleLoss.forward`` (class-level circle loss).

    ``cos θ`` clamped to [-1, 1]; ``O_p = 1 + m``, ``O_n = -m``, ``Δ_p = 1 - m``, ``Δ_n = m``;
    ``α_p = max(O_p - cos θ, 0)``, ``α_n = max(cos θ - O_n, 0)`` from the detached cosines; the
    label's column gets ``α_p (cos θ - Δ_p)``, every other column ``α_n (cos θ - Δ_n)``; all
    times ``γ``.
    """
    cos_theta = normalized_cosine(x, weight).clamp(-1, 1)  # (N, C)
    alpha_p = torch.clamp_min(1.0 + margin - cos_theta.detach(), 0.0)
    alpha_n = torch.clamp_min(cos_theta.detach() + margin, 0.0)
    logit_p = alpha_p * (cos_theta - (1.0 - margin))
    logit_n = alpha_n * (cos_theta - margin)
    is_target = F.one_hot(labels, cos_theta.shape[1]).bool()
    return torch.where(is_target, logit_p, logit_n) * gamma


def li_arcface_logits(
    x: Tensor, weight: Tensor, labels: Tensor, *, margin: float = 0.45, scale: float = 64.0
) -> Tensor:
    """Li-ArcFace (AirFace, Li et al. 2019, arXiv:1907.12256), as the paper's equation and the
    implementations in circulation compute it: ``θ = acos(cos θ)`` on every column, ``m`` added
    at the label's column, ``s·(π - 2(θ + m))/π``. There is no code from the authors."""
    theta = torch.acos(normalized_cosine(x, weight))  # (N, C)
    shift = F.one_hot(labels, theta.shape[1]).to(theta.dtype) * margin
    return scale * (math.pi - 2.0 * (theta + shift)) / math.pi


def arcnegface_logits(
    x: Tensor,
    weight: Tensor,
    labels: Tensor,
    *,
    margin: float = 0.5,
    scale: float = 64.0,
    alpha: float = 1.2,
    sigma: float = 2.0,
) -> Tensor:
    """ArcNegFace as FaceX-Zoo ``head/ArcNegFace.py`` and face.evoLVe compute it (the row loop
    written with tensors).

    Target ``a = cos(acos(cos θ_y) + m)`` if ``cos θ_y > cos(π - m)`` else
    ``cos θ_y - sin(π - m)·m``; per entry ``t = α·exp(-(cos θ_j - a)²/σ)`` from the values only
    (``.item()`` / ``detach``); logits ``s·a`` at the label, ``s·(t·cos θ_j + t - 1)`` elsewhere.
    """
    cos = normalized_cosine(x, weight)  # (N, C)
    gt = cos.gather(1, labels.view(-1, 1))  # (N, 1)
    threshold = math.cos(math.pi - margin)
    shift = math.sin(math.pi - margin) * margin
    a = torch.where(gt > threshold, torch.cos(torch.acos(gt) + margin), gt - shift)  # (N, 1)
    t = (alpha * torch.exp(-((cos - a.detach()) ** 2) / sigma)).detach()
    is_target = F.one_hot(labels, cos.shape[1]).bool()
    return scale * torch.where(is_target, a, t * cos + t - 1.0)


def adam_softmax_logits(
    x: Tensor, weight: Tensor, margins: Tensor, labels: Tensor, *, scale: float = 30.0
) -> Tensor:
    """FaceX-Zoo ``Adam_Softmax.forward``'s logits: ``cos θ`` clamped to [-1, 1], the label's
    column ``cos θ_y - m_y`` (``m`` one learnable value per class, clamped to [0, 1] in place on
    ``.data`` before use, so its gradient passes unchanged), every other column ``cos θ_j``, all
    times ``s``. ``margins``: ``Tensor[C]`` (theirs is ``(1, C)``)."""
    with torch.no_grad():
        margins.clamp_(0.0, 1.0)  # their `self.adam.data.clamp_(0, 1)`
    cos_theta = normalized_cosine(x, weight).clamp(-1, 1)  # (N, C)
    shifted = cos_theta - margins[labels].view(-1, 1)
    is_target = F.one_hot(labels, cos_theta.shape[1]).bool()
    return torch.where(is_target, shifted, cos_theta) * scale


def adam_softmax_regularizer(margins: Tensor, *, lamda: float = 70.0) -> Tensor:
    """FaceX-Zoo ``Adam_Softmax``'s second output, ``λ·(1 - Σ_c m_c / C)``, which its training
    loop adds to the cross-entropy."""
    return lamda * (1.0 - margins.sum() / margins.shape[0])


def npcface_logits(
    x: Tensor,
    weight: Tensor,
    labels: Tensor,
    *,
    margin: float = 0.5,
    scale: float = 64.0,
    m0: float = 0.40,
    m1: float = 0.20,
    t: float = 1.10,
    a: float = 0.20,
) -> Tensor:
    """FaceX-Zoo ``NPCFace.forward``.

    ``cos θ`` clamped to [-1, 1]; ``g = cos θ_y``; ``f = g·cos m - sqrt(1 - g²)·sin m``. Without
    gradient: the hard mask ``cos θ_j > f`` with the label's column cleared, the mean hard cosine
    ``Σ hard·cos θ / clamp(Σ hard, 1, C)`` and ``m' = m0 + m1·mean``. Target
    ``g·cos m' - sqrt(1 - g²)·sin m'`` where ``g > 0`` else ``g``; every column with
    ``cos θ_j > f`` (a boolean mask) becomes ``t·cos θ_j + a``; the label's column is then
    overwritten by the target; all times ``s``.
    """
    cos_theta = normalized_cosine(x, weight).clamp(-1, 1)  # (N, C)
    gt = cos_theta.gather(1, labels.view(-1, 1))  # (N, 1)
    sin_theta = torch.sqrt(1.0 - gt * gt)
    cos_theta_m = gt * math.cos(margin) - sin_theta * math.sin(margin)
    is_target = F.one_hot(labels, cos_theta.shape[1]).bool()
    with torch.no_grad():
        hard = (cos_theta > cos_theta_m) & ~is_target
        hard_sum = torch.where(hard, cos_theta, torch.zeros_like(cos_theta)).sum(1, keepdim=True)
        hard_count = hard.to(cos_theta.dtype).sum(1, keepdim=True).clamp(1, cos_theta.shape[1])
        new_margin = m0 + m1 * hard_sum / hard_count
    final_gt = torch.where(
        gt > 0, gt * torch.cos(new_margin) - sin_theta * torch.sin(new_margin), gt
    )
    reweighted = torch.where(cos_theta > cos_theta_m, t * cos_theta + a, cos_theta)
    return torch.where(is_target, final_gt, reweighted) * scale


def opensphere_d_theta(cos_theta: Tensor, labels: Tensor, kind: str, m: float) -> Tensor:
    """OpenSphere's ``get_d_theta`` (``model/head/spherefacer.py``), without gradient: θ from
    ``cos θ`` clamped to ``±(1 - 1e-5)``, the label's column multiplied by ``m``; ``"v0"``:
    ``(-1)^k cos(mθ) - 2k - cos θ``; ``"v1"``: ``cos(clamp(mθ, 1e-5, 3.14159)) - cos θ``;
    ``"v2"``: ``cos(mθ/m) - cos θ`` (so ``cos(θ_j/m)`` off the label)."""
    with torch.no_grad():
        m_theta = torch.acos(cos_theta.clamp(-1.0 + 1e-5, 1.0 - 1e-5))
        is_target = F.one_hot(labels, cos_theta.shape[1]).bool()
        m_theta = torch.where(is_target, m_theta * m, m_theta)  # their scatter_(..., "multiply")
        if kind == "v0":
            k = (m_theta / math.pi).floor()
            sign = -2 * torch.remainder(k, 2) + 1
            return sign * torch.cos(m_theta) - 2.0 * k - cos_theta
        if kind == "v1":
            return torch.cos(m_theta.clamp(1e-5, 3.14159)) - cos_theta
        return torch.cos(m_theta / m) - cos_theta


def sphereface_r_loss_weight(variant: str) -> float:
    """Their constructors' default ``lw``: 50 for ``SphereFaceR_H`` and ``_S``, 1 for ``_N``."""
    return 1.0 if variant == "N" else 50.0


def sphereface_r_factor(variant: str, s: float = 30.0) -> float:
    """The constant their loss carries over the cross-entropy at the default ``lw``: ``lw/s``
    (``_H``, ``_S``; 50/s) or ``lw`` (``_N``; 1)."""
    weight = sphereface_r_loss_weight(variant)
    return weight if variant == "N" else weight / s


def sphereface_r_loss(
    x: Tensor,
    weight: Tensor,
    labels: Tensor,
    *,
    variant: str = "H",
    kind: str = "v0",
    s: float = 30.0,
    m: float = 1.5,
    lw: float | None = None,
    t: float = 0.01,
) -> Tensor:
    """OpenSphere ``SphereFaceR_H`` / ``_N`` / ``_S`` ``forward`` (``steps`` empty, so ``m``
    fixed; ``_N``'s constructor as written raises a NameError, its forward is restated), with
    their loss weight ``lw`` defaulting as their constructors do (50 for ``_H`` and ``_S``, 1 for
    ``_N``), on
    unit-norm centers ``weight`` (``Tensor[C, D]``; theirs normalizes its ``(D, C)`` weight in
    place first): ``cos θ = x·w/‖x‖``, logits ``s·(cos θ + Δ)`` (H) or ``‖x‖·(cos θ + Δ)`` (N, S);
    loss ``lw·CE/s`` (H), ``lw·CE`` (N), ``lw·CE/s + mean(t·|‖x‖ - s|)`` (S)."""
    if lw is None:
        lw = sphereface_r_loss_weight(variant)
    magnitude = torch.norm(x, p=2, dim=1, keepdim=True)  # (N, 1)
    cos_theta = x @ weight.t() / magnitude
    d_theta = opensphere_d_theta(cos_theta, labels, kind, m)
    scale = s if variant == "H" else magnitude
    ce = F.cross_entropy(scale * (cos_theta + d_theta), labels)
    if variant == "H":
        return lw * ce / s
    if variant == "N":
        return lw * ce
    return lw * ce / s + (t * torch.abs(magnitude - s)).mean()


def sphereface_plus_loss(
    x: Tensor, weight: Tensor, labels: Tensor, *, s: float = 30.0, m: float = 1.5, lam: float = 1.0
) -> Tensor:
    """OpenSphere ``SphereFacePlus.forward`` on unit-norm centers: the ``"v0"`` logits
    ``s·(cos θ + Δ)`` on normalized ``x``, plus ``λ·`` the mean over pairs of the classes present
    in the batch (``torch.unique``) of ``arccos(clamp(w_a·w_b, ±(1 - 1e-5)))^-2``."""
    cos_theta = F.normalize(x, dim=1) @ weight.t()
    d_theta = opensphere_d_theta(cos_theta, labels, "v0", m)
    logits = s * (cos_theta + d_theta)
    sel_w = weight[torch.unique(labels)].t()  # (D, U), their column layout
    gram = torch.acos((sel_w.t() @ sel_w).clamp(-1.0 + 1e-5, 1.0 - 1e-5))
    u = gram.shape[0]
    mhe = torch.sum(torch.triu(torch.pow(gram, -2), diagonal=1)) / (u * (u - 1) * 0.5)
    return F.cross_entropy(logits, labels) + lam * mhe
