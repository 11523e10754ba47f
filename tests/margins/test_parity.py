"""docs/parity.md's rows: marginface against each reference implementation, in float64.

The reference formulas live in benchmarks/parity_check.py (each re-stated from what the
reference's code computes; nothing copied), which also prints the table's measured differences.
Here every "reproduces exactly" row is pinned at 1e-10 (loss, ∂/∂embeddings, ∂/∂centers) on the
dense and the chunked executor, and every deliberate difference is shown.
"""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import marginface
from marginface.margins import (
    AdaFaceMargin,
    ArcFaceMargin,
    CurricularFaceMargin,
    ElasticFaceMargin,
    MagFaceMargin,
)
from marginface.margins.arcface import additive_angular_margin
from marginface.margins.combined import combined_margin
from marginface.margins.elasticface import assign_elastic_plus

REPO = Path(__file__).resolve().parents[2]
TOLERANCE = 1e-10


def _load_parity_check():
    path = REPO / "benchmarks" / "parity_check.py"
    spec = importlib.util.spec_from_file_location("parity_check_under_test", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks itself up there
    spec.loader.exec_module(module)
    return module


PARITY = _load_parity_check()
EXACT = [case for case in PARITY.CASES if case.exact]


@pytest.mark.parametrize("impl", ["dense", "chunked"])
@pytest.mark.parametrize("case", EXACT, ids=[case.name for case in EXACT])
def test_reproduces_the_reference(case, impl) -> None:
    worst = PARITY.measure(case, impl, steps=2, seed=0)
    assert worst["loss"] < TOLERANCE, worst
    assert worst["grad_x"] < TOLERANCE, worst
    assert worst["grad_w"] < TOLERANCE, worst


def test_the_inputs_reach_every_branch() -> None:
    """The parity inputs cover θ + m > π, |cos| > 0.999 on a target and on a non-target, and
    norms outside MagFace's [10, 110] and above AdaFace's clip at 100."""
    centers = PARITY.make_centers(0)
    x, labels = PARITY.make_embeddings(centers, 0)
    cos = F.normalize(x) @ F.normalize(centers).t()
    target = cos.gather(1, labels.unsqueeze(1)).squeeze(1)
    assert bool((target < math.cos(math.pi - 0.5)).any())  # beyond the ArcFace boundary
    assert bool((target > 0.999).any())
    non_target = cos.scatter(1, labels.unsqueeze(1), 0.0)
    assert bool((non_target.abs() > 0.999).any())
    norms = x.norm(dim=1)
    assert bool((norms < 10).any()) and bool((norms > 110).any())


# ------------------------------------------------------------------ θ = π - m exactly
@pytest.mark.parametrize("m", [0.3, 0.5, 1.2])
def test_boundary_takes_the_fallback(m: float) -> None:
    """At cos θ = cos(π - m) exactly (θ + m = π) the margin is dropped, as in insightface's,
    CurricularFace's and MagFace's ``where(cos θ > cos(π - m), cos(θ + m), cos θ - sin(π-m)·m)``;
    one step above it the margin applies."""
    at = torch.tensor([math.cos(math.pi - m)], dtype=torch.float64)
    above = torch.nextafter(at, torch.tensor(1.0, dtype=torch.float64))
    fallback = at - math.sin(math.pi - m) * m
    shifted = above * math.cos(m) - torch.sqrt(1 - above * above) * math.sin(m)
    assert torch.equal(additive_angular_margin(at, m, "linear"), fallback)
    assert torch.allclose(additive_angular_margin(above, m, "linear"), shifted, atol=1e-15)
    margin = torch.tensor([m], dtype=torch.float64)  # per-sample margins (MagFace, ElasticFace)
    assert torch.equal(additive_angular_margin(at, margin, "linear"), fallback)
    clipped = at.clone().requires_grad_(True)
    value = additive_angular_margin(clipped, m, "clip")
    (gradient,) = torch.autograd.grad(value.sum(), clipped)
    assert value.item() == -1.0 and gradient.item() == 0.0
    # the same comparison reaches every margin built on it
    cosine = torch.tensor([[at.item(), 0.1]], dtype=torch.float64)
    labels = torch.tensor([0])
    expected = 64.0 * fallback.item()
    assert ArcFaceMargin(m)(cosine, labels)[0, 0].item() == pytest.approx(expected, abs=1e-12)
    curricular = CurricularFaceMargin(m).eval()
    assert curricular(cosine, labels)[0, 0].item() == pytest.approx(expected, abs=1e-12)
    mag = MagFaceMargin(lower_margin=m, upper_margin=m, policy="linear")
    norms = torch.tensor([50.0], dtype=torch.float64)
    assert mag(cosine, labels, norms)[0, 0].item() == pytest.approx(expected, abs=1e-12)


def test_boundary_of_the_combined_margin() -> None:
    """``m1·θ + m2 = π`` exactly (m1 = 2, θ = π/2) takes the fallback too."""
    at = torch.tensor([math.cos(math.pi / 2)], dtype=torch.float64)
    assert 2.0 * torch.arccos(at).item() == math.pi  # the angle is exactly π
    expected = at - (math.pi / 2) * math.sin(math.pi / 2)
    assert torch.equal(combined_margin(at, 2.0, 0.0, 0.0, "linear"), expected)
    assert combined_margin(at, 2.0, 0.0, 0.0, "clip").item() == -1.0


@pytest.mark.parametrize("impl", ["dense", "chunked"])
@pytest.mark.parametrize("m", [0.3, 0.5, 1.2])
def test_boundary_on_both_executors(m: float, impl: str) -> None:
    """An embedding at exactly θ_y = π - m from its center: the loss is the fallback's."""
    t = math.cos(math.pi - m)
    x = torch.tensor([[t, math.sqrt(1.0 - t * t)]], dtype=torch.float64)
    centers = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]], dtype=torch.float64)
    loss_fn = marginface.ArcFaceLoss(3, 2, margin=m, impl=impl, chunk_size=1, dtype=torch.float64)
    with torch.no_grad():
        loss_fn.weight.copy_(centers)
    assert loss_fn.cosine(x)[0, 0].item() == t  # the input sits on the boundary exactly
    fallback = t - math.sin(math.pi - m) * m
    logits = 64.0 * torch.tensor([[fallback, x[0, 1].item(), -t]], dtype=torch.float64)
    expected = F.cross_entropy(logits, torch.tensor([0]))
    assert loss_fn(x, torch.tensor([0])).item() == pytest.approx(expected.item(), abs=1e-12)


