"""margins/sphereface2.py: a standalone margin's defaults and initial bias (the authors' formula
restated in tests/_opensphere_reference.py), each option's accepted boundary and refused value,
and the rule a subclass must not inherit. The loss itself against the authors' code:
test_binary_parity.py; the slopes against autograd: test_binary_margin.py."""

from __future__ import annotations

import math
from decimal import Decimal, localcontext

import pytest
import torch

from marginface.margins import SphereFace2Margin

from .._opensphere_reference import sphereface2_initial_bias


def _precise_bias(classes: int, variant: str, margin: float) -> float:
    """The authors' closed form ``log 2z - a_i - log(1 - z + √((1 - z)² + 4z·e^{a_y - a_i}))``
    evaluated with 400 significant digits (``decimal``), so that its cancellation at ``z > 1``
    costs nothing; ``a_y``, ``a_i`` as the authors compute them (r = 40, t = 3)."""
    r, t = 40.0, 3.0
    if variant == "C":
        a_y, a_i = r * (2.0 * 0.5**t - 1.0 - margin), r * (2.0 * 0.5**t - 1.0 + margin)
    else:
        angle = math.pi / 2.0 + margin if variant == "A" else margin * math.pi / 2.0
        a_y = r * (2.0 * ((math.cos(min(math.pi, angle)) + 1.0) / 2.0) ** t - 1.0)
        a_i = r * (2.0 * 0.5**t - 1.0)
    with localcontext() as context:
        context.prec = 400
        z = Decimal(7) / (Decimal(3) * (classes - 1))
        root = ((1 - z) ** 2 + 4 * z * Decimal(a_y - a_i).exp()).sqrt()
        return float((2 * z).ln() - Decimal(a_i) - (1 - z + root).ln())


@pytest.mark.parametrize(("variant", "margin"), [("C", 0.4), ("A", 0.5), ("M", 1.7)])
def test_a_standalone_margin_has_c_2_and_the_authors_bias(variant, margin):
    ours = SphereFace2Margin(margin, variant=variant)
    expected = _precise_bias(2, variant, margin)
    assert float(ours.bias.detach()) == float(torch.tensor(expected, dtype=torch.float32))
    assert (ours.scale, ours.balance, ours.power, ours.loss_weight) == (40.0, 0.7, 3.0, 50.0)


@pytest.mark.parametrize(
    "options",
    [
        {"variant": "C", "margin": 4.0},  # cosine units: no bound above
        {"variant": "M", "margin": 1.0},  # m·θ with m = 1: no margin
        {"power": 1.0},  # the identity adjustment
        {"power": 1.5},
    ],
)
def test_the_boundaries_are_accepted(options):
    SphereFace2Margin(**options)


@pytest.mark.parametrize(
    ("options", "text"),
    [
        ({"variant": "A", "margin": math.pi}, r"margin must be < 3.14"),
        ({"variant": "M", "margin": 0.99}, r"margin must be >= 1 for variant 'M'"),
        ({"power": 0.99}, r"power must be >= 1, got 0.99"),
        ({"balance": 1.0}, r"balance must be < 1"),
        ({"num_classes": 1}, r"num_classes must be >= 2"),
    ],
)
def test_values_past_them_are_refused_by_name(options, text):
    with pytest.raises(ValueError, match=text):
        SphereFace2Margin(**options)


def test_a_subclass_that_changes_the_nontarget_similarity_declares_no_rule():
    class Shifted(SphereFace2Margin):
        def nontarget_similarity(self, cosine):
            return super().nontarget_similarity(cosine) + 0.1

    assert SphereFace2Margin(power=2.5).binary_kernel_parameters() == {
        "power": 2.5,
        "offset": 0.4,
    }
    assert SphereFace2Margin(0.5, variant="A").binary_kernel_parameters()["offset"] == 0.0
    assert Shifted().binary_kernel_parameters() is None


@pytest.mark.parametrize("classes", [2, 3, 4, 10, 1000])
@pytest.mark.parametrize(("variant", "margin"), [("C", 0.4), ("C", 0.1), ("A", 0.5), ("M", 1.7)])
def test_the_initial_bias_equals_the_authors_formula(classes, variant, margin):
    """``z <= 1`` (C >= 4 at λ = 0.7): the authors' float64 computation, exactly after the
    float32 rounding of the parameter; ``z > 1`` (C = 2, 3): the closed form's exact value,
    which their float64 computation misses by its cancellation (up to ~2e-3 here)."""
    ours = float(SphereFace2Margin(margin, variant=variant, num_classes=classes).bias.detach())
    precise = float(torch.tensor(_precise_bias(classes, variant, margin), dtype=torch.float32))
    assert ours == precise
    if classes >= 4:
        theirs = sphereface2_initial_bias(classes, variant, 0.7, 40.0, margin, 3.0)
        assert ours == float(torch.tensor(theirs, dtype=torch.float32))


def test_a_large_margin_at_two_classes_has_a_finite_bias():
    """``1 - z + √·`` cancels to 0 in float64 here (``e^{a_y - a_i} = e^{-320}``)."""
    with pytest.raises(ValueError, match="math domain error"):
        sphereface2_initial_bias(2, "C", 0.7, 40.0, 4.0, 3.0)  # the closed form fails
    bias = float(SphereFace2Margin(4.0, num_classes=2).bias.detach())
    # b = log 2z - a_i - (log 4z + a_y - a_i - log 2(z - 1)) with the root = z - 1
    z = 0.7 / 0.3
    a_y, a_i = 40.0 * (2 * 0.5**3 - 1 - 4.0), 40.0 * (2 * 0.5**3 - 1 + 4.0)
    expected = math.log(2 * z) - a_i - (math.log(4 * z) + a_y - a_i - math.log(2 * (z - 1)))
    assert math.isfinite(bias) and bias == pytest.approx(expected, rel=1e-6)
    assert bias == float(torch.tensor(_precise_bias(2, "C", 4.0), dtype=torch.float32))
