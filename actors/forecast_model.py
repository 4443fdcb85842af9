"""Holt's linear method with a damped trend, ETS(A,Ad,N), in plain Python.

State-space form (Hyndman et al., *Forecasting with Exponential Smoothing*, 2008):

    y_t = l_{t-1} + phi*b_{t-1} + e_t
    l_t = l_{t-1} + phi*b_{t-1} + alpha*e_t
    b_t = phi*b_{t-1} + beta*e_t            (beta = alpha * beta_star, 0 < beta_star < 1)

h-step forecast: l_n + (phi + ... + phi^h) * b_n, with variance
sigma^2 * (1 + sum_{j=1}^{h-1} (alpha + beta*(phi + ... + phi^j))^2).

Parameters are chosen by least squares on one-step errors: a coarse grid, then
a deterministic coordinate search. Pure Python keeps the forecasting role's
memory small (no numpy); daily series are short, so it is fast enough.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

MODEL_VERSION = "holt-damped-1"

PHI_MIN, PHI_MAX = 0.8, 0.98
_ALPHAS = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.99)
_BETA_STARS = (0.01, 0.05, 0.1, 0.2, 0.4, 0.7, 0.99)
_PHIS = (0.8, 0.85, 0.9, 0.95, 0.98)


@dataclass(frozen=True)
class Params:
    alpha: float
    beta_star: float
    phi: float

    @property
    def beta(self) -> float:
        return self.alpha * self.beta_star


@dataclass(frozen=True)
class Fit:
    params: Params
    level: float
    trend: float
    sigma: float
    sse: float
    n: int


@dataclass(frozen=True)
class Point:
    h: int
    y_hat: float
    y_lo: float
    y_hi: float


def initial_state(y: list[float]) -> tuple[float, float]:
    """Level: the first value; trend: the mean slope over the first few steps."""
    m = min(4, len(y) - 1)
    return y[0], (y[m] - y[0]) / m if m > 0 else 0.0


def run(y: list[float], p: Params) -> tuple[float, float, float]:
    """Filter the series; return the final level, trend and the one-step SSE."""
    level, trend = initial_state(y)
    sse = 0.0
    beta = p.beta
    for value in y[1:]:
        predicted = level + p.phi * trend
        error = value - predicted
        sse += error * error
        level = predicted + p.alpha * error
        trend = p.phi * trend + beta * error
    return level, trend, sse


def _clamp(p: Params) -> Params:
    return Params(min(0.999, max(0.001, p.alpha)), min(0.999, max(0.001, p.beta_star)),
                  min(PHI_MAX, max(PHI_MIN, p.phi)))


def fit(y: list[float]) -> Fit:
    if len(y) < 3:
        raise ValueError(f"need at least 3 observations to fit a trend, got {len(y)}")
    best_sse, best = math.inf, Params(0.5, 0.1, PHI_MAX)
    for a in _ALPHAS:
        for bs in _BETA_STARS:
            for phi in _PHIS:
                p = Params(a, bs, phi)
                sse = run(y, p)[2]
                if sse < best_sse - 1e-12:
                    best_sse, best = sse, p
    # Coordinate search around the best grid point, halving the step each round.
    steps = [0.05, 0.05, 0.02]
    for _ in range(12):
        improved = False
        for i in range(3):
            for sign in (1, -1):
                values = [best.alpha, best.beta_star, best.phi]
                values[i] += sign * steps[i]
                p = _clamp(Params(*values))
                sse = run(y, p)[2]
                if sse < best_sse - 1e-12:
                    best_sse, best, improved = sse, p, True
        if not improved:
            steps = [s / 2 for s in steps]
    level, trend, sse = run(y, best)
    dof = max(1, len(y) - 1 - 3)
    return Fit(best, level, trend, math.sqrt(sse / dof), sse, len(y))


def forecast(f: Fit, horizon: int, level: float = 0.95, floor: float | None = 0.0) -> list[Point]:
    """Point forecasts and prediction intervals for h = 1..horizon. Prices are
    never negative, so the interval is cut at ``floor``."""
    z = NormalDist().inv_cdf(0.5 + level / 2)
    p = f.params
    out = []
    damp = 0.0  # phi + ... + phi^h
    var_sum = 0.0  # sum_{j=1}^{h-1} c_j^2
    for h in range(1, horizon + 1):
        if h > 1:
            # c_{h-1} = alpha + beta * (phi + ... + phi^(h-1)); damp still holds the sum to h-1.
            var_sum += (p.alpha + p.beta * damp) ** 2
        damp += p.phi ** h
        y_hat = f.level + damp * f.trend
        half = z * f.sigma * math.sqrt(1.0 + var_sum)
        lo, hi = y_hat - half, y_hat + half
        if floor is not None:
            y_hat, lo, hi = max(floor, y_hat), max(floor, lo), max(floor, hi)
        out.append(Point(h, y_hat, lo, hi))
    return out


def fill_gaps(points: list[tuple[int, float]]) -> list[float]:
    """Daily values from (day number, value) pairs, missing days interpolated linearly."""
    if not points:
        return []
    points = sorted(points)
    out = [points[0][1]]
    for (d0, v0), (d1, v1) in zip(points, points[1:], strict=False):
        for d in range(d0 + 1, d1 + 1):
            out.append(v0 + (v1 - v0) * (d - d0) / (d1 - d0))
    return out
