"""The Triton kernels' non-target rules beyond the identity and CurricularFace's (issue 25):
MV-Softmax's and NPCFace's ``"mv"``, ArcNegFace's ``"gaussian"``, circle loss's ``"circle"`` and
Li-ArcFace's ``"linear_angle"`` (:class:`~marginface.executors.kernel_options.NonTargetRule`).

Each rule's value and derivative entry by entry against its formula restated here in float64
(the detached weights of ArcNegFace and circle loss held constant, as the margins define their
gradients), Li-ArcFace's ``arccos`` (a polynomial in the kernels: ``acos`` is not a Triton
builtin, and libdevice's does not run under the interpreter) on a dense grid and at ``±1``, and the
three launchers over several tiles against autograd on the dense formula. The comparisons of
whole losses against the dense path (loss, ∂x, ∂W, two steps) are the parametrized tests of
``test_triton.py`` and ``test_precision_matrix.py``. Under Triton's interpreter on the CPU
(``conftest.py``); compiled on CUDA.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from types import ModuleType

import pytest
import torch
from torch import Tensor

from ._compare import DEVICE, relative_error

pytest.importorskip("triton")

SIN2_FLOOR = 1e-8
"""``sin²θ`` floor of Li-ArcFace's derivative (marginface.margins._angles.SIN2_FLOOR)."""

A, B = 1.12, 0.12  # MV-Softmax adaptive, t = 0.12: a·c + b = (t + 1)c + t
ALPHA, SIGMA = 1.2, 2.0  # ArcNegFace's defaults
M = 0.25  # circle loss's relaxation

Formula = Callable[[Tensor, Tensor], Tensor]


def mv(cos: Tensor, threshold: Tensor) -> Tensor:
    """``a·c + b`` where ``c > τ`` (strictly), else ``c``."""
    return torch.where(cos > threshold[:, None], A * cos + B, cos)


def gaussian(cos: Tensor, threshold: Tensor) -> Tensor:
    """``w·c + w - 1``, ``w = α·exp(-(c - f)²/σ)`` without gradient."""
    weight = ALPHA * torch.exp(-((cos.detach() - threshold[:, None]) ** 2) / SIGMA)
    return weight * cos + weight - 1.0


def circle(cos: Tensor, threshold: Tensor) -> Tensor:
    """``[c + m]_+ (c - m)``, the bracket without gradient."""
    return torch.clamp_min(cos.detach() + M, 0.0) * (cos - M)


def linear_angle(cos: Tensor, threshold: Tensor) -> Tensor:
    """``(π - 2θ)/π``, ``θ = arccos c`` (``c`` clamped to [-1, 1] for the value)."""
    return (math.pi - 2.0 * torch.arccos(cos.clamp(-1.0, 1.0))) / math.pi


def linear_angle_slope(cos: Tensor) -> Tensor:
    """``2/(π sin θ)`` with ``sin²θ = 1 - c²`` floored at :data:`SIN2_FLOOR`."""
    return (2.0 / math.pi) / torch.sqrt((1.0 - cos * cos).clamp_min(SIN2_FLOOR))


FORMULAS: dict[str, Formula] = {
    "mv": mv,
    "gaussian": gaussian,
    "circle": circle,
    "linear_angle": linear_angle,
}


def make_rule(kernels: ModuleType, kind: str, threshold: Tensor):
    """The kernels' rule ``kind`` with this file's parameters, built as the executor builds it
    (``triton_dispatch.kernel_rule`` from the margins' ``nontarget_kernel_parameters`` form)."""
    from marginface.executors.triton_dispatch import kernel_rule

    t = {"mv": [A, B], "gaussian": [ALPHA, SIGMA], "circle": [M]}.get(kind, [])
    parameters = {"threshold": threshold.unsqueeze(1), "t": torch.tensor(t, dtype=torch.float64)}
    return kernel_rule(kind, parameters, threshold.shape[0], threshold.device)


