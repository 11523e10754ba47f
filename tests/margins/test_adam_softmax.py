"""AdaM-Softmax / AdaptiveFace (Liu et al., 2019): the formula restated, the learnable per-class
margins (their gradient on every executor, never N×C on the chunked one), FaceX-Zoo parity over
several optimizer steps, the declaration a new per-class-parameter margin reuses, bad inputs."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
import torch
import torch.nn.functional as F

import marginface
from marginface.margins import AdaMSoftmaxMargin, ClassParameter, Margin
from marginface.margins.base import Context

from .._facex_reference import adam_softmax_logits, adam_softmax_regularizer, reference_loss

TOLERANCE = 1e-10
N, C, D, STEPS, LR = 16, 11, 6, 3, 0.05


def _batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(200 + step)
    x = torch.randn(N, D, generator=generator, dtype=torch.float64) * 5
    return x, torch.randint(0, C, (N,), generator=generator)


def test_the_papers_logits_and_regularizer() -> None:
    """logit_y = s(cos θ_y - m_y), logit_j = s cos θ_j; R = λ(1 - mean m)."""
    generator = torch.Generator().manual_seed(0)
    cosine = torch.rand(N, C, generator=generator, dtype=torch.float64) * 1.8 - 0.9
    labels = torch.randint(0, C, (N,), generator=generator)
    margins = torch.rand(C, generator=generator, dtype=torch.float64)
    margin = AdaMSoftmaxMargin(30.0, lambda_m=70.0)
    logits = margin(cosine, labels, class_values={"margin": margins[labels]})
    for i in range(N):
        for j in range(C):
            c = float(cosine[i, j])
            expected = 30.0 * (c - float(margins[j]) if j == int(labels[i]) else c)
            assert float(logits[i, j]) == pytest.approx(expected, rel=1e-12, abs=1e-12)
    regularizer = margin.class_regularizer({"margin": margins.sum()}, C)
    assert float(regularizer) == pytest.approx(70.0 * (1.0 - float(margins.mean())), rel=1e-12)


def test_the_margin_without_its_class_values_is_an_error_naming_them() -> None:
    cosine, labels = torch.zeros(2, 3), torch.tensor([0, 1])
    with pytest.raises(ValueError, match=r"per-class parameters \['margin'\]"):
        AdaMSoftmaxMargin()(cosine, labels)
    with pytest.raises(ValueError, match=r"class_values\['margin'\] must have shape \(2,\)"):
        AdaMSoftmaxMargin()(cosine, labels, class_values={"margin": torch.zeros(3)})
    with pytest.raises(TypeError, match="class_values must be a mapping"):
        AdaMSoftmaxMargin()(cosine, labels, class_values=[torch.zeros(2)])


def test_the_head_owns_one_margin_per_class_drawn_from_the_declared_range() -> None:
    torch.manual_seed(0)
    loss = marginface.create_loss("adam-softmax", 1000, 4)
    assert isinstance(loss.class_parameters["margin"], torch.nn.Parameter)
    margins = loss.class_parameters["margin"].detach()
    assert tuple(margins.shape) == (1000,)
    assert float(margins.min()) >= 0.3 and float(margins.max()) <= 0.4
    assert float(margins.std()) > 0.02  # drawn, not a constant
    assert "class_parameters.margin" in loss.state_dict()
    assert any(
        p is loss.class_parameters["margin"] for p in loss.parameters()
    )  # an optimizer over loss.parameters()


def _steps(impl: str, sample_rate: float = 1.0) -> dict[str, float]:
    """Largest difference over STEPS SGD steps of loss, ∂x, ∂W, ∂m against FaceX-Zoo's
    computation restated (their in-place clamp of m included)."""
    torch.manual_seed(0)
    options = {"chunk_size": 4} if impl == "chunked" else {}
    loss = marginface.create_loss("adam-softmax", C, D, impl=impl, dtype=torch.float64, **options)
    weight = loss.weight.detach().clone().requires_grad_(True)
    margins = loss.class_parameters["margin"].detach().clone().requires_grad_(True)
    ours_m = loss.class_parameters["margin"]
    errors = {"loss": 0.0, "∂x": 0.0, "∂W": 0.0, "∂m": 0.0}
    for step in range(STEPS):
        x, labels = _batch(step)
        xa, xb = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
        ours = loss(xa, labels)
        gxa, gwa, gma = torch.autograd.grad(ours, [xa, loss.weight, ours_m])
        logits = adam_softmax_logits(xb, weight, margins, labels)
        theirs = reference_loss(logits, labels) + adam_softmax_regularizer(margins)
        gxb, gwb, gmb = torch.autograd.grad(theirs, [xb, weight, margins])
        errors["loss"] = max(errors["loss"], float((ours - theirs).detach().abs()))
        errors["∂x"] = max(errors["∂x"], float((gxa - gxb).abs().max()))
        errors["∂W"] = max(errors["∂W"], float((gwa - gwb).abs().max()))
        errors["∂m"] = max(errors["∂m"], float((gma - gmb).abs().max()))
        with torch.no_grad():
            loss.weight -= 0.5 * gwa
            weight -= 0.5 * gwb
            ours_m -= LR * gma
            margins -= LR * gmb
    return errors


@pytest.mark.parametrize("impl", ["dense", "chunked"])
def test_adam_softmax_reproduces_facex_zoo(impl: str) -> None:
    errors = _steps(impl)
    assert max(errors.values()) <= TOLERANCE, errors


def test_the_margins_move_in_the_parity_steps() -> None:
    """The parity steps exercise the learned margins: they change, and differ between classes."""
    torch.manual_seed(0)
    loss = marginface.create_loss("adam-softmax", C, D, dtype=torch.float64)
    x, labels = _batch(0)
    loss(x, labels).backward()
    grad = loss.class_parameters["margin"].grad
    present = torch.zeros(C, dtype=torch.bool)
    present[labels] = True
    # every class gets -λ/C from the regularizer; the batch's classes get the CE's share too
    assert torch.allclose(grad[~present], torch.full_like(grad[~present], -70.0 / C))
    assert bool((grad[present] - (-70.0 / C)).abs().gt(1e-6).all())


@pytest.mark.parametrize("impl", ["dense", "chunked"])
def test_float64_gradcheck_including_the_margins(impl: str) -> None:
    torch.manual_seed(0)
    options = {"chunk_size": 3} if impl == "chunked" else {}
    loss = marginface.create_loss(
        "adam-softmax", 5, 3, scale=16.0, lambda_m=2.0, impl=impl, dtype=torch.float64, **options
    )
    x = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    labels = torch.tensor([0, 2, 2, 4])
    margins = loss.class_parameters["margin"]

    def objective(x: torch.Tensor, weight: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        state = {"weight": weight, "class_parameters.margin": m}
        return torch.func.functional_call(loss, state, (x, labels))

    inputs = (x, loss.weight.detach().clone().requires_grad_(True), margins.detach().clone())
    inputs[2].requires_grad_(True)
    assert torch.autograd.gradcheck(objective, inputs, eps=1e-6, atol=1e-7)


def test_partial_fc_samples_the_margins_with_the_centers() -> None:
    """Partial FC: the chunked (in place) and dense (copy) paths give the same loss, ∂W and ∂m
    on the same draw; sampled-out classes get only the regularizer's -λ/C."""
    torch.manual_seed(0)
    full = marginface.create_loss("adam-softmax", 40, D, dtype=torch.float64, sample_rate=0.3)
    chunked = marginface.create_loss(
        "adam-softmax", 40, D, dtype=torch.float64, sample_rate=0.3, impl="chunked", chunk_size=3
    )
    chunked.load_state_dict(full.state_dict())
    x, labels = _batch(5)
    results = []
    for head in (full, chunked):
        torch.manual_seed(7)
        value = head(x, labels)
        results.append(
            (value, *torch.autograd.grad(value, [head.weight, head.class_parameters["margin"]]))
        )
    for a, b in zip(results[0], results[1], strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    grad_m = results[0][2]
    untouched = results[0][1].abs().sum(dim=1) == 0  # classes not sampled
    assert bool(untouched.any())
    torch.testing.assert_close(grad_m[untouched], torch.full_like(grad_m[untouched], -70.0 / 40))


class _PerClassScale(Margin):
    """A margin defined only here: a learnable scale per class at the target (``s_y·cos θ_y``),
    with a regularizer ``(Σ_c s_c / C - 10)²``: the declaration is all it takes."""

    def scale_for(self, norms: torch.Tensor | None) -> float:
        return 10.0

    def class_parameters(self) -> Mapping[str, ClassParameter]:
        return {"boost": ClassParameter(0.5, 1.5, low=0.0)}

    def class_regularizer(self, sums: Mapping[str, torch.Tensor], num_classes: int):
        return (sums["boost"] / num_classes - 1.0) ** 2

    def target_cosine(self, cos_target: torch.Tensor, norms, context: Context) -> torch.Tensor:
        return context["boost"].to(cos_target.dtype) * cos_target


@pytest.mark.parametrize("impl", ["dense", "chunked"])
def test_a_margin_declared_in_a_test_gets_its_per_class_parameter(impl: str) -> None:
    """Without any executor or head edit: created, gathered, differentiated, regularized."""
    torch.manual_seed(0)
    options = {"chunk_size": 4} if impl == "chunked" else {}
    head = marginface.MarginSoftmaxLoss(
        9, D, _PerClassScale(), impl=impl, dtype=torch.float64, **options
    )
    boost = head.class_parameters["boost"]
    x, labels = _batch(1)
    x = x[:, :D]
    value = head(x, labels[:N] % 9)
    grad_w, grad_b = torch.autograd.grad(value, [head.weight, boost])
    # by hand, dense: s·cos θ with the target scaled by boost_y
    y = labels[:N] % 9
    cosine = F.normalize(x, dim=1) @ F.normalize(head.weight, dim=1).t()
    logits = 10.0 * torch.where(F.one_hot(y, 9).bool(), boost[y].unsqueeze(1) * cosine, cosine)
    expected = F.cross_entropy(logits, y) + (boost.sum() / 9 - 1.0) ** 2
    gw, gb = torch.autograd.grad(expected, [head.weight, boost])
    torch.testing.assert_close(value, expected, rtol=0, atol=1e-12)
    torch.testing.assert_close(grad_w, gw, rtol=0, atol=1e-12)
    torch.testing.assert_close(grad_b, gb, rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    ("kwargs", "error", "pattern"),
    [
        ({"scale": 0.0}, ValueError, "scale must be > 0, got 0"),
        ({"lambda_m": -1.0}, ValueError, r"lambda_m must be >= 0, got -1\.0"),
        ({"lambda_m": "70"}, TypeError, "lambda_m must be a real number"),
        ({"margin_init_low": -0.1}, ValueError, r"margin_init_low must be >= 0, got -0\.1"),
        ({"margin_init_high": 1.5}, ValueError, r"margin_init_high must be <= 1"),
        (
            {"margin_init_low": 0.5, "margin_init_high": 0.4},
            ValueError,
            r"margin_init_high must be >= margin_init_low = 0\.5, got 0\.4",
        ),
    ],
)
def test_bad_options_are_named(kwargs: dict, error: type, pattern: str) -> None:
    with pytest.raises(error, match=pattern):
        AdaMSoftmaxMargin(**kwargs)


if __name__ == "__main__":  # python -m tests.margins.test_adam_softmax: docs/parity.md's row
    for impl in ("dense", "chunked"):
        errors = _steps(impl)
        print(impl, " / ".join(f"{errors[k]:.1e}" for k in ("loss", "∂x", "∂W", "∂m")))
