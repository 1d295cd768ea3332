"""Student's t distribution: its CDF and quantiles for any degrees of freedom > 0 (the interval in interval.py).

The standard library has the normal distribution only; with 3-10 repeats a side the t quantile is what keeps the
interval honest (df 2: 4.30 at 97.5 %, where the normal says 1.96). The CDF is the regularized incomplete beta
function by its continued fraction (Lentz's method, as in Numerical Recipes 6.4); the quantile is bisection on it.
"""

from __future__ import annotations

import math
from functools import lru_cache


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (converges for x < (a + 1) / (a + b + 2))."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        m2 = 2 * m
        for num in (
            m * (b - m) * x / ((qam + m2) * (a + m2)),
            -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2)),
        ):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def _regularized_beta(a: float, b: float, x: float) -> float:
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_fraction(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with df degrees of freedom."""
    tail = 0.5 * _regularized_beta(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_pdf(t: float, df: float) -> float:
    """The density of Student's t."""
    log_norm = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    return math.exp(log_norm - (df + 1) / 2 * math.log1p(t * t / df))


@lru_cache(maxsize=1024)  # the comparison asks for a few (p, df) pairs thousands of times
def t_quantile(p: float, df: float) -> float:
    """The t with P(T <= t) = p (0 < p < 1), to ~1e-10: Newton's method kept inside a shrinking bracket."""
    if not 0.0 < p < 1.0 or not df > 0:
        raise ValueError(f"t_quantile needs 0 < p < 1 and df > 0, got p={p}, df={df}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    low, high = 0.0, 1.0
    while t_cdf(high, df) < p:
        low, high = high, high * 2.0
    x = (low + high) / 2.0
    for _ in range(200):
        miss = t_cdf(x, df) - p
        if abs(miss) < 1e-13:
            break
        low, high = (x, high) if miss < 0 else (low, x)
        step = x - miss / t_pdf(x, df)
        x = step if low < step < high else (low + high) / 2.0
        if high - low < 1e-12 * max(1.0, high):
            break
    return x
