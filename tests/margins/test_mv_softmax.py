"""MV-Softmax (Wang et al., AAAI 2020): the paper's formula restated, its degenerate identities,
and its bad-input errors."""

from __future__ import annotations

import math
import os

import pytest
import torch

from marginface.margins import ArcFaceMargin, CosFaceMargin, MVAMSoftmaxMargin, MVArcSoftmaxMargin
from marginface.margins.mv_softmax import mv_weight

N, C = 9, 7


def _cosine(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    cosine = torch.rand(N, C, generator=generator, dtype=torch.float64) * 1.8 - 0.9
    labels = torch.randint(0, C, (N,), generator=generator)
    return cosine, labels


@pytest.mark.parametrize("mode", ["adaptive", "fixed"])
@pytest.mark.parametrize("kind", ["am", "arc"])
def test_the_papers_loss(kind: str, mode: str) -> None:
    """L = -log e^{s f} / (e^{s f} + Σ_{j≠y} h_j e^{s cos θ_j}), with h = e^{s(t-1)I} (fixed) or
    e^{s t (cos θ_j + 1) I} (adaptive) and I = [cos θ_j > f], written per sample."""
    cosine, labels = _cosine()
    m, s, t = (0.35, 32.0, 1.25 if mode == "fixed" else 0.2)
    cls = MVAMSoftmaxMargin if kind == "am" else MVArcSoftmaxMargin
    options = {"conditional": False} if kind == "am" else {"policy": "none"}
    logits = cls(m, s, mode=mode, t=t, **options)(cosine, labels)
    ours = torch.nn.functional.cross_entropy(logits, labels, reduction="none")
    for i in range(N):
        y = int(labels[i])
        c_y = float(cosine[i, y])
        f = c_y - m if kind == "am" else math.cos(math.acos(c_y) + m)
        denominator = math.exp(s * f)
        for j in range(C):
            if j == y:
                continue
            c = float(cosine[i, j])
            hard = c > f
            h = (
                math.exp(s * (t - 1) * hard)
                if mode == "fixed"
                else math.exp(s * t * (c + 1) * hard)
            )
            denominator += h * math.exp(s * c)
        expected = -math.log(math.exp(s * f) / denominator)
        assert float(ours[i]) == pytest.approx(expected, rel=1e-12, abs=1e-12)


def test_some_classes_are_reweighted_in_the_formula_test() -> None:
    cosine, labels = _cosine()
    threshold = cosine.gather(1, labels[:, None]) - 0.35
    hard = (cosine > threshold) & ~torch.nn.functional.one_hot(labels, C).bool()
    assert 0 < int(hard.sum()) < N * (C - 1)


def test_no_reweighting_is_the_base_loss() -> None:
    """Fixed with t = 1 (h = 1) is AM-Softmax / ArcFace; adaptive with t = 0 too."""
    cosine, labels = _cosine(1)
    cosface = CosFaceMargin(0.35, 32.0, conditional=True)(cosine, labels)
    arcface = ArcFaceMargin(0.5, 32.0, policy="easy")(cosine, labels)
    for mode, t in (("fixed", 1.0), ("adaptive", 0.0)):
        am = MVAMSoftmaxMargin(0.35, 32.0, mode=mode, t=t)
        arc = MVArcSoftmaxMargin(0.5, 32.0, mode=mode, t=t)
        torch.testing.assert_close(am(cosine, labels), cosface, rtol=0, atol=1e-12)
        torch.testing.assert_close(arc(cosine, labels), arcface, rtol=0, atol=1e-12)
    assert MVAMSoftmaxMargin(mode="fixed", t=1.0).nontarget_is_identity()
    assert not MVAMSoftmaxMargin().nontarget_is_identity()


def test_facex_zoo_mv_weight_is_the_adaptive_rule() -> None:
    """FaceX-Zoo's ``w·cos + w - 1`` with ``w = t + 1``; the fixed rule is ``cos + t - 1``."""
    assert mv_weight("adaptive", 0.12) == pytest.approx((1.12, 0.12))
    assert mv_weight("fixed", 1.2) == pytest.approx((1.0, 0.2))
    assert MVAMSoftmaxMargin().t == pytest.approx(0.12)
    assert MVAMSoftmaxMargin(mode="fixed").t == pytest.approx(1.2)


def test_the_mask_and_threshold_carry_no_gradient() -> None:
    """∂logit_j/∂cos θ_j = s·a on mis-classified classes and s elsewhere; ∂logit_j/∂cos θ_y = 0."""
    cosine, labels = _cosine(2)
    cosine.requires_grad_(True)
    margin = MVAMSoftmaxMargin(0.35, 10.0, t=0.3)
    logits = margin(cosine, labels)
    i, y = 0, int(labels[0])
    (grad,) = torch.autograd.grad(logits[i].sum(), cosine)
    threshold = float(cosine.detach()[i, y]) - 0.35
    for j in range(C):
        if j == y:
            continue
        expected = 10.0 * (1.3 if float(cosine.detach()[i, j]) > threshold else 1.0)
        assert float(grad[i, j]) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("build", "error", "pattern"),
    [
        (lambda: MVAMSoftmaxMargin(mode="hard"), ValueError, "mode must be one of"),
        (lambda: MVAMSoftmaxMargin(mode="fixed", t=0.5), ValueError, r"t must be >= 1 .*0\.5"),
        (lambda: MVAMSoftmaxMargin(t=-0.1), ValueError, r"t must be >= 0, got -0\.1"),
        (lambda: MVAMSoftmaxMargin(t="0.2"), TypeError, "t must be a real number"),
        (lambda: MVAMSoftmaxMargin(margin=-0.1), ValueError, "margin must be >= 0"),
        (lambda: MVAMSoftmaxMargin(scale=0.0), ValueError, "scale must be > 0, got 0"),
        (lambda: MVAMSoftmaxMargin(conditional=1), TypeError, "conditional must be a bool"),
        (lambda: MVArcSoftmaxMargin(margin=4.0), ValueError, "margin must be < "),
        (lambda: MVArcSoftmaxMargin(policy="soft"), ValueError, "policy must be one of"),
        (lambda: MVArcSoftmaxMargin(scale=float("nan")), ValueError, "scale must be finite"),
    ],
)
def test_bad_options_are_named(build, error: type, pattern: str) -> None:
    with pytest.raises(error, match=pattern):
        build()


