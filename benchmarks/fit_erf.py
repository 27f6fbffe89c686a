"""Fit the erf nncfuse inlines for float32 vectors (`codegen/llvm_math.py`).

    python benchmarks/fit_erf.py

Three pieces:

- |x| < 1: erf(x) = x * P(x**2), P of degree 5, fitted for relative error;
- 1 <= |x| < 2: erf(x) = 1 - Q(|x| - 1.5), Q of degree 10 fitted to erfc(x) for
  absolute error (fitting erf itself, the float32 rounding of its constant term
  alone costs half an ULP);
- 2 <= |x| <= 3.93: erf(x) = 1 - R(|x| - 2.96), R of degree 11 fitted to erfc(x)
  for absolute error. Near +-1, where chains like acos(erf(x)) or gelu's negative
  tail magnify every ULP, this rounds within 0.53 ULP. Beyond 3.92 erf(x) rounds
  to 1.0f.

The inline erf evaluates the first for every lane, and the last two as one
polynomial whose coefficients each lane selects (Q's padded with zeros).

Weighted least squares on Chebyshev nodes with Lawson re-weighting (towards
minimax). Prints the coefficients (highest degree first, as float32) and the
error, in ULPs, of evaluating them in float32 with fused multiply-adds.
"""

from __future__ import annotations

import math

import numpy as np

SMALL_DEGREE, MIDDLE_DEGREE, LARGE_DEGREE = 5, 10, 11
ONE, MIDDLE_CENTER, TWO, CENTER, LIMIT = 1.0, 1.5, 2.0, 2.96, 3.93
erf, erfc = np.vectorize(math.erf), np.vectorize(math.erfc)


def chebyshev(lo: float, hi: float, n: int = 6000) -> np.ndarray:
    return lo + (np.cos(np.linspace(0, np.pi, n)) + 1) * 0.5 * (hi - lo)


def lawson(columns: np.ndarray, y: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """Coefficients minimizing max |columns @ c - y| * scale, approximately."""
    weights = np.ones_like(y)
    for _ in range(200):
        w = np.sqrt(weights) * scale
        c, *_ = np.linalg.lstsq(columns * w[:, None], y * w, rcond=None)
        error = np.abs(columns @ c - y) * scale
        weights *= error / error.max() + 1e-12
        weights /= weights.sum()
    return c[::-1].astype(np.float32)


Pieces = tuple[np.ndarray, np.ndarray, np.ndarray]


def fit() -> Pieces:
    x = chebyshev(1e-6, ONE)
    y = erf(x) / x
    small = lawson(np.vander(x * x, SMALL_DEGREE + 1, increasing=True), y, 1 / y)
    x = chebyshev(ONE, TWO)
    middle = lawson(np.vander(x - MIDDLE_CENTER, MIDDLE_DEGREE + 1, increasing=True),
                    erfc(x), np.ones_like(x))
    x = chebyshev(TWO, LIMIT)
    large = lawson(np.vander(x - CENTER, LARGE_DEGREE + 1, increasing=True),
                   erfc(x), np.ones_like(x))
    return small, middle, large


def float32_erf(x: np.ndarray, pieces: Pieces) -> np.ndarray:
    """The inline erf's arithmetic in float32 (an fma is exact in float64, then rounded)."""
    small, middle, large = pieces

    def fma(p: np.ndarray, q: np.ndarray, r: np.ndarray) -> np.ndarray:
        return (p.astype(np.float64) * q + r).astype(np.float32)

    def horner(coefficients: np.ndarray, t: np.ndarray) -> np.ndarray:
        acc = np.full_like(t, coefficients[0])
        for c in coefficients[1:]:
            acc = fma(acc, t, np.float32(c))
        return acc

    a = np.abs(x)
    near_zero = a * horner(small, a * a)
    between = np.float32(1) - horner(middle, a - np.float32(MIDDLE_CENTER))
    clamped = np.minimum(a, np.float32(LIMIT))
    near_one = np.float32(1) - horner(large, clamped - np.float32(CENTER))
    magnitude = np.where(a < ONE, near_zero, np.where(a < TWO, between, near_one))
    return np.copysign(magnitude, x)


def main() -> None:
    pieces = fit()
    x = np.concatenate([np.linspace(-6, 6, 2_000_001),
                        np.geomspace(1e-30, 6, 500_000)]).astype(np.float32)
    reference = erf(x.astype(np.float64))
    ulp = np.spacing(np.abs(reference).astype(np.float32)).astype(np.float64)
    error = np.abs(float32_erf(x, pieces) - reference) / ulp
    for name, coefficients in zip(("ERF_SMALL", "ERF_MIDDLE", "ERF_LARGE"), pieces):
        print(name, "=", tuple(float(c) for c in coefficients))
    for lo, hi in [(0, ONE), (ONE, TWO), (TWO, 3), (3, 6)]:
        part = (np.abs(x) >= lo) & (np.abs(x) < hi)
        print(f"max error for {lo} <= |x| < {hi}: {error[part].max():.2f} ULP")


if __name__ == "__main__":
    main()
