"""margins/binary.py: what a one-vs-all margin gives the executors without autograd
(``nontarget_logit_slopes``: the logits and their two derivatives, equal to autograd's through
``nontarget_logit``, at the clamp's ends included), the plotted target cosine, the repr, and the
base class's defaults for a new subclass."""

from __future__ import annotations

import pytest
import torch

from marginface.margins import SphereFace2Margin, UniFaceMargin
from marginface.margins.binary import BinaryMargin

MARGINS = {
    "sphereface2": lambda: SphereFace2Margin(num_classes=10),
    "sphereface2-st": lambda: SphereFace2Margin(num_classes=10, gradient="straight_through"),
    "uniface": lambda: UniFaceMargin(num_classes=10),
    "uniface-clamped": lambda: UniFaceMargin(scale=8.0, clamp_logits=True, num_classes=10),
    "uniface-a-st": lambda: UniFaceMargin(
        0.5, scale=8.0, variant="A", clamp_logits=True, gradient="straight_through"
    ),
}


def _cosines(margin: BinaryMargin) -> torch.Tensor:
    cosine = torch.linspace(-1.0, 1.0, 41, dtype=torch.float64).reshape(1, -1).repeat(2, 1)
    if margin.logit_clamp is not None:  # two entries exactly at the clamp's ends
        b = float(margin.bias.detach())
        for row, end in enumerate((margin.logit_clamp, -margin.logit_clamp)):
            cosine[row, 0] = (end - margin.bias_sign * b) / margin.scale
    return cosine


@pytest.mark.parametrize("name", sorted(MARGINS))
def test_slopes_equal_autograd_through_the_logits(name):
    margin = MARGINS[name]().double()
    cosine = _cosines(margin).requires_grad_(True)
    bias = margin.bias.detach().clone().requires_grad_(True)
    z = margin.nontarget_logit(cosine, bias)
    ones = torch.ones_like(z)
    slope, bias_slope = [], []
    for i in range(z.numel()):  # per entry: ∂z_i/∂c_i and ∂z_i/∂b
        g_cos, g_b = torch.autograd.grad(z.view(-1)[i], [cosine, bias], retain_graph=True)
        slope.append(g_cos.view(-1)[i])
        bias_slope.append(g_b)
    expected_slope = torch.stack(slope).view_as(z)
    expected_bias = torch.stack(bias_slope).view_as(z)
    ours_z, ours_slope, ours_bias = margin.nontarget_logit_slopes(cosine.detach(), bias.detach())
    torch.testing.assert_close(ours_z, z.detach(), rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(ours_slope, expected_slope, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ours_bias * ones, expected_bias, rtol=0, atol=0)
    if margin.logit_clamp is not None:  # some entries clamped, and the ends pass the gradient
        assert (expected_slope == 0).any() and (ours_slope[:, 0] != 0).all()


@pytest.mark.parametrize("name", sorted(MARGINS))
def test_the_plotted_target_cosine_is_the_target_logit_over_the_scale(name):
    margin = MARGINS[name]().double()
    cos_target = torch.linspace(-0.9, 0.95, 9, dtype=torch.float64)
    expected = margin.target_logit(cos_target, margin.bias) / margin.scale
    actual = margin.target_cosine(cos_target, None, margin.prepare(cos_target, None, None))
    torch.testing.assert_close(actual, expected, rtol=0, atol=0)
    assert float((actual - cos_target).abs().max()) > 0  # not the raw cosine


def test_the_repr_shows_the_clamp_and_a_gradient_that_is_not_exact():
    assert "logit_clamp" not in repr(UniFaceMargin()) and "gradient" not in repr(UniFaceMargin())
    text = repr(UniFaceMargin(scale=8.0, clamp_logits=True, gradient="straight_through"))
    assert "logit_clamp=8.0" in text and "gradient='straight_through'" in text


def test_a_new_subclass_gets_a_positive_bias_and_no_filtering_by_default():
    class Plain(BinaryMargin):
        def target_similarity(self, cos_target):
            return cos_target - 0.2

        def nontarget_similarity(self, cosine):
            return cosine

        def nontarget_similarity_slope(self, cosine):
            return torch.ones_like(cosine)

    margin = Plain(scale=4.0, positive_weight=1.0, negative_weight=1.0, bias=0.5)
    assert margin.bias_sign == 1.0 and margin.interclass_filtering_threshold == 0.0
    cosine = torch.tensor([[0.1, 0.6]])
    z = margin.nontarget_logit(cosine, margin.bias.detach())
    torch.testing.assert_close(z, 4.0 * cosine + 0.5)