def reference(kind: str, cos: Tensor, threshold: Tensor) -> tuple[Tensor, Tensor]:
    """``(g(c), g'(c))`` in float64 by autograd on the restated formula (Li-ArcFace's
    derivative written out: its ``sin θ`` floor)."""
    cos = cos.double().requires_grad_(True)
    value = FORMULAS[kind](cos, threshold.double())
    (slope,) = torch.autograd.grad(value.sum(), cos)
    if kind == "linear_angle":
        slope = linear_angle_slope(cos.detach())
    return value.detach(), slope


def grid_case() -> tuple[Tensor, Tensor]:
    """Cosines ``[8, 64]`` float32 over [-1, 1] with the edges (±1, one float32 step inside
    them, one step beyond 1) and per-row thresholds, one equal to a cosine of its row."""
    generator = torch.Generator().manual_seed(3)
    cos = torch.rand(8, 64, generator=generator) * 2.0 - 1.0
    one = torch.tensor(1.0)
    edges = torch.stack(
        [
            one,
            -one,
            torch.nextafter(one, torch.tensor(0.0)),
            torch.nextafter(-one, torch.tensor(0.0)),
            torch.nextafter(one, torch.tensor(2.0)),  # a GEMM's rounding can leave [-1, 1]
            torch.tensor(0.0),
        ]
    )
    cos[0, : edges.numel()] = edges
    threshold = torch.rand(8, generator=generator) - 0.3
    threshold[1] = cos[1, 7]  # exactly at the threshold: not hard (strict >)
    return cos.to(DEVICE), threshold.to(DEVICE)


@pytest.mark.parametrize("kind", sorted(FORMULAS))
def test_each_rule_matches_its_formula_entry_by_entry(kernels: ModuleType, kind: str) -> None:
    from ._triton_rule_probe import evaluate_rule

    cos, threshold = grid_case()
    value, slope = evaluate_rule(cos, make_rule(kernels, kind, threshold))
    expected_value, expected_slope = reference(kind, cos, threshold)
    assert torch.isfinite(value).all() and torch.isfinite(slope).all()
    assert (value.double() - expected_value).abs().max() <= 2e-6, kind
    assert relative_error(slope, expected_slope) <= 1e-6, kind
    if kind == "mv":  # the entry at the threshold is not mis-classified: g = c, g' = 1
        assert value[1, 7] == cos[1, 7] and slope[1, 7] == 1.0


def test_linear_angle_arccos_is_float32_accurate_on_a_dense_grid(kernels: ModuleType) -> None:
    """The kernels' ``arccos`` (Abramowitz & Stegun 4.4.46 in float32) within 1e-6 rad of the
    float64 ``arccos`` on 4096 cosines over [-1, 1] (endpoints included), and ``θ(±1)`` = 0, π
    to float32 rounding; the derivative at ``±1`` is the floored ``2/(π·1e-4)``."""
    from ._triton_rule_probe import evaluate_rule

    cos = torch.linspace(-1.0, 1.0, 64 * 64, dtype=torch.float64).float().view(64, 64)
    cos = cos.to(DEVICE)
    value, slope = evaluate_rule(cos, make_rule(kernels, "linear_angle", cos[:, 0]))
    angle = (1.0 - value.double()) * (math.pi / 2.0)  # θ = (1 - g)π/2
    error = (angle - torch.arccos(cos.double())).abs().max()
    assert error <= 1e-6, float(error)
    assert abs(float(angle[0, 0]) - math.pi) <= 1e-6 and abs(float(angle[-1, -1])) <= 1e-6
    floor = (2.0 / math.pi) / math.sqrt(SIN2_FLOOR)
    assert float(slope[0, 0]) == pytest.approx(floor, rel=1e-6)
    assert float(slope[-1, -1]) == pytest.approx(floor, rel=1e-6)


