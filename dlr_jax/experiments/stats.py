"""Paired t-test over training seeds (scipy when installed, else the Student t distribution written
out through the regularised incomplete beta function), and mean ± std."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and population std (ddof=0, as `dlr_jax.eval.aggregate` reports seeds)."""
    v = np.asarray(values, np.float64)
    if v.size == 0:
        return float("nan"), float("nan")
    return float(v.mean()), float(v.std(ddof=0))


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz's method)."""
    tiny, eps = 1e-300, 1e-15
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < eps:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """Regularised incomplete beta I_x(a, b) for a, b > 0 and 0 <= x <= 1."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    # The continued fraction converges fast for x < (a + 1) / (a + b + 2); use the symmetry otherwise.
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _betacf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _betacf(b, a, 1.0 - x) / b


def t_two_sided_p(t: float, df: float) -> float:
    """P(|T| >= |t|) for Student's t with df degrees of freedom: I_{df/(df+t^2)}(df/2, 1/2)."""
    if math.isinf(t):
        return 0.0
    return betainc(df / 2.0, 0.5, df / (df + t * t))


def paired_t_test(a: Sequence[float], b: Sequence[float], *, use_scipy: bool = True) -> tuple[float, float]:
    """(t, two-sided p) of the paired t-test of a vs b (same seeds, same order). Fewer than 2 pairs,
    or pairs that all differ by 0, give p = nan (no test); pairs that all differ by the same non-zero
    amount give t = ±inf, p = 0 — scipy's answers in those cases."""
    x, y = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if x.shape != y.shape:
        raise ValueError(f"paired samples need equal lengths, got {x.size} and {y.size}")
    n = x.size
    if n < 2:
        return float("nan"), float("nan")
    d = x - y
    mean, sd = float(d.mean()), float(d.std(ddof=1))
    if sd == 0.0:
        if mean == 0.0:
            return float("nan"), float("nan")
        return math.copysign(math.inf, mean), 0.0
    if use_scipy:
        try:
            from scipy import stats
        except ImportError:
            pass
        else:
            r = stats.ttest_rel(x, y)
            return float(r.statistic), float(r.pvalue)
    t = mean / (sd / math.sqrt(n))
    return t, t_two_sided_p(t, n - 1)
