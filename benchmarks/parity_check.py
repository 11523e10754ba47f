"""How closely marginface reproduces each reference implementation (the table of docs/parity.md).

For every row: the reference's forward pass, re-stated here as a formula from what its published
code computes (no third-party code is copied: each is written from the formula, with the
reference's branch conditions, clamps, gradient semantics and state updates), the marginface call
that should reproduce it, and the largest absolute difference in float64 with the class centers
copied in: in the loss, and in the gradients with respect to the embeddings and the class centers,
over a few training steps (so the stateful losses' buffers evolve), on the dense and the chunked
executor (3 class chunks).

The inputs are built to reach every branch: target cosines from 0.9999 down to -0.97 (beyond
θ + m = π for m = 0.5), a non-target class whose center nearly coincides with a target's
(|cos| > 0.999, where AdaFace's clamp acts), and feature norms from 2 to 130 (MagFace's
[10, 110], AdaFace's clip at 100).

    PYTHONPATH=src python benchmarks/parity_check.py              # the table's numbers
    PYTHONPATH=src python benchmarks/parity_check.py --steps 5 --seeds 0 1 2

tests/margins/test_parity.py runs the same cases with a tolerance of 1e-10.
"""

from __future__ import annotations

import argparse
import math
import platform
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

import marginface

N, C, D = 10, 12, 8
"""Batch, classes, embedding width of every case."""

TARGET_COSINES = (0.9999, 0.99, 0.7, 0.3, 0.02, -0.3, -0.7, -0.9, -0.97, 0.5)
"""cos θ_y of the rows (row 0 also has a non-target at |cos| > 0.999)."""

NORMS = (2.0, 8.0, 15.0, 30.0, 60.0, 100.0, 130.0, 20.0, 45.0, 80.0)
LABELS = (0, 2, 3, 4, 5, 6, 7, 8, 9, 0)


