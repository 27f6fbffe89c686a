"""Fit the rational erf nncfuse inlines for float32 vectors (`codegen/llvm_math.py`).

    python benchmarks/fit_erf.py

erf(x) ~ x * P(u) / Q(u), u = x**2, Q(0) = 1, both of degree 5, on 0 < x <= 3.92
(beyond, erf(x) rounds to 1.0f). Sanathanan-Koerner iterations linearize the
rational fit (minimize |x P - erf Q| / (erf Q_previous)); Lawson re-weighting
then pushes the least-squares solution towards the minimax one. Rounding the
coefficients to float32 and evaluating in float32 dominate the error, so fits
after different numbers of iterations are compared by that error. Prints the
best coefficients (highest degree first, as float32) and their error in ULPs.
"""

from __future__ import annotations

import math

import numpy as np

DEGREE, LIMIT = 5, 3.92
erf = np.vectorize(math.erf)


def fit(iterations: int = 60) -> tuple[np.ndarray, np.ndarray]:
    x = (np.cos(np.linspace(0, np.pi, 8000)) + 1) * 0.5 * LIMIT
    x = x[x > 1e-5]
    u, y = x * x, erf(x)
    previous, weights = np.ones_like(x), np.ones_like(x)
    for _ in range(iterations):
        columns = np.hstack([x[:, None] * np.vander(u, DEGREE + 1, increasing=True),
                             -(y * u)[:, None] * np.vander(u, DEGREE, increasing=True)])
        scale = np.sqrt(weights) / (y * previous)
        solution, *_ = np.linalg.lstsq(columns * scale[:, None], y * scale, rcond=None)
        p, q = solution[: DEGREE + 1], np.concatenate([[1.0], solution[DEGREE + 1 :]])
        previous = np.polyval(q[::-1], u)
        error = np.abs(x * np.polyval(p[::-1], u) / previous - y) / y
        weights *= error / error.max() + 1e-9
        weights /= weights.mean()
    return p[::-1].astype(np.float32), q[::-1].astype(np.float32)


def float32_erf(x: np.ndarray, p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """The inline erf's arithmetic in float32 (an fma is exact in float64, then rounded)."""

    def horner(coefficients: np.ndarray, t: np.ndarray) -> np.ndarray:
        acc = np.full_like(t, coefficients[0])
        for c in coefficients[1:]:
            acc = (acc.astype(np.float64) * t + c).astype(np.float32)
        return acc

    a = np.minimum(np.abs(x), np.float32(LIMIT))
    u = a * a
    return np.copysign(np.minimum(a * horner(p, u) / horner(q, u), np.float32(1)), x)


def main() -> None:
    x = np.concatenate([np.linspace(-6, 6, 1_000_001),
                        np.geomspace(1e-30, 6, 200_000)]).astype(np.float32)
    reference = erf(x.astype(np.float64))
    ulp = np.spacing(np.abs(reference).astype(np.float32)).astype(np.float64)
    best = None
    for iterations in range(30, 91, 5):
        p, q = fit(iterations)
        error = np.abs(float32_erf(x, p, q) - reference) / ulp
        if best is None or error.max() < best[0].max():
            best = (error, p, q)
    error, p, q = best
    print("ERF_P =", tuple(float(c) for c in p))
    print("ERF_Q =", tuple(float(c) for c in q))
    print(f"max error {error.max():.2f} ULP at x = {x[error.argmax()]:.6g}")


if __name__ == "__main__":
    main()
