"""margins/uniface.py: UniFace's initial threshold ``b₀ = log(10·C·r)``, its options (each
readable back, each bad value refused by name), the variant's repr and target, and the rule it
declares to the executors."""

from __future__ import annotations

import math

import pytest
import torch

import marginface
from marginface.margins import UniFaceMargin
from marginface.margins.uniface import uniface_initial_bias


def _float32(value: float) -> float:
    return float(torch.tensor(value, dtype=torch.float32))


@pytest.mark.parametrize(("classes", "rate"), [(2, 1.0), (1000, 1.0), (1000, 0.1), (85742, 0.3)])
def test_the_initial_threshold_is_log_ten_c_r(classes, rate):
    assert uniface_initial_bias(classes, rate) == pytest.approx(math.log(10 * classes * rate))
    margin = UniFaceMargin(num_classes=classes, sample_rate=rate)
    assert float(margin.bias.detach()) == _float32(math.log(10 * classes * rate))


def test_the_defaults_are_the_authors_and_a_standalone_margin_has_c_2():
    assert uniface_initial_bias(37) == pytest.approx(math.log(370.0))
    margin = UniFaceMargin()
    assert float(margin.bias.detach()) == _float32(math.log(20.0))
    assert (margin.margin, margin.scale, margin.negative_weight) == (0.4, 64.0, 1.0)
    assert (margin.variant, margin.policy, margin.clamp_logits) == ("C", "linear", False)
    assert margin.logit_clamp is None and margin.gradient == "exact"


def test_the_head_passes_its_classes_and_sampling_rate():
    loss = marginface.create_loss("uniface", 1000, 4, sample_rate=0.1)
    assert float(loss.margin.bias.detach()) == _float32(math.log(1000.0))


def test_every_option_reads_back():
    options = {
        "margin": 0.3, "scale": 10.0, "negative_weight": 0.5, "variant": "A", "policy": "clip",
        "clamp_logits": True, "gradient": "straight_through",
    }  # fmt: skip
    margin = UniFaceMargin(**options)
    for name, value in options.items():
        assert getattr(margin, name) == value, name
    assert margin.logit_clamp == 10.0  # the clamp is [-s, s]


def test_the_variant_bounds_its_margin():
    UniFaceMargin(4.0)  # variant C: any cosine margin >= 0
    UniFaceMargin(3.0, variant="A")
    with pytest.raises(ValueError, match=r"margin must be < 3.14"):
        UniFaceMargin(math.pi, variant="A")
    with pytest.raises(ValueError, match=r"sample_rate must be <= 1"):
        UniFaceMargin(sample_rate=1.5)


def test_the_repr_names_the_variant_only_when_it_is_a():
    assert "variant" not in repr(UniFaceMargin())
    assert "variant='A', policy='clip'" in repr(UniFaceMargin(0.5, variant="A", policy="clip"))


def test_both_variants_declare_the_identity_rule_and_a_subclass_does_not():
    """The non-target rule ``g(c) = c`` (``t = 1``, ``μ = 0``) is what the custom operators
    and kernels compile; a subclass that changes ``g`` must not inherit the declaration."""

    class Halved(UniFaceMargin):
        def nontarget_similarity(self, cosine):
            return 0.5 * cosine

    expected = {"power": 1.0, "offset": 0.0}
    assert UniFaceMargin().binary_kernel_parameters() == expected
    assert UniFaceMargin(variant="A").binary_kernel_parameters() == expected
    assert Halved().binary_kernel_parameters() is None