# ----------------------------------------------------------------------------- inputs
def make_centers(seed: int) -> Tensor:
    """Class centers ``(C, D)`` float64 of varied norms; class 1 nearly coincides with class 0."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(C, D, generator=g, dtype=torch.float64)
    w[1] = w[0] + 1e-3 * torch.randn(D, generator=g, dtype=torch.float64)
    return w * (0.5 + 1.5 * torch.rand(C, 1, generator=g, dtype=torch.float64))


def make_embeddings(centers: Tensor, seed: int) -> tuple[Tensor, Tensor]:
    """Embeddings ``(N, D)`` with the target cosines :data:`TARGET_COSINES` and norms :data:`NORMS`
    (jittered per seed), and their labels ``(N,)``."""
    g = torch.Generator().manual_seed(10_000 + seed)
    labels = torch.tensor(LABELS)
    unit = F.normalize(centers[labels], dim=1)  # (N, D)
    noise = torch.randn(N, D, generator=g, dtype=torch.float64)
    noise = F.normalize(noise - (noise * unit).sum(1, keepdim=True) * unit, dim=1)  # ⟂ unit
    t = torch.tensor(TARGET_COSINES, dtype=torch.float64)
    t = t - 1e-5 * torch.rand(N, generator=g, dtype=torch.float64) * t.sign()
    norms = torch.tensor(NORMS, dtype=torch.float64)
    norms = norms * (1.0 + 0.1 * torch.rand(N, generator=g, dtype=torch.float64))
    x = (t.unsqueeze(1) * unit + torch.sqrt(1.0 - t * t).unsqueeze(1) * noise) * norms.unsqueeze(1)
    return x, labels


# ------------------------------------------------------------------ reference formulas
def _unit_rows(a: Tensor) -> Tensor:
    return a / a.norm(dim=1, keepdim=True)


def _cosines(x: Tensor, w: Tensor) -> Tensor:
    """``(N, C)`` cosines, each side divided by its norm (the references' ``l2_norm``)."""
    return _unit_rows(x) @ _unit_rows(w).t()


def _with_target(cos: Tensor, labels: Tensor, target: Tensor) -> Tensor:
    """``cos`` with the label's column replaced by ``target[N]`` (an overwrite)."""
    is_target = F.one_hot(labels, cos.shape[1]).bool()
    return torch.where(is_target, target.unsqueeze(1), cos)


def _target(cos: Tensor, labels: Tensor) -> Tensor:
    return cos.gather(1, labels.unsqueeze(1)).squeeze(1)


def _arc_fallback(ct: Tensor, m: float | Tensor) -> Tensor:
    """insightface-style ArcFace target: ``cos(θ+m)`` where ``cos θ > cos(π-m)``, else
    ``cos θ - sin(π-m)·m``; ``cos(θ+m)`` as ``c·cos m - √(1-c²)·sin m`` (autograd through √)."""
    shifted = ct * torch.cos(torch.as_tensor(m, dtype=ct.dtype)) - torch.sqrt(
        1.0 - ct * ct
    ) * torch.sin(torch.as_tensor(m, dtype=ct.dtype))
    pi_minus = math.pi - torch.as_tensor(m, dtype=ct.dtype)
    return torch.where(ct > torch.cos(pi_minus), shifted, ct - torch.sin(pi_minus) * m)


def ref_insightface_arcface_until_2022(x, w, labels, state, s=64.0, m=0.5):
    """insightface arcface_torch ``ArcFace`` before commit 657ae30: logits clamped to [-1, 1]
    (PartialFC), the fallback above, exact gradient, plain cross-entropy."""
    cos = _cosines(x, w).clamp(-1.0, 1.0)
    target = _arc_fallback(_target(cos, labels), m)
    return F.cross_entropy(s * _with_target(cos, labels, target), labels)


def ref_insightface_arcface_since_2022(x, w, labels, state, s=64.0, m=0.5):
    """insightface arcface_torch ``ArcFace`` / ``CombinedMarginLoss(s, 1, m, 0)`` since 657ae30:
    every logit goes through arccos, the target's angle gets ``+m``, then cos, all in place under
    ``no_grad`` (no guard): the gradient is that of ``s·cos θ`` (straight through)."""
    cos = _cosines(x, w).clamp(-1.0, 1.0)
    with torch.no_grad():
        angles = torch.arccos(cos) + m * F.one_hot(labels, cos.shape[1]).to(cos.dtype)
        change = torch.cos(angles) - cos  # what the in-place ops do to the values
    return F.cross_entropy(s * (cos + change), labels)


def ref_cosface(x, w, labels, state, s=64.0, m=0.4):
    """CosFace: ``s·(cos θ_y - m)`` at the target (insightface ``CosFace`` / ``CombinedMarginLoss``
    with m3 > 0, which ignores m2; pytorch-metric-learning ``CosFaceLoss``)."""
    cos = _cosines(x, w).clamp(-1.0, 1.0)
    return F.cross_entropy(s * _with_target(cos, labels, _target(cos, labels) - m), labels)


def ref_curricularface(x, w, labels, state, s=64.0, m=0.5):
    """HuangYG123/CurricularFace ``CurricularFace``: t ← 0.01·mean(cos θ_y) + 0.99·t (before use,
    no gradient); non-targets with ``cos θ_j > cos(θ_y + m)`` (unguarded) become
    ``cos θ_j·(t + cos θ_j)``; the target takes the insightface fallback."""
    cos = _cosines(x, w).clamp(-1.0, 1.0)
    ct = _target(cos, labels)
    shifted = ct * math.cos(m) - torch.sqrt(1.0 - ct * ct) * math.sin(m)
    with torch.no_grad():
        state["t"] = 0.01 * ct.mean() + 0.99 * state.get("t", torch.zeros((), dtype=cos.dtype))
    t = state["t"]
    hard = cos > shifted.detach().unsqueeze(1)
    negatives = torch.where(hard, cos * (t + cos), cos)
    target = torch.where(ct > math.cos(math.pi - m), shifted, ct - math.sin(math.pi - m) * m)
    return F.cross_entropy(s * _with_target(negatives, labels, target), labels)


def ref_magface(x, w, labels, state, s=64.0, l_a=10.0, u_a=110.0, l_m=0.45, u_m=0.8, lam=35.0):
    """IrvingMeng/MagFace ``MagLinear`` (``easy_margin=True``, its default) + ``MagLoss``, total
    ``loss_id + λ_g·loss_g`` as in its trainer: ``a = clamp(‖x‖, l_a, u_a)`` (with gradient),
    ``m(a)`` linear, target ``cos(θ + m(a))`` where ``cos θ > 0`` else ``cos θ``,
    ``g(a) = a/u_a² + 1/a`` averaged over the batch."""
    a = x.norm(dim=1).clamp(l_a, u_a)  # (N,)
    margin = (u_m - l_m) / (u_a - l_a) * (a - l_a) + l_m
    cos = _cosines(x, w).clamp(-1.0, 1.0)
    ct = _target(cos, labels)
    shifted = ct * torch.cos(margin) - torch.sqrt(1.0 - ct * ct) * torch.sin(margin)
    target = torch.where(ct > 0, shifted, ct)
    loss_id = F.cross_entropy(s * _with_target(cos, labels, target), labels)
    loss_g = (a / u_a**2 + 1.0 / a).mean()
    return loss_id + lam * loss_g


def ref_adaface(x, w, labels, state, s=64.0, m=0.4, h=0.333, alpha=0.01, eps=1e-3):
    """mk-minchul/AdaFace ``AdaFace``: the backbone hands over ``x/‖x‖`` and ``‖x‖``; every
    cosine is clamped to ``[-1 + eps, 1 - eps]``; the norm, clipped to [0.001, 100] and detached,
    updates μ and σ (EMA with weight α on the batch's mean and unbiased std, before use; they start
    at 20 and 100); ``ẑ = clip(h·(‖x‖ - μ)/(σ + eps), -1, 1)``; every angle is clipped to
    ``[eps, π - eps]`` after the target's ``-m·ẑ``; the target then loses ``m + m·ẑ``."""
    norms = x.norm(dim=1, keepdim=True)  # (N, 1)
    cos = ((x / norms) @ _unit_rows(w).t()).clamp(-1.0 + eps, 1.0 - eps)
    safe = norms.clamp(0.001, 100.0).detach()
    with torch.no_grad():
        mean_0 = state.get("mean", torch.tensor(20.0, dtype=x.dtype))
        std_0 = state.get("std", torch.tensor(100.0, dtype=x.dtype))
        state["mean"] = alpha * safe.mean() + (1.0 - alpha) * mean_0
        state["std"] = alpha * safe.std() + (1.0 - alpha) * std_0
    quality = ((safe - state["mean"]) / (state["std"] + eps) * h).clamp(-1.0, 1.0)  # (N, 1)
    one_hot = F.one_hot(labels, cos.shape[1]).to(cos.dtype)
    angles = (torch.arccos(cos) - one_hot * m * quality).clamp(eps, math.pi - eps)
    logits = torch.cos(angles) - one_hot * (m + m * quality)
    return F.cross_entropy(s * logits, labels)


def ref_elastic_arc(x, w, labels, state, s=64.0, m=0.5, std=0.05):
    """fdbtrs/ElasticFace ``ElasticArcFace`` (plus=False): ``m_i ~ N(m, σ)`` drawn with
    ``torch.normal(size=(N, 1))`` from the global generator; the target's angle gets ``+m_i``
    (arccos and cos on every logit, with gradient, no guard)."""
    cos = _cosines(x, w).clamp(-1.0, 1.0)
    margins = torch.normal(mean=m, std=std, size=(x.shape[0], 1))
    one_hot = F.one_hot(labels, cos.shape[1]).to(cos.dtype)
    return F.cross_entropy(s * torch.cos(torch.arccos(cos) + one_hot * margins), labels)


def ref_elastic_cos(x, w, labels, state, s=64.0, m=0.35, std=0.05):
    """fdbtrs/ElasticFace ``ElasticCosFace`` (plus=False): the target loses ``m_i ~ N(m, σ)``."""
    cos = _cosines(x, w).clamp(-1.0, 1.0)
    margins = torch.normal(mean=m, std=std, size=(x.shape[0], 1))
    one_hot = F.one_hot(labels, cos.shape[1]).to(cos.dtype)
    return F.cross_entropy(s * (cos - one_hot * margins), labels)


def ref_pml_arcface(x, w, labels, state, s=64.0, degrees=28.6):
    """pytorch-metric-learning ``ArcFaceLoss`` (margin in degrees): θ = arccos(clamp(cos θ_y));
    target ``cos(θ + m)`` where ``θ <= π - m``, else ``cos θ - m·sin m``; added to the cosine
    matrix as ``cos + mask·(target - cos θ_y)``."""
    m = math.radians(degrees)
    cos = _cosines(x, w)
    ct = _target(cos, labels)
    theta = torch.arccos(ct.clamp(-1.0, 1.0))
    target = torch.where(
        theta <= math.pi - m, torch.cos(theta + m), torch.cos(theta) - m * math.sin(m)
    )
    mask = F.one_hot(labels, cos.shape[1]).to(cos.dtype)
    return F.cross_entropy(s * (cos + mask * (target - ct).unsqueeze(1)), labels)


def ref_pml_cosface(x, w, labels, state, s=64.0, m=0.35):
    """pytorch-metric-learning ``CosFaceLoss``: ``cos + mask·(-m)`` (no clamp)."""
    cos = _cosines(x, w)
    mask = F.one_hot(labels, cos.shape[1]).to(cos.dtype)
    return F.cross_entropy(s * (cos - m * mask), labels)


def ref_sphereface(x, w, labels, state, m=4, lambda_max=1500.0, lambda_min=5.0, gamma=0.1):
    """clcarwin/sphereface_pytorch ``AngleLinear(m=4)`` + ``AngleLoss(gamma=0)``: logits scaled
    by ‖x‖; the target becomes ``‖x‖·(cos θ + (ψ(θ) - cos θ)/(1 + λ))`` with
    ``ψ = (-1)^k·T_4(cos θ) - 2k``, ``k = floor(4θ/3.14159265)`` (no gradient through k) and
    ``λ = max(λ_min, λ_max/(1 + 0.1·it))``, ``it`` counting calls from 1."""
    x_norm = x.norm(dim=1, keepdim=True)  # (N, 1)
    cos = (x @ _unit_rows(w).t() / x_norm).clamp(-1.0, 1.0)
    chebyshev = 8.0 * cos**4 - 8.0 * cos**2 + 1.0
    with torch.no_grad():
        k = torch.floor(m * torch.arccos(cos) / 3.14159265)
    psi = (-1.0) ** k * chebyshev - 2.0 * k
    state["it"] = state.get("it", 0) + 1
    lam = max(lambda_min, lambda_max / (1.0 + gamma * state["it"]))
    one_hot = F.one_hot(labels, cos.shape[1]).to(cos.dtype)
    return F.cross_entropy(x_norm * (cos + one_hot * (psi - cos) / (1.0 + lam)), labels)


# ----------------------------------------------------------------------------- the cases
@dataclass(frozen=True)
class Case:
    """One row of docs/parity.md."""

    name: str
    reference: Callable[..., Tensor]
    call: str
    """The marginface call, as written in the table (``C, D`` = classes, embedding width)."""
    options: dict = field(default_factory=dict)
    loss: str = ""
    """Registered loss name for :func:`marginface.create_loss`."""
    exact: bool = True
    """Whether marginface reproduces the reference (False: a documented, measured difference)."""
    reseed: bool = False
    """Seed torch's global generator before each forward (the random margins)."""

    def build(self, impl: str) -> marginface.MarginSoftmaxLoss:
        extra = {"chunk_size": 5} if impl == "chunked" else {}
        return marginface.create_loss(
            self.loss, num_classes=C, embedding_dim=D, impl=impl, dtype=torch.float64,
            **self.options, **extra,
        )  # fmt: skip


CASES: tuple[Case, ...] = (
    Case(
        "insightface ArcFace, until Dec 2022",
        ref_insightface_arcface_until_2022,
        'ArcFaceLoss(C, D, margin=0.5, scale=64, policy="linear")',
        {"margin": 0.5, "scale": 64.0, "policy": "linear"},
        "arcface",
    ),
    Case(
        "insightface ArcFace, since Dec 2022",
        ref_insightface_arcface_since_2022,
        'ArcFaceLoss(C, D, margin=0.5, scale=64, policy="none", gradient="straight_through")',
        {"margin": 0.5, "scale": 64.0, "policy": "none", "gradient": "straight_through"},
        "arcface",
    ),
    Case(
        "insightface CosFace / CombinedMarginLoss(64, 1, 0, 0.4)",
        ref_cosface,
        "CosFaceLoss(C, D, margin=0.4, scale=64)",
        {"margin": 0.4, "scale": 64.0},
        "cosface",
    ),
    Case(
        "CurricularFace (authors)",
        ref_curricularface,
        'CurricularFaceLoss(C, D, margin=0.5, scale=64, momentum=0.99, policy="linear")',
        {"margin": 0.5, "scale": 64.0, "momentum": 0.99, "policy": "linear"},
        "curricularface",
    ),
    Case(
        "MagFace (authors, MagLinear + MagLoss)",
        ref_magface,
        'MagFaceLoss(C, D, scale=64, regularizer_weight=35, policy="easy")',
        {"scale": 64.0, "regularizer_weight": 35.0, "policy": "easy"},
        "magface",
    ),
    Case(
        "AdaFace (authors)",
        ref_adaface,
        "AdaFaceLoss(C, D, margin=0.4, scale=64, h=0.333, momentum=0.01, cosine_clamp=1e-3)",
        {"margin": 0.4, "scale": 64.0, "h": 0.333, "momentum": 0.01, "cosine_clamp": 1e-3},
        "adaface",
    ),
    Case(
        "AdaFace (authors) vs marginface's default (no clamp)",
        ref_adaface,
        "AdaFaceLoss(C, D, margin=0.4, scale=64, h=0.333, momentum=0.01)",
        {"margin": 0.4, "scale": 64.0, "h": 0.333, "momentum": 0.01},
        "adaface",
        exact=False,
    ),
    Case(
        "ElasticFace-Arc (authors, plus=False)",
        ref_elastic_arc,
        'ElasticFaceLoss(C, D, kind="arc", margin=0.5, std=0.05, policy="none")',
        {"kind": "arc", "margin": 0.5, "std": 0.05, "policy": "none"},
        "elasticface",
        reseed=True,
    ),
    Case(
        "ElasticFace-Cos (authors, plus=False)",
        ref_elastic_cos,
        'ElasticFaceLoss(C, D, kind="cos", margin=0.35, std=0.05)',
        {"kind": "cos", "margin": 0.35, "std": 0.05},
        "elasticface",
        reseed=True,
    ),
    Case(
        "pytorch-metric-learning ArcFaceLoss",
        ref_pml_arcface,
        'ArcFaceLoss(C, D, margin=math.radians(28.6), scale=64, policy="linear")',
        {"margin": math.radians(28.6), "scale": 64.0, "policy": "linear"},
        "arcface",
    ),
    Case(
        "pytorch-metric-learning CosFaceLoss",
        ref_pml_cosface,
        "CosFaceLoss(C, D, margin=0.35, scale=64)",
        {"margin": 0.35, "scale": 64.0},
        "cosface",
    ),
    Case(
        "sphereface_pytorch AngleLinear + AngleLoss",
        ref_sphereface,
        "SphereFaceLoss(C, D, margin=4, scale=None, lambda_base=1500, lambda_gamma=0.1, "
        "lambda_power=1, lambda_min=5)",
        {
            "margin": 4,
            "scale": None,
            "lambda_base": 1500.0,
            "lambda_gamma": 0.1,
            "lambda_power": 1.0,
            "lambda_min": 5.0,
        },
        "sphereface",
    ),
)


def measure(case: Case, impl: str, steps: int = 3, seed: int = 0) -> dict[str, float]:
    """Max |difference| between marginface and the reference over ``steps`` training steps:
    ``{"loss": ..., "grad_x": ..., "grad_w": ...}`` (float64, same centers, same inputs)."""
    centers = make_centers(seed)
    loss_fn = case.build(impl).train()
    with torch.no_grad():
        loss_fn.weight.copy_(centers)
    state: dict = {}
    worst = {"loss": 0.0, "grad_x": 0.0, "grad_w": 0.0}
    for step in range(steps):
        x, labels = make_embeddings(centers, seed * 100 + step)
        found = []
        for side in ("marginface", "reference"):
            if case.reseed:
                torch.manual_seed(1_000 + step)
            xs = x.clone().requires_grad_(True)
            if side == "marginface":
                ws = loss_fn.weight
                loss = loss_fn(xs, labels)
            else:
                ws = centers.clone().requires_grad_(True)
                loss = case.reference(xs, ws, labels, state)
            found.append((loss.detach(), *torch.autograd.grad(loss, (xs, ws))))
        (loss_a, gx_a, gw_a), (loss_b, gx_b, gw_b) = found
        worst["loss"] = max(worst["loss"], float((loss_a - loss_b).abs()))
        worst["grad_x"] = max(worst["grad_x"], float((gx_a - gx_b).abs().max()))
        worst["grad_w"] = max(worst["grad_w"], float((gw_a - gw_b).abs().max()))
    return worst


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=3, help="training steps per case")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args(argv)
    print(f"# torch {torch.__version__}, {platform.processor() or platform.machine()}, float64")
    print(f"# N={N}, C={C}, D={D}, steps={args.steps}, seeds={args.seeds}")
    print("| reference | exact | dense: loss / ∂x / ∂W | chunked: loss / ∂x / ∂W |")
    print("|---|---|---|---|")
    for case in CASES:
        cells = []
        for impl in ("dense", "chunked"):
            worst = {"loss": 0.0, "grad_x": 0.0, "grad_w": 0.0}
            for seed in args.seeds:
                found = measure(case, impl, args.steps, seed)
                worst = {key: max(worst[key], found[key]) for key in worst}
            cells.append(" / ".join(f"{worst[key]:.1e}" for key in ("loss", "grad_x", "grad_w")))
        print(f"| {case.name} | {'yes' if case.exact else 'no'} | {cells[0]} | {cells[1]} |")


if __name__ == "__main__":
    main()