# -------------------------------------------------------------------------- AdaFace
def test_adaface_clamp_acts_only_beyond_one_minus_delta() -> None:
    """Without the clamp marginface equals the authors' AdaFace wherever every |cos| <= 0.999;
    a target or a non-target beyond changes the logits (the measured row of docs/parity.md)."""
    cosine = torch.tensor([[0.998, -0.5, 0.3], [0.2, 0.9, -0.998]], dtype=torch.float64)
    labels = torch.tensor([0, 1])
    norms = torch.tensor([30.0, 12.0], dtype=torch.float64)
    plain, clamped = AdaFaceMargin().eval(), AdaFaceMargin(cosine_clamp=1e-3).eval()
    assert torch.allclose(plain(cosine, labels, norms), clamped(cosine, labels, norms), atol=1e-12)
    for row, column in [(0, 0), (0, 2), (1, 2)]:  # a target, a non-target, one near -1
        pushed = cosine.clone()
        pushed[row, column] = math.copysign(0.9999, pushed[row, column].item())
        gap = (plain(pushed, labels, norms) - clamped(pushed, labels, norms)).abs().max()
        assert gap > 1e-3


def test_adaface_clamp_zeroes_the_gradient_beyond() -> None:
    cosine = torch.tensor([[0.9999, 0.9995, 0.1]], dtype=torch.float64, requires_grad=True)
    labels = torch.tensor([2])
    logits = AdaFaceMargin(cosine_clamp=1e-3).train()(cosine, labels, torch.tensor([20.0]))
    (gradient,) = torch.autograd.grad(logits.sum(), cosine)
    assert gradient[0, 0].item() == 0.0 and gradient[0, 1].item() == 0.0
    assert gradient[0, 2].item() != 0.0


def test_adaface_keeps_the_identity_rule_without_the_clamp() -> None:
    """No clamp: the non-target rule is the identity, so the chunked executor keeps its fused
    path and the Triton kernels; with the clamp it is not."""
    assert AdaFaceMargin().nontarget_is_identity()
    assert not AdaFaceMargin(cosine_clamp=1e-3).nontarget_is_identity()
    assert ArcFaceMargin().nontarget_is_identity()
    assert not CurricularFaceMargin().nontarget_is_identity()


@pytest.mark.parametrize("bad", [-1e-3, 1.0, 2.0, float("nan")])
def test_adaface_clamp_rejects_bad_values(bad: float) -> None:
    with pytest.raises(ValueError, match="cosine_clamp"):
        AdaFaceMargin(cosine_clamp=bad)
    with pytest.raises(ValueError, match="cosine_clamp"):
        marginface.AdaFaceLoss(4, 3, cosine_clamp=bad)