@pytest.mark.parametrize("kind", sorted(FORMULAS))
def test_launchers_over_several_tiles_match_autograd(kernels: ModuleType, kind: str) -> None:
    """The three launchers with 16-wide tiles over 2 row blocks, 2 chunks of 2 class tiles and
    3 blocks of D, K = 2 sub-centers, against autograd on the dense formula: the non-target
    log-sum-exp, ``∂/∂x̂``, ``∂/∂s`` (per-row scales) and ``∂/∂W`` at fixed ``r``."""
    n, dim, classes, k, chunk = 20, 40, 37, 2, 20
    blocks = kernels.Blocks(n=16, c=16, d=16)
    generator = torch.Generator().manual_seed(2)
    x_hat = torch.nn.functional.normalize(torch.randn(n, dim, generator=generator), dim=1)
    weight = torch.randn(classes * k, dim, generator=generator)
    inv_norms = 1.0 / weight.norm(dim=1)
    labels = torch.randint(0, classes, (n,), generator=generator)
    scale = 10.0 + 20.0 * torch.rand(n, generator=generator)
    threshold = 0.3 * torch.rand(n, generator=generator) - 0.1
    grad = torch.rand(n, generator=generator)
    x_hat, weight, inv_norms, labels, scale, threshold, grad = (
        v.to(DEVICE) for v in (x_hat, weight, inv_norms, labels, scale, threshold, grad)
    )
    rule = make_rule(kernels, kind, threshold)

    x_leaf = x_hat.clone().requires_grad_(True)
    w_leaf = weight.clone().requires_grad_(True)
    s_leaf = scale.clone().requires_grad_(True)
    cos = (x_leaf @ (w_leaf * inv_norms.unsqueeze(1)).t()).view(n, classes, k).amax(dim=2)
    logits = FORMULAS[kind](cos, threshold) * s_leaf.unsqueeze(1)  # (N, C)
    logits = logits.masked_fill(torch.nn.functional.one_hot(labels, classes).bool(), -torch.inf)
    lse = torch.logsumexp(logits, dim=1)
    (lse * grad).sum().backward()

    common = {"sub_centers": k, "blocks": blocks}
    row_max, exp_sum = kernels.nontarget_statistics(
        x_hat, weight, inv_norms, labels, scale, rule, chunk_size=chunk, **common
    )
    assert relative_error(row_max + torch.log(exp_sum), lse) <= 1e-6
    detached = lse.detach()
    grad_x, grad_scale = kernels.embedding_gradient(
        x_hat, weight, inv_norms, labels, scale, rule, detached, grad, chunk_size=chunk, **common
    )
    assert relative_error(grad_x, x_leaf.grad) <= 1e-5
    assert relative_error(grad_scale, s_leaf.grad) <= 1e-5
    parts = []
    for start in range(0, classes, chunk):
        part = kernels.weight_gradient(
            x_hat, weight, inv_norms, labels, scale, rule, detached, grad,
            start=start, stop=min(start + chunk, classes), **common,
        )  # fmt: skip
        parts.append(part)
    assert relative_error(torch.cat(parts), w_leaf.grad) <= 1e-5


def test_rule_fields_are_checked(kernels: ModuleType) -> None:
    """A rule without the tensors its kind reads, or of an unknown kind, is a ValueError
    naming what is missing or the kind."""
    threshold = torch.zeros(3, device=DEVICE)
    constants = torch.zeros(2, device=DEVICE)
    with pytest.raises(ValueError, match=r"kind 'mv' needs threshold"):
        kernels.NonTargetRule(kind="mv", constants=constants)
    with pytest.raises(ValueError, match=r"kind 'gaussian' needs constants"):
        kernels.NonTargetRule(kind="gaussian", threshold=threshold)
    with pytest.raises(ValueError, match=r"kind 'curricular' needs t"):
        kernels.NonTargetRule(kind="curricular", threshold=threshold)
    with pytest.raises(ValueError, match=r"NonTargetRule.kind must be one of .*'acos'"):
        kernels.NonTargetRule(kind="acos")
    assert kernels.NonTargetRule(kind="linear_angle").name == "linear_angle"
    assert kernels.NonTargetRule(threshold=threshold, t=threshold).name == "curricular"
