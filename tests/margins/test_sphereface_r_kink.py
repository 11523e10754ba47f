"""SphereFace-R's soft feature normalization ``t·|‖x‖ - s|`` at its kink ``‖x‖ = s``: the
subgradient marginface takes there (0, ``torch.abs``'s), and the one row-level difference from the
authors' code (ydwen/opensphere ``SphereFaceR_S``, restated in tests/_facex_reference.py) that
follows from the two computing ``‖x‖`` with different rounding."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import marginface
from marginface.executors.dense import row_norms
from marginface.margins import SphereFaceRMargin

from .._facex_reference import sphereface_r_factor, sphereface_r_loss

S, T, C, D = 30.0, 0.01, 5, 6


def test_the_soft_penalty_takes_the_subgradient_zero_at_the_kink() -> None:
    """``∂(t·|n - s|)/∂n`` is ``t·sign(n - s)``: ``-t``, ``0`` at ``n = s`` exactly, ``+t``."""
    margin = SphereFaceRMargin(scale=S, feature_norm="soft", soft_weight=T)
    norms = torch.tensor([S - 1e-9, S, S + 1e-9], dtype=torch.float64, requires_grad=True)
    (grad,) = torch.autograd.grad(margin.regularizer(norms).sum(), norms)
    assert grad.tolist() == [-T, 0.0, T]


def _with_and_without_penalty(x: torch.Tensor, labels: torch.Tensor, impl: str) -> torch.Tensor:
    """``∂x`` of the soft-normalized loss minus that of the same loss with ``t = 0``: the
    penalty's own gradient, ``(t/N)·sign(‖x_i‖ - s)·x̂_i`` per row."""
    grads = []
    for weight in (T, 0.0):
        torch.manual_seed(0)
        extra = {"chunk_size": 2} if impl == "chunked" else {}
        loss = marginface.create_loss(
            "sphereface-r", C, D, impl=impl, dtype=torch.float64, feature_norm="soft",
            soft_weight=weight, **extra,
        )  # fmt: skip
        xr = x.clone().requires_grad_(True)
        (grad,) = torch.autograd.grad(loss(xr, labels), xr)
        grads.append(grad)
    return grads[0] - grads[1]


@pytest.mark.parametrize("impl", ["dense", "chunked"])
def test_a_row_whose_norm_is_s_gets_no_penalty_gradient(impl: str) -> None:
    """A row of norm exactly 30 (18² + 24² = 30²: exact in any rounding) gets no gradient from
    the penalty; the rows off the kink get ``±(t/N)·x̂``."""
    x = torch.tensor(
        [[18.0, 24.0, 0, 0, 0, 0], [1.0, 2, 3, 4, 5, 6], [20.0, 20, 20, 0, 0, 0]],
        dtype=torch.float64,
    )
    assert row_norms(x)[0].item() == S
    penalty = _with_and_without_penalty(x, torch.tensor([0, 1, 2]), impl)
    n = x.shape[0]
    sign = torch.tensor([0.0, -1.0, 1.0], dtype=torch.float64)[:, None]
    expected = (T / n) * sign * F.normalize(x, dim=1)
    torch.testing.assert_close(penalty, expected, rtol=0, atol=1e-15)
    assert penalty[0].abs().max().item() == 0.0


def _row_on_the_kink_for_marginface_only() -> torch.Tensor:
    """A float64 row ``x`` (``Tensor[1, D]``) that marginface's row norm (pre-scaled by
    ``max |x_j|``) rounds to ``s`` exactly and a plain ``torch.norm`` (the authors') just below."""
    generator = torch.Generator().manual_seed(0)
    for _ in range(1000):
        u = torch.randn(1, D, generator=generator, dtype=torch.float64)
        x = S * u / torch.linalg.vector_norm(u)
        if row_norms(x).item() == S and torch.norm(x, p=2, dim=1).item() < S:
            return x
    raise AssertionError("no row found")  # pragma: no cover - 1 in 4 rows qualifies


def test_the_only_difference_from_the_authors_is_t_over_n_times_x_hat_on_that_row() -> None:
    """Their ``torch.abs(torch.norm(x) - s)`` sees ``‖x‖ < s`` there and takes ``-t``, ours sees
    ``‖x‖ = s`` and takes 0: ``∂x`` differs by ``(t/N)·x̂`` on that row, nowhere else."""
    torch.manual_seed(1)
    others = torch.randn(3, D, dtype=torch.float64) * 5
    x = torch.cat([_row_on_the_kink_for_marginface_only(), others])
    labels = torch.tensor([0, 1, 2, 3])
    torch.manual_seed(0)
    loss = marginface.create_loss(
        "sphereface-r", C, D, dtype=torch.float64, feature_norm="soft",
        soft_weight=T * S / 50.0,  # their t, over their loss weight lw/s
    )  # fmt: skip
    with torch.no_grad():
        loss.weight.copy_(F.normalize(loss.weight, dim=1))
    xa, xb = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    (ours,) = torch.autograd.grad(sphereface_r_factor("S") * loss(xa, labels), xa)
    weight = loss.weight.detach()
    (theirs,) = torch.autograd.grad(sphereface_r_loss(xb, weight, labels, variant="S"), xb)
    difference = ours - theirs
    expected = torch.zeros_like(x)
    expected[0] = (T / x.shape[0]) * F.normalize(x[0], dim=0)
    torch.testing.assert_close(difference, expected, rtol=0, atol=1e-14)
    assert difference[0].abs().max().item() > 1e-4
