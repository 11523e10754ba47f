"""How far a measured error rate can be trusted: the exact (Clopper–Pearson) binomial interval
and the smallest rate a number of trials can measure.

A false accept rate measured as ``k`` accepted impostors out of ``n`` is a binomial proportion.
Its exact two-sided interval at confidence ``c`` (``alpha = 1 - c``) is

* lower bound ``p_lo``: the ``p`` with ``P(X >= k | n, p) = alpha / 2`` (0 when ``k = 0``),
* upper bound ``p_hi``: the ``p`` with ``P(X <= k | n, p) = alpha / 2`` (1 when ``k = n``),

``X ~ Binomial(n, p)`` (Clopper & Pearson, 1934; the same as
``scipy.stats.beta.ppf(alpha / 2, k, n - k + 1)`` and ``beta.ppf(1 - alpha / 2, k + 1, n - k)``).
Both tails are monotone in ``p``, so each bound is found by bisection; a tail is the sum of the
binomial probabilities ``C(n, i) p^i (1 - p)^(n - i)`` over its ``i``, in logarithms. Closed
forms at the ends: ``k = 0`` gives ``p_hi = 1 - (alpha / 2) ** (1 / n)``, ``k = n`` gives
``p_lo = (alpha / 2) ** (1 / n)``.

The interval assumes independent trials. Pairs drawn from one set of images are not: every
image takes part in many pairs, so the true uncertainty is larger than this interval says.

:func:`supported_rate`: with ``n`` trials, a rate ``r`` is measured from ``r · n`` expected
errors; it is taken as measurable when that is at least ``min_errors`` (default 10), i.e. the
smallest supported rate is ``min_errors / n``.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = [
    "DEFAULT_MIN_ERRORS",
    "binomial_cdf",
    "clopper_pearson",
    "rate_is_supported",
    "supported_rate",
]

DEFAULT_MIN_ERRORS = 10
"""Expected errors a measured rate needs to be reported: 10 (the rate from 10 events has a
relative uncertainty of about ±60 % at 95 %, from 1 event it spans 40×)."""


def _check_counts(k: object, n: object) -> tuple[int, int]:
    for name, value in (("k", k), ("n", n)):
        if isinstance(value, bool) or not isinstance(value, int | np.integer):
            raise TypeError(f"{name} must be an int, got {value!r}")
    k, n = int(k), int(n)  # type: ignore[arg-type]
    if n < 1:
        raise ValueError(f"n must be >= 1 (trials), got {n}")
    if not 0 <= k <= n:
        raise ValueError(f"k must be in 0..n = 0..{n}, got {k}")
    return k, n


def binomial_cdf(k: int, n: int, p: float) -> float:
    """``P(X <= k)`` for ``X ~ Binomial(n, p)``: ``sum_{i=0..k} C(n, i) p^i (1 - p)^(n - i)``.

    Summed in logarithms over the shorter side (``P(X <= k) = 1 - P(X >= k + 1)``) and only
    where the terms are not negligible (within ``40`` standard deviations of ``n p``), so
    ``n`` may be in the billions.

    Args:
        k: ``int`` in ``0..n``. n: trials, ``>= 1``. p: in ``[0, 1]``.
    """
    k, n = _check_counts(k, n)
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"p must be in [0, 1], got {p!r}")
    if p == 0.0 or k == n:
        return 1.0
    if p == 1.0:
        return 0.0
    mean, spread = n * p, 40.0 * math.sqrt(n * p * (1.0 - p)) + 40.0
    window = (max(0, math.floor(mean - spread)), min(n, math.ceil(mean + spread)))
    lower = k + 1 <= n - k  # sum the lower tail 0..k, else the upper one k+1..n
    first, last = (0, k) if lower else (k + 1, n)
    first, last = max(first, window[0]), min(last, window[1])
    if first > last:  # the whole side is negligible
        return 0.0 if lower else 1.0
    i = np.arange(first, last + 1, dtype=np.float64)
    log_choose_first = math.lgamma(n + 1) - math.lgamma(first + 1) - math.lgamma(n - first + 1)
    steps = np.log((n - i[:-1]) / (i[:-1] + 1.0))  # log C(n, i + 1) - log C(n, i)
    log_choose = log_choose_first + np.r_[0.0, np.cumsum(steps)]
    log_terms = log_choose + i * math.log(p) + (n - i) * math.log1p(-p)
    top = float(log_terms.max())
    side = math.exp(top) * float(np.exp(log_terms - top).sum())
    return min(side, 1.0) if lower else max(1.0 - side, 0.0)


def _solve_decreasing(f, target: float) -> float:
    """The ``p`` in ``[0, 1]`` with ``f(p) = target`` for ``f`` decreasing, by bisection."""
    lo, hi = 0.0, 1.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):
            break
        if f(mid) > target:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def clopper_pearson(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """The exact two-sided binomial interval of the rate ``k / n`` (module docstring).

    Args:
        k: events (accepted impostors), in ``0..n``.
        n: trials (impostor pairs), ``>= 1``.
        confidence: in ``(0, 1)``. Default: 0.95.

    Returns:
        ``(lower, upper)`` with ``0 <= lower <= k / n <= upper <= 1``.

    Raises:
        TypeError: ``k`` or ``n`` not an int. ValueError: out of range (naming the value).
    """
    k, n = _check_counts(k, n)
    if (
        isinstance(confidence, bool)
        or not isinstance(confidence, int | float)
        or not 0.0 < confidence < 1.0
    ):
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    tail = (1.0 - confidence) / 2.0
    # lower: P(X >= k) = 1 - P(X <= k - 1) reaches alpha / 2; upper: P(X <= k) falls to it
    lower = 0.0 if k == 0 else _solve_decreasing(lambda p: binomial_cdf(k - 1, n, p), 1 - tail)
    upper = 1.0 if k == n else _solve_decreasing(lambda p: binomial_cdf(k, n, p), tail)
    return lower, upper


def supported_rate(n: int, min_errors: int = DEFAULT_MIN_ERRORS) -> float:
    """The smallest rate ``n`` trials can measure: ``min_errors / n`` (at least
    ``min_errors`` expected errors; module docstring). ``inf`` when ``n == 0``.

    Raises:
        ValueError: ``n < 0`` or ``min_errors < 1``.
    """
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 0:
        raise ValueError(f"n must be an int >= 0, got {n!r}")
    if isinstance(min_errors, bool) or not isinstance(min_errors, int) or min_errors < 1:
        raise ValueError(f"min_errors must be an int >= 1, got {min_errors!r}")
    return math.inf if n == 0 else min_errors / int(n)


def rate_is_supported(rate: float, n: int, min_errors: int = DEFAULT_MIN_ERRORS) -> bool:
    """Whether ``n`` trials can measure ``rate``: ``rate · n >= min_errors``, with a little
    room for floats (``0.001 · 10000`` is supported)."""
    return rate * n >= min_errors * (1.0 - 1e-9)
