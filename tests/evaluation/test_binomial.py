"""The exact binomial (Clopper–Pearson) interval and the smallest supported rate: closed forms
at the ends, the defining tail equations restated, and SciPy's beta quantiles when present."""

from __future__ import annotations

import math

import numpy as np
import pytest

from marginface.evaluation.binomial import binomial_cdf, clopper_pearson, supported_rate


def _cdf_by_definition(k: int, n: int, p: float) -> float:
    """sum_{i=0..k} C(n, i) p^i (1 - p)^(n - i), with exact binomial coefficients."""
    return sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k + 1))


@pytest.mark.parametrize(("k", "n", "p"), [(0, 1, 0.3), (3, 10, 0.2), (7, 10, 0.9), (12, 40, 0.25)])
def test_binomial_cdf_is_the_sum_of_the_probabilities(k, n, p):
    assert binomial_cdf(k, n, p) == pytest.approx(_cdf_by_definition(k, n, p), rel=1e-12)


def test_binomial_cdf_at_the_ends():
    assert binomial_cdf(5, 5, 0.4) == 1.0
    assert binomial_cdf(0, 10, 0.0) == 1.0 and binomial_cdf(3, 10, 1.0) == 0.0
    # far in the tail of a large n: 0 accepted of a million at p = 1e-4 is e^(-100)-ish
    assert binomial_cdf(0, 1_000_000, 1e-4) == pytest.approx((1 - 1e-4) ** 1_000_000, rel=1e-9)


def test_closed_forms_at_k_0_and_k_n():
    for n in (1, 30, 300, 1_000_000):
        lower, upper = clopper_pearson(0, n)
        assert lower == 0.0 and upper == pytest.approx(1 - 0.025 ** (1 / n), rel=1e-9)
        lower, upper = clopper_pearson(n, n)
        assert upper == 1.0 and lower == pytest.approx(0.025 ** (1 / n), rel=1e-9)
    # 0 of 300 impostors: the "rule of three" upper bound, about 3.7 / n at 95 % two-sided
    assert clopper_pearson(0, 300)[1] == pytest.approx(0.01222097, rel=1e-6)


@pytest.mark.parametrize(("k", "n"), [(5, 30), (28, 160), (489, 499_500), (3, 7), (10, 10**6)])
def test_bounds_solve_the_tail_equations(k, n):
    lower, upper = clopper_pearson(k, n, confidence=0.9)
    assert lower < k / n < upper
    # P(X >= k | lower) = 0.05 and P(X <= k | upper) = 0.05
    assert 1 - binomial_cdf(k - 1, n, lower) == pytest.approx(0.05, rel=1e-7)
    assert binomial_cdf(k, n, upper) == pytest.approx(0.05, rel=1e-7)
    if n <= 200:  # the exact sum, independently
        assert 1 - _cdf_by_definition(k - 1, n, lower) == pytest.approx(0.05, rel=1e-7)
        assert _cdf_by_definition(k, n, upper) == pytest.approx(0.05, rel=1e-7)


def test_agrees_with_scipy_beta_quantiles():
    stats = pytest.importorskip("scipy.stats")
    for k, n in [(1, 1), (5, 30), (28, 160), (489, 499_500), (12, 5_000_000_000), (500, 1000)]:
        lower, upper = clopper_pearson(k, n)
        assert lower == pytest.approx(stats.beta.ppf(0.025, k, n - k + 1), rel=1e-8)
        if k < n:
            assert upper == pytest.approx(stats.beta.ppf(0.975, k + 1, n - k), rel=1e-8)


def test_a_wider_confidence_is_a_wider_interval():
    narrow, wide = clopper_pearson(5, 30, 0.8), clopper_pearson(5, 30, 0.99)
    assert wide[0] < narrow[0] and narrow[1] < wide[1]


def test_supported_rate_is_min_errors_over_n():
    assert supported_rate(300) == pytest.approx(10 / 300)
    assert supported_rate(10_000) == pytest.approx(1e-3)
    assert supported_rate(1000, min_errors=1) == pytest.approx(1e-3)
    assert supported_rate(0) == math.inf


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: clopper_pearson(3, 2), r"k must be in 0..n = 0..2, got 3"),
        (lambda: clopper_pearson(0, 0), r"n must be >= 1 \(trials\), got 0"),
        (lambda: clopper_pearson(1, 5, 1.0), r"confidence must be in \(0, 1\), got 1.0"),
        (lambda: binomial_cdf(1, 5, 1.5), r"p must be in \[0, 1\], got 1.5"),
        (lambda: supported_rate(-1), r"n must be an int >= 0, got -1"),
        (lambda: supported_rate(5, 0), r"min_errors must be an int >= 1, got 0"),
    ],
)
def test_bad_arguments_are_named(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_counts_must_be_ints():
    with pytest.raises(TypeError, match=r"k must be an int, got 1.5"):
        clopper_pearson(1.5, 10)
    assert clopper_pearson(np.int64(2), np.int64(10)) == clopper_pearson(2, 10)
