"""docs/parity.md's rows for the FaceX-Zoo / face.evoLVe / OpenSphere softmax-form heads:
marginface's named loss against the authors' computation restated in tests/_facex_reference.py,
float64, several SGD steps on the centers, dense and chunked: loss, ∂x, ∂W (and any learned
parameter) within 1e-10."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import marginface

from .._facex_reference import (
    arcnegface_logits,
    circle_loss_logits,
    li_arcface_logits,
    mv_softmax_logits,
    npcface_logits,
    reference_loss,
)

TOLERANCE = 1e-10
N, C, D, STEPS, LR = 16, 11, 6, 3, 0.5


def _batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(100 + step)
    x = torch.randn(N, D, generator=generator, dtype=torch.float64) * 5
    labels = torch.randint(0, C, (N,), generator=generator)
    return x, labels


def _parity(
    name: str,
    options: dict,
    reference: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
    impl: str,
) -> dict[str, float]:
    """Largest absolute difference over ``STEPS`` steps of loss, ∂x, ∂W (SGD on both sides)."""
    torch.manual_seed(0)
    loss = marginface.create_loss(
        name,
        C,
        D,
        impl=impl,
        dtype=torch.float64,
        **({"chunk_size": 4} if impl == "chunked" else {}),
        **options,
    )
    weight = loss.weight.detach().clone().requires_grad_(True)
    errors = {"loss": 0.0, "∂x": 0.0, "∂W": 0.0}
    for step in range(STEPS):
        x, labels = _batch(step)
        xa, xb = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
        ours = loss(xa, labels)
        gxa, gwa = torch.autograd.grad(ours, [xa, loss.weight])
        theirs = reference_loss(reference(xb, weight, labels), labels)
        gxb, gwb = torch.autograd.grad(theirs, [xb, weight])
        errors["loss"] = max(errors["loss"], float((ours - theirs).detach().abs()))
        errors["∂x"] = max(errors["∂x"], float((gxa - gxb).abs().max()))
        errors["∂W"] = max(errors["∂W"], float((gwa - gwb).abs().max()))
        with torch.no_grad():
            loss.weight -= LR * gwa
            weight -= LR * gwb
    return errors


MV_CASES = [
    ("mv-am-softmax", {}, {"is_am": True}),
    (
        "mv-am-softmax",
        {"margin": 0.2, "scale": 16.0, "t": 0.3},
        {"is_am": True, "margin": 0.2, "scale": 16.0, "mv_weight": 1.3},
    ),
    ("mv-arc-softmax", {}, {"is_am": False}),
    (
        "mv-arc-softmax",
        {"margin": 0.5, "t": 0.2},
        {"is_am": False, "margin": 0.5, "mv_weight": 1.2},
    ),
]


@pytest.mark.parametrize("impl", ["dense", "chunked"])
@pytest.mark.parametrize(("name", "options", "facex"), MV_CASES)
def test_mv_softmax_reproduces_facex_zoo(name: str, options: dict, facex: dict, impl: str) -> None:
    errors = _parity(name, options, lambda x, w, y: mv_softmax_logits(x, w, y, **facex), impl)
    assert max(errors.values()) <= TOLERANCE, errors


def test_mv_softmax_reweights_some_classes_in_the_parity_batches() -> None:
    """The parity batches exercise the rule: some non-target cosines are mis-classified."""
    torch.manual_seed(0)
    loss = marginface.create_loss("mv-am-softmax", C, D, dtype=torch.float64)
    x, labels = _batch(0)
    cosine = (
        torch.nn.functional.normalize(x, dim=1)
        @ torch.nn.functional.normalize(loss.weight, dim=1).t()
    )
    target = cosine.gather(1, labels.view(-1, 1))
    hard = (cosine > target - 0.35) & ~torch.nn.functional.one_hot(labels, C).bool()
    assert 0 < int(hard.sum()) < hard.numel() - N


CIRCLE_CASES = [({}, {}), ({"margin": 0.4, "scale": 64.0}, {"margin": 0.4, "gamma": 64.0})]
LI_ARCFACE_CASES = [({}, {}), ({"margin": 0.3, "scale": 30.0}, {"margin": 0.3, "scale": 30.0})]


@pytest.mark.parametrize("impl", ["dense", "chunked"])
@pytest.mark.parametrize(("options", "facex"), CIRCLE_CASES)
def test_circle_loss_reproduces_facex_zoo(options: dict, facex: dict, impl: str) -> None:
    reference = lambda x, w, y: circle_loss_logits(x, w, y, **facex)  # noqa: E731
    errors = _parity("circle", options, reference, impl)
    assert max(errors.values()) <= TOLERANCE, errors


@pytest.mark.parametrize("impl", ["dense", "chunked"])
@pytest.mark.parametrize(("options", "paper"), LI_ARCFACE_CASES)
def test_li_arcface_reproduces_the_papers_formula(options: dict, paper: dict, impl: str) -> None:
    reference = lambda x, w, y: li_arcface_logits(x, w, y, **paper)  # noqa: E731
    errors = _parity("li-arcface", options, reference, impl)
    assert max(errors.values()) <= TOLERANCE, errors


ARCNEG_CASES = [
    ({}, {}),
    ({"margin": 0.3, "alpha": 1.5, "sigma": 0.5}, {"margin": 0.3, "alpha": 1.5, "sigma": 0.5}),
]


@pytest.mark.parametrize("impl", ["dense", "chunked"])
@pytest.mark.parametrize(("options", "theirs"), ARCNEG_CASES)
def test_arcnegface_reproduces_the_authors_code(options: dict, theirs: dict, impl: str) -> None:
    reference = lambda x, w, y: arcnegface_logits(x, w, y, **theirs)  # noqa: E731
    errors = _parity("arcnegface", options, reference, impl)
    assert max(errors.values()) <= TOLERANCE, errors


NPCFACE_CASES = [
    ({}, {}),
    (
        {"margin": 0.3, "scale": 32.0, "m0": 0.3, "m1": 0.4, "t": 1.3, "a": 0.1},
        {"margin": 0.3, "scale": 32.0, "m0": 0.3, "m1": 0.4, "t": 1.3, "a": 0.1},
    ),
]


@pytest.mark.parametrize("impl", ["dense", "chunked"])
@pytest.mark.parametrize(("options", "theirs"), NPCFACE_CASES)
def test_npcface_reproduces_the_authors_code(options: dict, theirs: dict, impl: str) -> None:
    reference = lambda x, w, y: npcface_logits(x, w, y, **theirs)  # noqa: E731
    errors = _parity("npcface", options, reference, impl)
    assert max(errors.values()) <= TOLERANCE, errors


def test_npcface_parity_batches_have_rows_with_different_hard_negatives() -> None:
    """The parity batches exercise the per-row margin: rows have different numbers of hard
    negatives (m' differs between rows; a row without any is tested in test_npcface.py)."""
    torch.manual_seed(0)
    loss = marginface.create_loss("npcface", C, D, dtype=torch.float64)
    x, labels = _batch(0)
    cosine = (
        torch.nn.functional.normalize(x, dim=1)
        @ torch.nn.functional.normalize(loss.weight, dim=1).t()
    )
    target = cosine.gather(1, labels.view(-1, 1)).clamp(-1, 1)
    threshold = torch.cos(torch.acos(target) + 0.5)
    hard = (cosine > threshold) & ~torch.nn.functional.one_hot(labels, C).bool()
    per_row = hard.sum(dim=1)
    assert 0 < int(per_row.min()) < int(per_row.max()) <= C - 1


def _all_cases() -> list[tuple[str, dict, Callable]]:
    cases: list[tuple[str, dict, Callable]] = [
        (name, options, lambda x, w, y, f=facex: mv_softmax_logits(x, w, y, **f))
        for name, options, facex in MV_CASES
    ]
    cases += [
        ("circle", options, lambda x, w, y, f=facex: circle_loss_logits(x, w, y, **f))
        for options, facex in CIRCLE_CASES
    ]
    cases += [
        ("li-arcface", options, lambda x, w, y, f=paper: li_arcface_logits(x, w, y, **f))
        for options, paper in LI_ARCFACE_CASES
    ]
    cases += [
        ("arcnegface", options, lambda x, w, y, f=theirs: arcnegface_logits(x, w, y, **f))
        for options, theirs in ARCNEG_CASES
    ]
    cases += [
        ("npcface", options, lambda x, w, y, f=theirs: npcface_logits(x, w, y, **f))
        for options, theirs in NPCFACE_CASES
    ]
    return cases


def measured_table() -> list[str]:
    """docs/parity.md's measured columns: ``name options: dense loss/∂x/∂W | chunked ...``."""
    lines = []
    for name, options, reference in _all_cases():
        cells = []
        for impl in ("dense", "chunked"):
            errors = _parity(name, options, reference, impl)
            cells.append(" / ".join(f"{errors[k]:.1e}" for k in ("loss", "∂x", "∂W")))
        lines.append(f"{name} {options}: {' | '.join(cells)}")
    return lines


if __name__ == "__main__":  # python -m tests.margins.test_facex_parity
    print("\n".join(measured_table()))