def test_adaface_batch_of_one_keeps_its_statistics() -> None:
    """One row: its unbiased std is NaN (the authors' running σ would become NaN for good);
    marginface keeps μ and σ and normalizes the row with them."""
    with pytest.warns(UserWarning, match="degrees of freedom"):
        single = torch.tensor([37.0]).std()
    assert torch.isnan(single)  # what the authors' running σ would take in
    loss_fn = marginface.AdaFaceLoss(4, 3, dtype=torch.float64).train()
    loss = loss_fn(torch.tensor([[3.0, 4.0, 0.0]], dtype=torch.float64), torch.tensor([1]))
    assert torch.isfinite(loss)
    assert loss_fn.margin.batch_mean.item() == 20.0 and loss_fn.margin.batch_std.item() == 100.0
    loss_fn(torch.randn(2, 3, dtype=torch.float64), torch.tensor([0, 1]))
    assert loss_fn.margin.batch_mean.item() != 20.0  # two rows do update


# ---------------------------------------------------------------------- ElasticFace+
def test_elastic_plus_pairing_differs_from_the_authors_indexing_on_purpose() -> None:
    """The authors sort the margins ascending and the target cosines descending (``order``),
    then give row i ``ascending[order[i]]``: that pairs the sorted margins with the easiest-first
    order only when ``order`` is its own inverse. marginface gives the k-th easiest row the k-th
    smallest margin (``assigned[order] = ascending``), always."""
    cos_target = torch.tensor([0.1, 0.9, 0.5])  # easiest row 1, then 2, then 0
    drawn = torch.tensor([0.40, 0.55, 0.45])
    ascending = torch.sort(drawn).values  # [0.40, 0.45, 0.55]
    order = torch.argsort(cos_target, descending=True)  # [1, 2, 0], a 3-cycle
    authors = ascending[order]  # the authors' indexing
    ours = assign_elastic_plus(drawn, cos_target)
    assert ours.tolist() == pytest.approx([0.55, 0.40, 0.45])  # hardest gets the largest
    assert authors.tolist() == pytest.approx([0.45, 0.55, 0.40])  # easiest gets the largest
    # over random batches: ours is always anti-monotone in cos θ_y, the authors' rarely
    g = torch.Generator().manual_seed(0)
    agree = 0
    for _ in range(200):
        cos_target = torch.rand(8, generator=g)
        drawn = 0.5 + 0.05 * torch.randn(8, generator=g)
        ours = assign_elastic_plus(drawn, cos_target)
        by_ease = torch.argsort(cos_target, descending=True)
        assert torch.equal(ours[by_ease], torch.sort(drawn).values)
        agree += int(torch.equal(torch.sort(drawn).values[by_ease], ours))
    assert agree < 20  # equal only when the order is an involution (rare for 8 rows)


def test_elastic_plus_draws_then_pairs() -> None:
    """``plus=True`` in training: the margins are a permutation of the draws, sorted against the
    target cosines (so the parity of the draws themselves is that of plus=False)."""
    torch.manual_seed(3)
    drawn = torch.normal(0.35, 0.02, size=(5,)).double()
    torch.manual_seed(3)
    margin = ElasticFaceMargin("cos", 0.35, std=0.02, plus=True).train()
    cos_target = torch.tensor([0.2, -0.1, 0.8, 0.5, 0.0], dtype=torch.float64)
    assert torch.equal(margin.draw(cos_target), assign_elastic_plus(drawn, cos_target))


# ------------------------------------------------------------------- Partial FC's cap
def test_loss_is_not_capped_at_minus_log_1e30() -> None:
    """insightface's PartialFC_V2 returns ``-log(max(p_y, 1e-30))`` (at most 69.08 per sample);
    marginface returns the cross-entropy uncapped (docs/distributed.md)."""
    loss_fn = marginface.CosFaceLoss(2, 2, margin=0.35, scale=64.0, dtype=torch.float64)
    with torch.no_grad():
        loss_fn.weight.copy_(torch.tensor([[1.0, 0.0], [-1.0, 0.0]], dtype=torch.float64))
    x = torch.tensor([[-1.0, 0.0]], dtype=torch.float64)  # on the wrong class's center
    logits = torch.tensor([[64.0 * (-1.0 - 0.35), 64.0]], dtype=torch.float64)
    expected = F.cross_entropy(logits, torch.tensor([0])).item()
    assert expected > -math.log(1e-30)
    assert loss_fn(x, torch.tensor([0])).item() == pytest.approx(expected, rel=1e-12)
