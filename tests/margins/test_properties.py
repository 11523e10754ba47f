"""Property tests of the margin curves (hypothesis): monotone target logit, below NormFace's."""

from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from marginface.margins import (
    ArcFaceMargin,
    CombinedMargin,
    CosFaceMargin,
    Margin,
    NormFaceMargin,
)
from marginface.margins.sphereface import sphereface_psi

THETA = torch.linspace(0.0, math.pi, 2049, dtype=torch.float64)  # includes 0 and π
COS = torch.cos(THETA)


def target_curve(margin: Margin) -> torch.Tensor:
    """Target logit at every θ of the grid, through the margin's public forward (eval mode)."""
    margin.eval()
    cosine = torch.stack([COS, torch.zeros_like(COS)], dim=1)  # (T, 2): target column 0
    labels = torch.zeros(len(COS), dtype=torch.long)
    return margin(cosine, labels)[:, 0]


def assert_monotone_non_increasing(values: torch.Tensor) -> None:
    steps = values[1:] - values[:-1]
    assert float(steps.max()) <= 1e-12, f"increases by {float(steps.max())}"


scales = st.floats(1.0, 64.0)
angular = st.floats(0.0, 1.5)
cosine_margin = st.floats(0.0, 0.5)


@settings(max_examples=40, deadline=None)
@given(m=angular, s=scales)
def test_arcface_linear_policy(m: float, s: float) -> None:
    curve = target_curve(ArcFaceMargin(m, s, policy="linear"))
    assert_monotone_non_increasing(curve)
    assert bool((curve <= target_curve(NormFaceMargin(s)) + 1e-9).all())


@settings(max_examples=40, deadline=None)
@given(m=cosine_margin, s=scales)
def test_cosface(m: float, s: float) -> None:
    curve = target_curve(CosFaceMargin(m, s))
    assert_monotone_non_increasing(curve)
    assert bool((curve <= target_curve(NormFaceMargin(s)) + 1e-9).all())


@settings(max_examples=40, deadline=None)
@given(m1=st.floats(1.0, 1.5), m2=st.floats(0.0, 0.5), m3=cosine_margin, s=scales)
def test_combined_linear_policy(m1: float, m2: float, m3: float, s: float) -> None:
    curve = target_curve(CombinedMargin(m1, m2, m3, s, policy="linear"))
    assert_monotone_non_increasing(curve)
    assert bool((curve <= target_curve(NormFaceMargin(s)) + 1e-9).all())


@settings(max_examples=20, deadline=None)
@given(m=st.integers(1, 6))
def test_sphereface_psi(m: int) -> None:
    psi = sphereface_psi(COS, m)
    assert_monotone_non_increasing(psi)
    assert bool((psi <= COS + 1e-9).all())
    torch.testing.assert_close(psi[0], torch.tensor(1.0, dtype=torch.float64))
    torch.testing.assert_close(psi[-1], torch.tensor(1.0 - 2 * m, dtype=torch.float64))


def test_arcface_none_policy_is_not_monotone() -> None:
    """The property above is not vacuous: without a policy cos(θ + m) turns back up."""
    steps = target_curve(ArcFaceMargin(0.5, 1.0, policy="none")).diff()
    assert float(steps.max()) > 1e-6