def test_repr_names_the_options() -> None:
    assert "mode='fixed', t=1.2" in repr(MVArcSoftmaxMargin(mode="fixed"))
    assert "conditional=False" in repr(MVAMSoftmaxMargin(conditional=False))


@pytest.mark.parametrize(
    "name", ["mv-am-softmax", "mv-arc-softmax", "li-arcface", "circle", "arcnegface", "npcface"]
)
def test_the_issue_25_rules_run_on_the_triton_kernels(name: str) -> None:
    """The issue-25 non-target rules have Triton kernels: ``kernels="triton"`` runs them (on the
    CPU under the interpreter, which tests/conftest.py turns on) and gives the PyTorch chunk
    loop's loss; the full comparisons (∂x, ∂W, two steps) are in tests/executors/test_triton.py."""
    pytest.importorskip("triton")
    import marginface

    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("no CUDA and TRITON_INTERPRET is not 1: the kernels cannot run here")
    generator = torch.Generator().manual_seed(0)
    x, y = torch.randn(3, 4, generator=generator), torch.tensor([0, 2, 5])
    losses = {}
    for kernels in ("torch", "triton"):
        torch.manual_seed(0)  # the same weight for both
        loss_fn = marginface.create_loss(name, 6, 4, impl="chunked", kernels=kernels)
        losses[kernels] = loss_fn(x, y)
    torch.testing.assert_close(losses["triton"], losses["torch"], rtol=1e-5, atol=1e-5)
