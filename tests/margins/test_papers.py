"""Each margin against an independent re-statement of its paper / reference code."""

from __future__ import annotations

import inspect
import math

import numpy as np
import pytest
import torch

from marginface.margins import (
    AdaCosMargin,
    AdaFaceMargin,
    ArcFaceMargin,
    ArcNegFaceMargin,
    CircleMargin,
    CombinedMargin,
    CosFaceMargin,
    CurricularFaceMargin,
    ElasticFaceMargin,
    LiArcFaceMargin,
    MagFaceMargin,
    MVAMSoftmaxMargin,
    MVArcSoftmaxMargin,
    NormFaceMargin,
    SphereFaceMargin,
)
from marginface.margins.adacos import MIN_SCALE, adacos_dynamic_scale
from marginface.margins.arcface import additive_angular_margin
from marginface.margins.curricularface import curricular_negative
from marginface.margins.elasticface import assign_elastic_plus
from marginface.margins.sphereface import chebyshev_cos_multiple, sphereface_psi


def _batch(n: int = 8, c: int = 6, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return (
        torch.rand(n, c, generator=g, dtype=torch.float64) * 1.8 - 0.9,
        torch.randint(0, c, (n,), generator=g),
    )


def reference_arcface_target(c: np.ndarray, m: np.ndarray | float) -> np.ndarray:
    """insightface's formula: cos(θ+m) above cos(π-m), else cos θ - m·sin m."""
    theta = np.arccos(np.clip(c, -1, 1))
    return np.where(c > np.cos(np.pi - m), np.cos(theta + m), c - m * np.sin(m))


def test_curricularface_against_authors_code() -> None:
    cosine, labels = _batch()
    margin = CurricularFaceMargin(0.5, 64.0)
    margin.t.fill_(0.3)
    logits = margin.train()(cosine, labels).numpy()
    # reference: the authors' forward, re-stated in numpy
    c = cosine.numpy().copy()
    rows = np.arange(len(c))
    target = c[rows, labels.numpy()][:, None]
    cos_theta_m = np.cos(np.arccos(target) + 0.5)
    t = 0.01 * target.mean() + 0.99 * 0.3  # updated before use
    hard = c > cos_theta_m
    out = np.where(hard, c * (t + c), c)
    out[rows, labels.numpy()] = reference_arcface_target(target[:, 0], 0.5)
    # t is a float32 buffer: agreement to float32 precision
    np.testing.assert_allclose(logits, 64.0 * out, rtol=1e-6, atol=1e-6)
    assert math.isclose(float(margin.t), t, rel_tol=1e-6)


def test_adacos_dynamic_scale_against_paper() -> None:
    cosine, labels = _batch(16, 10)
    margin = AdaCosMargin(10).train()
    s0 = math.sqrt(2) * math.log(9)
    assert math.isclose(float(margin.scale), s0, rel_tol=1e-6)
    logits = margin(cosine, labels).numpy()
    c = cosine.numpy()
    onehot = np.zeros_like(c, dtype=bool)
    onehot[np.arange(16), labels.numpy()] = True
    b_avg = np.exp(np.float32(s0) * c)[~onehot].sum() / 16
    theta_med = np.median(np.arccos(c[onehot]))  # torch.median takes the lower middle value
    theta_med_torch = float(torch.median(torch.arccos(torch.from_numpy(c[onehot]))))
    assert theta_med_torch <= theta_med + 1e-12
    s = math.log(b_avg) / math.cos(min(math.pi / 4, theta_med_torch))
    assert math.isclose(float(margin.scale), s, rel_tol=1e-5)
    np.testing.assert_allclose(logits, np.float32(s) * c, rtol=1e-6)


def _adacos_hand_scale(cosine: np.ndarray, labels: np.ndarray, s_old: float) -> float:
    """AdaCos Eq. 15 by hand: ``log(B_avg) / cos(min(π/4, θ_med))``, ``θ_med`` the median
    target angle (odd ``N``: the middle value, no convention involved)."""
    rows = np.arange(len(labels))
    onehot = np.zeros_like(cosine, dtype=bool)
    onehot[rows, labels] = True
    b_avg = np.exp(np.float32(s_old) * cosine)[~onehot].sum() / len(labels)
    theta_med = float(np.median(np.arccos(cosine[rows, labels])))
    return math.log(b_avg) / math.cos(min(math.pi / 4, theta_med))


@pytest.mark.parametrize(
    "target_angles",
    [
        # median 0.3 < π/4: the uncapped median sets the scale; mean 0.5, max 1.4 differ
        [0.1, 1.4, 0.3, 0.2, 0.5],
        # median 1.0 > π/4: the cap; mean 0.72 < π/4 would not be capped
        [1.0, 0.1, 1.2, 0.2, 1.1],
    ],
    ids=["median-below-cap", "median-above-cap"],
)
def test_adacos_scale_uses_the_median_target_angle(target_angles: list[float]) -> None:
    angles = np.array(target_angles)
    n, c = len(angles), 10
    g = torch.Generator().manual_seed(1)
    cosine = torch.rand(n, c, generator=g, dtype=torch.float64) - 0.5
    labels = torch.tensor([3, 0, 9, 3, 5])
    cosine[torch.arange(n), labels] = torch.from_numpy(np.cos(angles))
    margin = AdaCosMargin(c).train()
    s_old = float(margin.scale)
    margin(cosine, labels)
    expected = _adacos_hand_scale(cosine.numpy(), labels.numpy(), s_old)
    assert math.isclose(float(margin.scale), expected, rel_tol=1e-6)
    # the test can tell the median from the mean and from no cap
    mean_angle = float(angles.mean())
    log_b = expected * math.cos(min(math.pi / 4, float(np.median(angles))))
    for wrong in (log_b / math.cos(min(math.pi / 4, mean_angle)), log_b / math.cos(1.0)):
        assert not math.isclose(float(margin.scale), wrong, rel_tol=1e-3)


def test_adacos_dynamic_scale_caps_the_angle_at_quarter_pi() -> None:
    log_b = torch.tensor(2.0, dtype=torch.float64)
    below = adacos_dynamic_scale(log_b, torch.tensor(0.5, dtype=torch.float64))
    assert math.isclose(float(below), 2.0 / math.cos(0.5), rel_tol=1e-12)
    for theta in (math.pi / 4, 1.0, 3.0):
        capped = adacos_dynamic_scale(log_b, torch.tensor(theta, dtype=torch.float64))
        assert math.isclose(float(capped), 2.0 / math.cos(math.pi / 4), rel_tol=1e-12)
    floored = adacos_dynamic_scale(torch.tensor(0.1), torch.tensor(0.2))
    assert float(floored) == MIN_SCALE  # 0.1 / cos 0.2 < 1


def test_adacos_update_scale_clamps_target_cosines_beyond_one() -> None:
    """Rounding can put a cosine a few ulps past ±1; its angle is then 0 or π, never NaN."""
    margin = AdaCosMargin(10)
    log_b = torch.tensor(2.0)
    margin.update_scale(log_b, torch.tensor([1.5, -1.5, 0.5, 1.0000001, -1.0000001]))
    assert math.isclose(float(margin.scale), 2.0 / math.cos(math.pi / 4), rel_tol=1e-6)  # θ: π/3
    margin.update_scale(log_b, torch.tensor([1.5, 1.5, -1.5]))  # median θ = 0
    assert math.isclose(float(margin.scale), 2.0, rel_tol=1e-6)


def test_adacos_fixed_scale_does_not_move() -> None:
    cosine, labels = _batch(16, 10)
    margin = AdaCosMargin(10, dynamic=False).train()
    margin(cosine, labels)
    assert math.isclose(float(margin.scale), math.sqrt(2) * math.log(9), rel_tol=1e-6)


def test_magface_against_paper() -> None:
    cosine, labels = _batch()
    norms = torch.tensor([5.0, 10.0, 30.0, 60.0, 90.0, 110.0, 150.0, 45.0], dtype=torch.float64)
    a = np.clip(norms.numpy(), 10, 110)
    m = (0.8 - 0.45) / 100 * (a - 10) + 0.45
    c = cosine.numpy()
    rows = np.arange(8)
    target = c[rows, labels.numpy()]
    assert (target < 0).any() and (target > 0).any()  # both branches of the easy margin
    # the default: the authors' MagLinear (easy_margin=True), margin only where cos θ_y > 0
    margin = MagFaceMargin(64.0)
    logits = margin(cosine, labels, norms).numpy()
    expected = c.copy()
    expected[rows, labels.numpy()] = np.where(target > 0, np.cos(np.arccos(target) + m), target)
    np.testing.assert_allclose(logits, 64 * expected, rtol=1e-10, atol=1e-10)
    # policy="linear": their easy_margin=False branch
    logits = MagFaceMargin(64.0, policy="linear")(cosine, labels, norms).numpy()
    expected[rows, labels.numpy()] = reference_arcface_target(target, m)
    np.testing.assert_allclose(logits, 64 * expected, rtol=1e-10, atol=1e-10)
    reg = margin.regularizer(norms).numpy()
    np.testing.assert_allclose(reg, 35.0 * (1 / a + a / 110**2), rtol=1e-12)


def test_adaface_against_authors_code() -> None:
    cosine, labels = _batch()
    norms = torch.tensor([5.0, 10.0, 18.0, 22.0, 30.0, 50.0, 150.0, 0.0], dtype=torch.float64)
    margin = AdaFaceMargin(0.4, 64.0).train()
    logits = margin(cosine, labels, norms).numpy()
    safe = np.clip(norms.numpy(), 0.001, 100)
    mean = 0.01 * safe.mean() + 0.99 * 20.0
    std = 0.01 * safe.std(ddof=1) + 0.99 * 100.0
    z = np.clip((safe - mean) / (std + 1e-3) * 0.333, -1, 1)
    c = np.clip(cosine.numpy(), -1 + 1e-3, 1 - 1e-3)
    rows, y = np.arange(8), labels.numpy()
    theta = np.arccos(c[rows, y])
    theta_m = np.clip(theta - 0.4 * z, 1e-3, np.pi - 1e-3)
    expected = cosine.numpy().copy()
    expected[rows, y] = np.cos(theta_m) - (0.4 * z + 0.4)
    np.testing.assert_allclose(logits, 64 * expected, rtol=1e-5, atol=1e-5)
    assert math.isclose(float(margin.batch_mean), mean, rel_tol=1e-6)
    assert math.isclose(float(margin.batch_std), std, rel_tol=1e-6)


def test_elasticface_draws_are_seeded_and_distributed() -> None:
    cosine, labels = _batch(4000, 5)
    a = ElasticFaceMargin("arc", 0.5, 64.0, std=0.05, seed=7).train()
    b = ElasticFaceMargin("arc", 0.5, 64.0, std=0.05, seed=7).train()
    torch.testing.assert_close(a(cosine, labels), b(cosine, labels))
    drawn = a.draw(cosine[:, 0])
    assert abs(float(drawn.mean()) - 0.5) < 0.005 and abs(float(drawn.std()) - 0.05) < 0.005
    a.eval()
    assert torch.all(a.draw(cosine[:, 0]) == 0.5)


@pytest.mark.parametrize("kind", ["arc", "cos"])
def test_elasticface_target_uses_the_drawn_margin(kind: str) -> None:
    cosine, labels = _batch()
    margin = ElasticFaceMargin(kind, None, 64.0, seed=3).train()
    gen = torch.Generator().manual_seed(3)
    m = torch.normal(margin.margin, 0.05, size=(8,), generator=gen).double().numpy()
    logits = margin(cosine, labels).numpy()
    rows, y = np.arange(8), labels.numpy()
    target = cosine.numpy()[rows, y]
    ref = reference_arcface_target(target, m) if kind == "arc" else target - m
    np.testing.assert_allclose(logits[rows, y], 64 * ref, rtol=1e-10, atol=1e-10)


def test_elasticface_plus_assignment() -> None:
    margins = torch.tensor([0.6, 0.4, 0.5, 0.45])
    cos_target = torch.tensor([0.1, 0.9, 0.5, 0.7])
    assigned = assign_elastic_plus(margins, cos_target)
    # easiest sample (0.9) gets the smallest margin, hardest (0.1) the largest
    torch.testing.assert_close(assigned, torch.tensor([0.6, 0.4, 0.5, 0.45]))
    shuffled = assign_elastic_plus(torch.tensor([0.45, 0.6, 0.4, 0.5]), cos_target)
    torch.testing.assert_close(shuffled, torch.tensor([0.6, 0.4, 0.5, 0.45]))


@pytest.mark.parametrize("m", [1, 2, 3, 4, 5])
def test_chebyshev_is_cos_multiple(m: int) -> None:
    theta = torch.linspace(0, math.pi, 101, dtype=torch.float64)
    torch.testing.assert_close(chebyshev_cos_multiple(theta.cos(), m), (m * theta).cos())


def test_sphereface_psi_pieces() -> None:
    m = 4
    theta = torch.tensor([0.1, 1.0, 2.0, 3.0], dtype=torch.float64)
    k = torch.floor(m * theta / math.pi)
    expected = (-1.0) ** k * torch.cos(m * theta) - 2 * k
    torch.testing.assert_close(sphereface_psi(theta.cos(), m), expected)


def test_sphereface_annealing_and_feature_norm_scale() -> None:
    cosine, labels = _batch()
    norms = torch.linspace(1, 8, 8, dtype=torch.float64)
    margin = SphereFaceMargin(4).train()
    logits = margin(cosine, labels, norms)  # iteration 1
    lam = max(5.0, 1000.0 / (1 + 0.12 * 1))
    assert math.isclose(margin.current_lambda, lam)
    rows = torch.arange(8)
    c = cosine[rows, labels]
    target = (lam * c + sphereface_psi(c, 4)) / (1 + lam)
    torch.testing.assert_close(logits[rows, labels], norms * target)
    other = torch.ones_like(cosine, dtype=torch.bool)
    other[rows, labels] = False
    torch.testing.assert_close(logits[other], (norms[:, None] * cosine)[other])
    for _ in range(5000):
        margin.iteration += 1
    assert margin.current_lambda == 5.0


def test_sphereface_normalized_variant_has_fixed_scale() -> None:
    margin = SphereFaceMargin(4, scale=30.0, lambda_base=0.0, lambda_min=0.0)
    assert not margin.requires_norms
    cosine, labels = _batch()
    rows = torch.arange(8)
    logits = margin(cosine, labels)
    torch.testing.assert_close(logits[rows, labels], 30 * sphereface_psi(cosine[rows, labels], 4))


# ----------------------------------------------------------------------- boundaries of the papers'
# rules: strict inequalities, clips, and the defaults the docs (docs/losses.md) give as the papers'


def test_curricular_negative_at_the_threshold_is_not_hard() -> None:
    """Hard means ``cos θ_j > cos(θ_y + m)``, strictly (paper, Eq. 7; authors' ``mask``)."""
    threshold = torch.tensor([[0.25]], dtype=torch.float64)
    cosine = torch.tensor([[0.25, 0.2500001, 0.2499999]], dtype=torch.float64)
    out = curricular_negative(cosine, threshold, 0.5)
    expected = [0.25, 0.2500001 * (0.5 + 0.2500001), 0.2499999]
    np.testing.assert_allclose(out.numpy()[0], expected, rtol=1e-15)


@pytest.mark.parametrize(
    ("margin", "m1"),
    [
        (ArcFaceMargin(0.5, 1.0, policy="easy"), 1.0),
        (CombinedMargin(1.0, 0.5, 0.0, 1.0, policy="easy"), 1.0),
        (CombinedMargin(1.2, 0.5, 0.0, 1.0, policy="easy"), 1.2),  # the general path
    ],
    ids=["arcface", "combined-m1=1", "combined-m1=1.2"],
)
def test_easy_policy_leaves_a_right_angle_alone(margin, m1: float) -> None:
    """insightface's easy margin: ``where(cos > 0, cos(m1·θ + m), cos)``, strictly positive."""
    cosine = torch.tensor([[0.0, 0.3], [1e-6, 0.3], [-1e-6, 0.3]], dtype=torch.float64)
    logits = margin(cosine, torch.tensor([0, 0, 0]))
    assert float(logits[0, 0]) == 0.0  # θ = π/2 exactly: no margin
    assert float(logits[1, 0]) == pytest.approx(math.cos(m1 * math.acos(1e-6) + 0.5), rel=1e-9)
    assert float(logits[2, 0]) == -1e-6


def test_linear_policy_with_per_sample_margins() -> None:
    """Beyond ``θ + m > π`` the linear fallback is ``cos θ - m·sin m`` for tensor margins too
    (MagFace's and ElasticFace's per-sample ``m``)."""
    c = torch.tensor([-0.999, -0.99, -0.95, 0.2], dtype=torch.float64)
    m = torch.tensor([0.5, 0.3, 0.8, 0.45], dtype=torch.float64)
    out = additive_angular_margin(c, m, "linear").numpy()
    np.testing.assert_allclose(out, reference_arcface_target(c.numpy(), m.numpy()), rtol=1e-12)


def test_adaface_quality_is_clipped_to_the_unit_interval() -> None:
    """``ẑ = clip(h·(‖z‖ - μ) / (σ + ε), -1, 1)`` (paper Eq. 11): both ends are reached."""
    cosine, labels = _batch(4)
    norms = torch.tensor([0.5, 100.0, 20.0, 21.0], dtype=torch.float64)
    margin = AdaFaceMargin(0.4, 64.0).eval()  # eval: the statistics stay as set
    margin.batch_mean.fill_(20.0)
    margin.batch_std.fill_(1.0)
    logits = margin(cosine, labels, norms).numpy()
    z = np.clip((norms.numpy() - 20.0) / (1.0 + 1e-3) * 0.333, -1, 1)
    assert z[0] == -1.0 and z[1] == 1.0 and -1 < z[3] < 1
    c = np.clip(cosine.numpy(), -1 + 1e-3, 1 - 1e-3)
    rows, y = np.arange(4), labels.numpy()
    theta_m = np.clip(np.arccos(c[rows, y]) - 0.4 * z, 1e-3, np.pi - 1e-3)
    expected = cosine.numpy().copy()
    expected[rows, y] = np.cos(theta_m) - (0.4 * z + 0.4)
    np.testing.assert_allclose(logits, 64 * expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("std", [0.05, 1.0])
def test_elasticface_draws_have_the_asked_spread(std: float) -> None:
    margin = ElasticFaceMargin("cos", 0.35, std=std, seed=0).train()  # "arc" clips to [0, π)
    drawn = margin.draw(torch.zeros(4000, dtype=torch.float64))
    assert float(drawn.std()) == pytest.approx(std, rel=0.05)
    assert float(drawn.mean()) == pytest.approx(0.35, abs=4 * std / math.sqrt(4000))


PAPER_DEFAULTS = {
    NormFaceMargin: {"scale": 30.0},
    SphereFaceMargin: {
        "margin": 4,
        "scale": None,
        "lambda_base": 1000.0,
        "lambda_gamma": 0.12,
        "lambda_power": 1.0,
        "lambda_min": 5.0,
    },
    CosFaceMargin: {"margin": 0.35, "scale": 64.0, "conditional": False},
    ArcFaceMargin: {"margin": 0.5, "scale": 64.0, "policy": "linear"},
    CombinedMargin: {"m1": 1.0, "m2": 0.5, "m3": 0.0, "scale": 64.0, "policy": "linear"},
    CurricularFaceMargin: {"margin": 0.5, "scale": 64.0, "momentum": 0.99},
    AdaCosMargin: {"dynamic": True},
    MagFaceMargin: {
        "scale": 64.0,
        "lower_norm": 10.0,
        "upper_norm": 110.0,
        "lower_margin": 0.45,
        "upper_margin": 0.8,
        "regularizer_weight": 35.0,
        "policy": "easy",  # the authors' MagLinear(easy_margin=True)
    },
    AdaFaceMargin: {"margin": 0.4, "scale": 64.0, "h": 0.333, "momentum": 0.01},
    ElasticFaceMargin: {"kind": "arc", "margin": None, "scale": 64.0, "std": 0.05, "plus": False},
    # issue 25: the authors' code's defaults where it has them (docs/losses.md says which)
    MVAMSoftmaxMargin: {"margin": 0.35, "scale": 32.0, "mode": "adaptive", "t": None},
    MVArcSoftmaxMargin: {"margin": 0.35, "scale": 32.0, "mode": "adaptive", "policy": "easy"},
    LiArcFaceMargin: {"margin": 0.45, "scale": 64.0},
    CircleMargin: {"margin": 0.25, "scale": 256.0},
    ArcNegFaceMargin: {"margin": 0.5, "scale": 64.0, "alpha": 1.2, "sigma": 2.0},
}
"""The defaults docs/losses.md states (the papers' values, AM-Softmax aside): pinned here so a
changed default is a failing test, not a silent change to every named loss."""


@pytest.mark.parametrize("margin_class", list(PAPER_DEFAULTS), ids=lambda c: c.__name__)
def test_margin_defaults_are_the_documented_ones(margin_class) -> None:
    parameters = inspect.signature(margin_class).parameters
    for name, value in PAPER_DEFAULTS[margin_class].items():
        assert parameters[name].default == value, name
    assert parameters["gradient"].default == "exact"
